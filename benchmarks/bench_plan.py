"""The planner on the Mooncake trace: the size search (smallest pool reaching 90 % of the infinite-capacity rate)
against the answer a grid of swept capacities gives, with the replays each costs; and the host tier at one pool.

    .venv/bin/python benchmarks/bench_plan.py [--trace PATH] [--policies lru,fifo] [--workers 2]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lab.host_tier import replay_with_host      # noqa: E402
from core.lab.size import size                       # noqa: E402
from core.lab.sweep import run_sweep                 # noqa: E402
from core.lab.traces import load_mooncake            # noqa: E402
from core.lab.units import fmt_capacity, load_model_config   # noqa: E402

TRACE = ROOT / "data" / "mooncake" / "synthetic_trace.jsonl.gz"   # shipped with the project
GRID = [1000, 2000, 4000, 6000, 12000, 24000, 36000]       # blocks, as a planner would sweep them


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--policies", default="lru,fifo")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--host-blocks", type=int, default=24000)
    ap.add_argument("--device-blocks", type=int, default=6000)
    args = ap.parse_args()
    pols = args.policies.split(",")
    kv = load_model_config("llama-3.1-8b")
    w = load_mooncake(args.trace)
    t0 = time.perf_counter()
    answers = size(w, pols, 0.9, 512, workers=args.workers)
    t_size = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = run_sweep(w, [b * 512 for b in GRID], pols, 512, workers=args.workers)
    t_grid = time.perf_counter() - t0
    reach = grid.capacity_to_reach(0.9)
    print(f"{w.name}: {len(w):,} requests; infinite-capacity hit rate {grid.infinite_hit_rate:.4f}")
    print(f"{'policy':>8} | {'search: blocks':>14} {'replays':>7} | {'grid: blocks':>12} {'points':>6} | grid / search")
    for a in answers:
        g = reach.get(a.name)
        ratio = "-" if g is None or a.capacity_pages is None else f"{g / 512 / a.capacity_pages:.2f}"
        print(f"{a.name:>8} | {a.capacity_pages or 0:>14,} {len(a.probes):>7} | "
              f"{(g or 0) // 512:>12,} {len(GRID):>6} | {ratio}   monotone={a.monotone}")
        print(f"{'':>8}   {fmt_capacity(a.capacity_tokens, 512, kv)}")
    print(f"search {t_size:.1f} s, grid sweep {t_grid:.1f} s (workers {args.workers})")
    print(f"\nhost tier: device {args.device_blocks:,} blocks + host {args.host_blocks:,} blocks, lru")
    for wp in ("write_through", "write_through_selective", "write_back"):
        t0 = time.perf_counter()
        r = replay_with_host(w, args.device_blocks * 512, args.host_blocks * 512, "lru", 512, write_policy=wp)
        s, t = r.summary(), r.ttft(kv)
        print(f"  {wp:>23}: device {s['device_hit_rate']:.4f} + host {s['host_hit_rate']:.4f} = {s['hit_rate']:.4f};"
              f" TTFT p50 {t['ttft_p50_device_only']:.3f} -> {t['ttft_p50_with_host']:.3f} s, p99 "
              f"{t['ttft_p99_device_only']:.3f} -> {t['ttft_p99_with_host']:.3f} s; prefill saved "
              f"{t['prefill_seconds_saved']:,.0f} s ({time.perf_counter() - t0:.1f} s)")
    opt = [b for b in grid.optimal if b.capacity_pages == GRID[-1]]
    print(f"  optimum at {GRID[-1]:,} blocks (>= device + host would need {args.device_blocks + args.host_blocks:,}):"
          f" {opt[0].hit_rate:.4f}" if opt else "")


if __name__ == "__main__":
    main()
