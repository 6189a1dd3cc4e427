"""`python -m core "prompt"`: one completion through the engine, with its cache statistics."""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from core.engine.config import add_flags, from_args

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see python -m core --help)\n")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m core", description=__doc__.split(":", 1)[1].strip())
    ap.add_argument("prompt", nargs="+", help="prompt text; several prompts share one engine (and its cache)")
    ap.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    ap.add_argument("--system", default=None, help="system message for --chat")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed")
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    ap.add_argument("--priority", type=int, default=0,
                    help="request priority: with --eviction-policy priority, higher is evicted later (default 0)")
    add_flags(ap)                   # --model, --pool-slots, --eviction-policy, ... (core/engine/config.py)
    ap.add_argument("--all-at-once", action="store_true",
                    help="submit every prompt before the first step (default: one per scheduler step, as "
                         "requests arrive in the article, so later prompts can hit what earlier ones cached)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams

    handles: list = []
    engine = None
    try:
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
                                priority=args.priority)
        params.validate()            # before the model loads: a bad flag costs nothing
        config = from_args(args)
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        engine = Engine(config.model, config)
        prompts = args.prompt
        if args.chat:
            sys_msg = [{"role": "system", "content": args.system}] if args.system else []
            prompts = [sys_msg + [{"role": "user", "content": p}] for p in prompts]
        for p in prompts:            # all validated before the first runs: a bad one queues nothing
            engine.tokenize(p)
        _run(engine, prompts, params, handles, args.all_at_once)
    except KeyboardInterrupt:
        for h in handles:
            engine.abort(h.rid)
        if len(handles) == 1 and len(args.prompt) == 1:
            print(flush=True)        # its text was streamed as it came
        else:
            for h in handles:
                print(h.partial_text())
        print(f"interrupted: printed the text generated so far ({sum(len(h.partial_text()) for h in handles)} "
              f"characters)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:          # `python -m core ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the exit's flush must not raise it again
        return 0
    except (ValueError, OSError, RuntimeError) as exc:
        # one line, all of it: a tokenizer's load error says on its later lines which files it looked for
        print(f"error: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for h in handles:
        c = h.result(0)
        if c.error:
            print(f"error: request {c.rid} failed: {c.error}", file=sys.stderr)
        print(f"[{c.rid}] prompt {c.prompt_tokens} tokens, cached {c.cached_tokens}, new {len(c.token_ids)}, "
              f"finish {c.finish_reason}, ttft {c.ttft or 0:.3f} s, total {c.total_time:.3f} s", file=sys.stderr)
    m = engine.snapshot().metrics
    print(f"cache: hit rate {m['hit_rate']:.1%}, prefill computed {m['prefill_tokens_computed']}, "
          f"skipped {m['prefill_tokens_skipped']}, evicted {m['evicted_tokens']}, "
          f"pool {m['num_slots'] - m['free_slots']}/{m['num_slots']} slots used", file=sys.stderr)
    return 1 if any(h.result(0).error for h in handles) else 0


def _run(engine, prompts: list, params, handles: list, all_at_once: bool) -> None:
    """Drive the engine in this thread (so Ctrl-C lands here); one prompt streams to stdout live."""
    pending = list(prompts)
    while pending and all_at_once:
        handles.append(engine.submit(pending.pop(0), params))
    live = len(prompts) == 1
    while pending or not all(h.done() for h in handles):
        if pending:
            handles.append(engine.submit(pending.pop(0), params))
        engine.step()
        if live:
            _flush_stream(handles[0])
    if not live:       # several answers: each under its request's id, as the stats lines on stderr name them
        for h in handles:
            print(f"[{h.rid}] {h.result(0).text}")
    else:
        print(flush=True)


def _flush_stream(handle) -> None:
    text = handle.stream_available()
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
