"""Why a serving process keeps one OpenMP thread pool (core/engine/omp_threads.py): decode step time on
the default model when the engine steps (a) on the thread that loaded the model, (b) on a second thread
while the loading thread keeps its own pool (what the server did: main thread loads, loop thread runs),
(c) on a second thread after `omp_threads.reserve()` (what the server does now). Each case runs in a fresh
process (thread pools are per process), interleaved, fastest median of --rounds; prints the ratios.

    .venv/bin/python benchmarks/bench_threads.py --threads 2
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = {"a": "engine steps on the loading thread",
         "b": "engine on a second thread, loading thread keeps its pool",
         "c": "engine on a second thread after omp_threads.reserve()"}


def one(case: str, threads: int, tokens: int) -> float:
    """Median decode step (ms) of one case, in this process."""
    import torch
    torch.set_num_threads(threads)
    from core.engine import omp_threads
    if case == "c":
        omp_threads.reserve(threads)
    from core.engine.engine import Engine
    from core.engine.model.runner import ModelRunner
    from core.engine.sampling import SamplingParams
    engine = Engine(ModelRunner("default", device="cpu"), pool_slots=4096)
    steps: list[float] = []

    def run() -> None:
        if case != "a":
            torch.set_num_threads(omp_threads.loop_threads() or threads)
        engine.submit(list(range(1000, 1128)), SamplingParams(max_new_tokens=tokens, ignore_eos=True))
        while engine.has_work():
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)

    if case == "a":
        run()
    else:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    return statistics.median(steps[2:]) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48, help="decode steps per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)   # one case, in a child process
    args = ap.parse_args()
    if args.case:
        print(json.dumps(one(args.case, args.threads, args.tokens)))
        return
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for case in CASES:
            out = subprocess.run([sys.executable, __file__, "--case", case, "--threads", str(args.threads),
                                  "--tokens", str(args.tokens)], capture_output=True, text=True, cwd=ROOT, check=True)
            ms = json.loads(out.stdout.strip().splitlines()[-1])
            best[case] = min(best.get(case, ms), ms)
    print(f"decode step, default model, {args.threads} threads, median of {args.tokens} steps, best of {args.rounds}:")
    for case, label in CASES.items():
        print(f"  ({case}) {label}: {best[case]:.1f} ms ({best[case] / best['a']:.2f}x (a))")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
