"""Capacity lab speed on the Mooncake synthetic trace (3,993 requests, 61M prompt tokens, page 512).

Targets (issue 5): one (capacity, policy) point over the whole trace < 10 s on one core; a sweep of
6 capacities x 4 policies < 60 s on 2 cores; the optimum < 30 s. Prints wall and CPU seconds (CPU
time is what the machine's other load cannot inflate) and the figures of the sweep.

    .venv/bin/python benchmarks/bench_lab.py [--workers 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lab.optimal import Bounds                      # noqa: E402
from core.lab.replay import replay                       # noqa: E402
from core.lab.sweep import OPTIMAL, run_sweep            # noqa: E402
from core.lab.traces import load_mooncake                # noqa: E402

TRACE = ROOT / "data" / "mooncake" / "synthetic_trace.jsonl.gz"   # shipped with the project
PAGE = 512
CAPACITIES_PAGES = [1000, 2000, 4000, 6000, 12000, 24000]
POLICIES = ["lru", "lfu", "fifo", "slru"]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def verdict(seconds: float, target: float) -> str:
    return "ok" if seconds < target else "OVER"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="also save results.csv / results.json of the sweep here")
    args = ap.parse_args()

    workload, w_load, _ = timed(lambda: load_mooncake(args.trace))
    print(f"trace: {len(workload):,} requests, {workload.prompt_tokens:,} prompt tokens (read in {w_load:.2f} s)\n")

    point, w_point, c_point = timed(lambda: replay(workload, 6000 * PAGE, "lru", page_size=PAGE))
    bounds, w_inf, c_inf = timed(lambda: Bounds(workload, PAGE))
    inf = bounds.infinite().hit_rate
    print(f"one point (lru, 6000 blocks = {6000 * PAGE:,} tokens): hit rate {point.hit_rate:.4f} "
          f"= {point.hit_rate / inf:.1%} of the infinite-capacity {inf:.4f}")
    print(f"  wall {w_point:.2f} s, cpu {c_point:.2f} s   [target < 10 s: {verdict(w_point, 10)}]")

    opts, w_opt, c_opt = timed(lambda: [bounds.optimal(c * PAGE) for c in CAPACITIES_PAGES])
    print(f"optimum at {len(CAPACITIES_PAGES)} capacities + infinite (page trace {w_inf:.2f} s): "
          f"wall {w_opt + w_inf:.2f} s, cpu {c_opt + c_inf:.2f} s   [target < 30 s: {verdict(w_opt + w_inf, 30)}]")

    caps = [c * PAGE for c in CAPACITIES_PAGES]
    before = children_cpu()
    res, w_sweep, c_self = timed(lambda: run_sweep(workload, caps, POLICIES, PAGE, workers=args.workers,
                                                   with_optimal=False))
    c_sweep = c_self + children_cpu() - before
    print(f"sweep {len(caps)} capacities x {len(POLICIES)} policies on {args.workers} workers: wall {w_sweep:.1f} s, "
          f"cpu {c_sweep:.1f} s (all processes)   [target < 60 s: {verdict(w_sweep, 60)}]\n")

    res.optimal = sorted(opts, key=lambda b: b.capacity_tokens)
    df = res.table()
    pivot = df.pivot(index="capacity_pages", columns="policy", values="hit_rate")[POLICIES + [OPTIMAL]]
    pivot["infinite"] = inf
    print("hit rate (hit prompt tokens / prompt tokens) by capacity in 512-token blocks:")
    print(pivot.to_string(float_format="%.4f"))
    print("\nsmallest swept capacity reaching 90% of the infinite-capacity rate:")
    for name, cap in res.capacity_to_reach(0.9).items():
        print(f"  {name:>8}: {'not reached' if cap is None else f'{cap // PAGE:,} blocks'}")
    if args.out:
        print("wrote", ", ".join(map(str, res.save(args.out).values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
