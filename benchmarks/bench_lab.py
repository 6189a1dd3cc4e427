"""Capacity lab speed on the Mooncake synthetic trace (3,993 requests, 61M prompt tokens, page 512), the
page-level replay (one tree slot per 512-token page) side by side with the token-level one (each block
expanded to 512 token ids, the engine's RadixCache keyed by token), in one run.

Targets (issue 12, item 4): one LRU point at 6,000 blocks < 0.5 s (the token level took 2.2 s); the
6 capacities x 4 policies sweep < 10 s on 2 workers (21 s); hit rates equal to the last digit (the script
fails otherwise). Prints wall and CPU seconds (CPU time is what the machine's other load cannot inflate).

    .venv/bin/python benchmarks/bench_lab.py [--workers 2] [--rounds 3] [--out DIR] [--skip-token-sweep]
"""
from __future__ import annotations

import argparse
import os
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
from core.cache.allocator import SlotAllocator# noqa: E402

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


def sweep(workload, level: str, workers: int):
    before = children_cpu()
    res, wall, c_self = timed(lambda: run_sweep(workload, [c * PAGE for c in CAPACITIES_PAGES], POLICIES, PAGE,
                                                workers=workers, with_optimal=False, level=level))
    return res, wall, c_self + children_cpu() - before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="single-point rounds per level (alternating)")
    ap.add_argument("--skip-token-sweep", action="store_true", help="skip the slow token-level sweep")
    ap.add_argument("--out", help="also save results.csv / results.json of the sweep here")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")

    workload, w_load, _ = timed(lambda: load_mooncake(args.trace))
    print(f"trace: {len(workload):,} requests, {workload.prompt_tokens:,} prompt tokens (read in {w_load:.2f} s)\n")
    SlotAllocator(PAGE, page_size=PAGE)      # loads the compiled free() kernel before any clock starts

    cap = 6000 * PAGE
    best = {}
    for k in range(args.rounds):             # alternate the order, so a slow spell of the machine hits both
        for level in (("token", "page") if k % 2 == 0 else ("page", "token")):
            r, w, c = timed(lambda: replay(workload, cap, "lru", page_size=PAGE, level=level))
            prev = best.get(level)
            best[level] = (r, min(w, prev[1]) if prev else w, min(c, prev[2]) if prev else c)
    (rt, wt, ct), (rp, wp, cp) = best["token"], best["page"]
    assert (rt.hit_tokens, rt.evictions, rt.evicted_tokens) == (rp.hit_tokens, rp.evictions, rp.evicted_tokens)
    bounds, w_inf, c_inf = timed(lambda: Bounds(workload, PAGE))
    inf = bounds.infinite().hit_rate
    print(f"one point (lru, 6000 blocks = {cap:,} tokens), fastest of {args.rounds} rounds: hit rate "
          f"{rp.hit_rate:.4f} = {rp.hit_rate / inf:.1%} of the infinite-capacity {inf:.4f} (both levels)")
    print(f"  token level: wall {wt:.2f} s, cpu {ct:.2f} s")
    print(f"  page level:  wall {wp:.2f} s, cpu {cp:.2f} s (page ids derived inside)   "
          f"[target < 0.5 s: wall {verdict(wp, 0.5)}, cpu {verdict(cp, 0.5)}]   speed-up {wt / wp:.1f}x wall, "
          f"{ct / cp:.1f}x cpu")
    _, wtr, ctr = timed(lambda: replay(workload, cap, "lru", page_size=PAGE, trace=bounds.trace))
    print(f"  page level, page ids from the sweep's page trace: wall {wtr:.2f} s, cpu {ctr:.2f} s")

    opts, w_opt, c_opt = timed(lambda: [bounds.optimal(c * PAGE) for c in CAPACITIES_PAGES])
    print(f"optimum at {len(CAPACITIES_PAGES)} capacities + infinite (page trace {w_inf:.2f} s): "
          f"wall {w_opt + w_inf:.2f} s, cpu {c_opt + c_inf:.2f} s")

    res, w_sw, c_sw = sweep(workload, "page", args.workers)
    print(f"sweep {len(CAPACITIES_PAGES)} capacities x {len(POLICIES)} policies on {args.workers} workers, page level: "
          f"wall {w_sw:.1f} s, cpu {c_sw:.1f} s (all processes)   [target < 10 s: {verdict(w_sw, 10)}]")
    if not args.skip_token_sweep:
        tok, w_tk, c_tk = sweep(workload, "token", args.workers)
        print(f"sweep, token level: wall {w_tk:.1f} s, cpu {c_tk:.1f} s   speed-up {w_tk / w_sw:.1f}x wall, "
              f"{c_tk / c_sw:.1f}x cpu")
        key = lambda p: (p.policy, p.capacity_tokens, p.hit_tokens, p.evictions, p.evicted_tokens, p.rejected)  # noqa: E731
        assert [key(p) for p in tok.points] == [key(p) for p in res.points], "page and token levels differ"
        print(f"  all {len(res.points)} points equal at both levels (hit, evicted tokens, evictions, rejections)")
    print()
    res.optimal = sorted(opts, key=lambda b: b.capacity_tokens)
    df = res.table()
    pivot = df.pivot(index="capacity_pages", columns="policy", values="hit_rate")[POLICIES + [OPTIMAL]]
    pivot["infinite"] = inf
    print("hit rate (hit prompt tokens / prompt tokens) by capacity in 512-token blocks:")
    print(pivot.to_string(float_format="%.4f"))
    print("\nsmallest swept capacity reaching 90% of the infinite-capacity rate:")
    for name, c in res.capacity_to_reach(0.9).items():
        print(f"  {name:>8}: {'not reached' if c is None else f'{c // PAGE:,} blocks'}")
    if args.out:
        print("wrote", ", ".join(map(str, res.save(args.out).values())))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
