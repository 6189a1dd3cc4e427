"""Mixed steps deep into a long prompt: where a step's time goes while one stream decodes and a long uncached
prompt is prefilled beside it in the fairness cap's small chunks (step_budget.py), in-process (`Engine.step`).

Per 1,000 tokens of prefill depth: steps, prefill tokens a step, the step's wall time, the model's forward, and the
rest (scheduler, radix tree, sampling); then the stream's gaps (p50 / p99) while the prompt was prefilled and the
prompt's time to its first token. Run twice, side by side in one process: the tree taking the chunk's tokens every
chunk (`scheduler.INSERT_GROWTH = 0`, SGLang's cache_unfinished_req: a node per 2-token chunk) and once they are
1/64 of what it holds of the prompt (the default). benchmarks/README.md, "Mixed steps", records a run.

    .venv/bin/python benchmarks/bench_mixed_steps.py --threads 2
"""
from __future__ import annotations

import argparse
import pathlib
import random
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(runner, prompt: list[int], stream_prompt: list[int], stream_tokens: int) -> None:
    from benchmarks.engine_fairness import percentile
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams
    forward = [0.0]
    model_forward = runner.forward

    def timed(batch, pool):
        t = time.perf_counter()
        try:
            return model_forward(batch, pool)
        finally:
            forward[0] += time.perf_counter() - t
    runner.forward = timed
    try:
        engine = Engine(runner, pool_slots=len(prompt) + stream_tokens + len(stream_prompt) + 256)
        stream = engine.submit(stream_prompt, SamplingParams(max_new_tokens=stream_tokens, ignore_eos=True))
        for _ in range(16):                                   # the stream decodes on its own first
            engine.step()
        long = engine.submit(prompt, SamplingParams(max_new_tokens=2, ignore_eos=True))
        start = last_t = time.perf_counter()
        seen, gaps, buckets = len(stream.partial_ids()), [], {}
        while not long.partial_ids() and not stream.done():
            before = engine.metrics.prefill_computed
            forward[0] = 0.0
            t = time.perf_counter()
            engine.step()
            now = time.perf_counter()
            if len(stream.partial_ids()) > seen:
                gaps.append(now - last_t)
                last_t, seen = now, len(stream.partial_ids())
            b = buckets.setdefault(before // 1000, [0, 0, 0.0, 0.0])
            b[0] += 1
            b[1] += engine.metrics.prefill_computed - before
            b[2] += now - t
            b[3] += forward[0]
        ttft = time.perf_counter() - start if long.partial_ids() else None
    finally:
        runner.forward = model_forward
    for depth, (steps, tokens, wall, fwd) in sorted(buckets.items()):
        print(f"  depth {depth * 1000:5d}+: {steps:4d} steps, {tokens / steps:5.1f} tokens a step, step "
              f"{wall / steps * 1e3:5.1f} ms, forward {fwd / steps * 1e3:5.1f} ms, rest {(wall - fwd) / steps * 1e3:4.1f} ms")
    first = f"{ttft:.1f} s" if ttft is not None else "not reached before the stream ended"
    print(f"  stream gaps p50 {statistics.median(gaps) * 1e3:.1f} ms, p99 {percentile(gaps, 99) * 1e3:.1f} ms ({len(gaps)}); "
          f"the prompt's first token: {first}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=4000, help="tokens of the long uncached prompt")
    ap.add_argument("--stream-tokens", type=int, default=1200, help="tokens the decoding stream generates")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    torch.set_num_threads(args.threads)
    from core.engine import scheduler
    from core.engine.model.runner import ModelRunner
    runner = ModelRunner("default")
    rng = random.Random(0)
    print(f"one stream ({args.stream_tokens} tokens) + a {args.prompt:,}-token uncached prompt, engine "
          f"{runner.impl} {runner.numerics}, {args.threads} threads")
    default = scheduler.INSERT_GROWTH
    try:
        for growth, name in ((0, "a node per chunk (INSERT_GROWTH 0)"), (default, f"INSERT_GROWTH {default}")):
            scheduler.INSERT_GROWTH = growth
            print(f"\n{name}:")
            run(runner, [rng.randrange(100, 40000) for _ in range(args.prompt)],
                [rng.randrange(100, 40000) for _ in range(128)], args.stream_tokens)
    finally:
        scheduler.INSERT_GROWTH = default


if __name__ == "__main__":
    main()
