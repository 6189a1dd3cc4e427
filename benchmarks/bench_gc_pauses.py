"""Full garbage collections while the engine serves: how often they run and how long each stalls every stream,
with the heap as loaded and with it frozen as the server freezes it (core/server/model_store.settle_heap), side
by side in one process: first the phase as loaded, then gc.freeze() and the same phase again.

A full (generation 2) collection walks every tracked object: with the default model loaded that is the model,
transformers and the libraries, ~400k objects. The engine generates batches of greedy requests (random prompts of
20-400 tokens, 64 new tokens each) for --seconds per phase and prints each phase's tokens, its full collections
and their durations, and what one forced full collection costs.

    .venv/bin/python benchmarks/bench_gc_pauses.py --threads 2 [--seconds 60]
"""
from __future__ import annotations

import argparse
import gc
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from core.engine.engine import Engine  # noqa: E402
from core.engine.model.runner import ModelRunner  # noqa: E402
from core.engine.sampling import SamplingParams  # noqa: E402


def full_collections(runner: ModelRunner, seconds: float, seed: int) -> tuple[int, list[float]]:
    """(tokens generated, durations in ms of the full collections that ran) over `seconds` of serving."""
    pauses, started = [], {}

    def watch(phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started["t"] = time.perf_counter()
            else:
                pauses.append((time.perf_counter() - started["t"]) * 1e3)

    gc.callbacks.append(watch)
    try:
        engine = Engine(runner, pool_slots=16384)
        g = torch.Generator().manual_seed(seed)
        tokens, t0 = 0, time.time()
        while time.time() - t0 < seconds:
            prompts = [torch.randint(100, 40000, (int(torch.randint(20, 400, (1,), generator=g)),),
                                     generator=g).tolist() for _ in range(4)]
            done = engine.generate(prompts, SamplingParams(max_new_tokens=64, ignore_eos=True))
            tokens += sum(len(c.token_ids) for c in done)
        return tokens, pauses
    finally:
        gc.callbacks.remove(watch)


def forced_ms() -> float:
    t0 = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60.0, help="serving time per phase")
    ap.add_argument("--model", default="default")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runner = ModelRunner(args.model)
    print(f"{args.model}: {len(gc.get_objects())} objects tracked after loading")
    for phase in ("as loaded", "frozen"):   # as loaded: no collection forced first (the server forces none)
        if phase == "frozen":
            print(f"a forced full collection: {forced_ms():.0f} ms")
            gc.freeze()
            print(f"gc.freeze(): {gc.get_freeze_count()} objects frozen; a forced full collection now "
                  f"{forced_ms():.1f} ms")
        tokens, pauses = full_collections(runner, args.seconds, seed=1)
        print(f"{phase:>10}: {tokens} tokens in {args.seconds:.0f} s, {len(pauses)} full collections"
              + (f" ({', '.join(f'{p:.0f}' for p in pauses)} ms)" if pauses else ""))
    gc.unfreeze()


if __name__ == "__main__":
    main()
