"""`lrb` and `lrb_arc` (core/eviction_learned.py) against LRU, ARC and the offline optimum, as gap closed.

The harness is benchmarks/bench_eviction.py's (same tables, same lab replays); this script only adds
them to its "new policies" and runs every part for the policies given:

    .venv/bin/python benchmarks/bench_eviction_learned.py --trace data/mooncake/synthetic_trace.jsonl.gz \
        --halves --generated
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_eviction as be  # noqa: E402

LEARNED = ["lrb", "lrb_arc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="Mooncake JSONL trace")
    ap.add_argument("--capacities", default="1000,2000,4000,6000,12000", help="blocks of 512 tokens")
    ap.add_argument("--policies", default="lru,arc,lrb")
    ap.add_argument("--halves", action="store_true", help="also: first vs second half of the trace at 6,000")
    ap.add_argument("--generated", action="store_true", help="also: the four generated workloads")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    pols = [p.strip() for p in a.policies.split(",") if p.strip()]
    if "lru" not in pols:
        pols.insert(0, "lru")
    be.NEW[:] = [p for p in be.NEW if p not in LEARNED] + LEARNED
    if a.trace:
        be.run_trace(a.trace, [int(c) for c in a.capacities.split(",")], pols, a.workers)
        if a.halves:
            be.run_halves(a.trace, 6000, pols, a.workers)
    if a.generated:
        be.run_generated(pols, a.workers, a.page_size)


if __name__ == "__main__":
    main()
