"""`python -m core.lab route`: hit rate vs replicas x routing policy, next to one cache's optimum.

Every row routes the workload over N replicas of `--capacity` each (see core/lab/routing.py),
replays each replica's share through the real RadixCache, and reports the total and
per-replica hit rates and how evenly the prompt tokens spread. The reference rows are one
cache holding all N replicas' capacity: its `--policy` replay and its offline optimum, the best
any routing and eviction could do with that much memory in one place.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from core.cache.eviction.registry import POLICIES


def _ints(text: str, name: str) -> list[int]:
    try:
        vals = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"{name} takes comma-separated integers, got {text!r}") from None
    if not vals or vals[0] < 1:
        raise ValueError(f"{name} needs integers >= 1, got {text!r}")
    return vals


def add_route_parser(sub: Any, add_source) -> None:
    """Register the `route` subcommand; `add_source(parser)` adds the shared --trace/--workload flags."""
    from core.lab.routing import ROUTING_POLICIES, RouterConfig
    d = RouterConfig()
    rp = sub.add_parser("route", help="hit rate vs replicas x routing policy (a model of sglang-router)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_source(rp)
    rp.add_argument("--capacity", required=True, help="KV capacity of EACH replica: tokens (200000, 200k) or pages (400p)")
    rp.add_argument("--replicas", default="1,2,4", help="comma-separated replica counts")
    rp.add_argument("--routing", default="round_robin,cache_aware",
                    help=f"comma-separated routing policies, or 'all': {', '.join(ROUTING_POLICIES)}")
    rp.add_argument("--policy", default="lru", choices=list(POLICIES), help="eviction policy inside each replica")
    rp.add_argument("--page-size", type=int, default=None,
                    help="tokens per page; default: the block size of a block trace (512 for Mooncake), else 1")
    rp.add_argument("--cache-threshold", type=float, default=d.cache_threshold, help="cache_aware: match ratio to follow")
    rp.add_argument("--balance-abs-threshold", type=int, default=d.balance_abs_threshold,
                    help="cache_aware: load difference (requests in flight) that switches to least-loaded")
    rp.add_argument("--balance-rel-threshold", type=float, default=d.balance_rel_threshold,
                    help="cache_aware: load ratio that also must be exceeded")
    rp.add_argument("--prefix-tokens", type=int, default=d.prefix_tokens, help="prefix_hash: tokens hashed")
    rp.add_argument("--concurrency", type=int,
                    help="loads of a closed-loop client with this many workers (the c-1 requests before each are in flight)")
    rp.add_argument("--overlap", action="store_true",
                    help="overlap requests by timestamp (loads for the balance thresholds and least_load)")
    rp.add_argument("--ms-per-output-token", type=float, default=20.0, help="with --overlap: modeled decode time")
    rp.add_argument("--out", metavar="DIR", help="write route.json here")


ONE_SIDED = 1.5   # load_imbalance (max / mean prompt tokens per replica) above which a note explains it


def one_sided_notes(rows: list[dict], config) -> list[str]:
    """Why a prefix-following routing put (almost) everything on one replica, once per routing (its most
    imbalanced row): it is what the real router does with such traffic, not a fault of the model."""
    notes = []
    for routing in ("cache_aware", "prefix_hash"):
        worst = max((r for r in rows if r["routing"] == routing and r["replicas"] > 1
                     and r["load_imbalance"] > ONE_SIDED), key=lambda r: r["load_imbalance"], default=None)
        if worst is None:
            continue
        reqs = worst["requests_per_replica"]
        head = (f"note: {routing} sent {max(reqs)} of {sum(reqs)} requests to one replica at {worst['replicas']} "
                f"replicas (imbalance {worst['load_imbalance']:.2f}): ")
        if routing == "cache_aware":
            notes.append(head + (
                f"a request either follows its prefix to the replica that got it (a match above the cache threshold "
                f"{config.cache_threshold}) or, matching less, goes to the least loaded replica, the first among "
                f"equals, and the loads never differ by more than the balance threshold "
                f"({config.balance_abs_threshold} requests in flight) that would move it; sglang-router's "
                f"cache_aware does the same with this "
                f"traffic. A lower --balance-abs-threshold or more concurrency (--concurrency, --overlap) spreads it."))
        else:
            notes.append(head + (
                f"their first {config.prefix_tokens} tokens are the same, so they hash to the same replica; a larger "
                f"--prefix-tokens spreads them."))
    return notes


def rejected_notes(rows: list[dict], requests: int, cap: int, bounds) -> list[str]:
    """Why a hit rate is low because requests never ran: larger than a replica's pool (they count with no hits)."""
    hit = [r for r in rows if r["rejected"]]
    if not hit:
        return []
    worst = max(hit, key=lambda r: r["rejected"])
    whole = "every request" if worst["rejected"] == requests else f"{worst['rejected']:,} of {requests:,} requests"
    n = worst["replicas"]
    notes = [f"note: {whole} found no room in a replica's pool of {cap:,} tokens ({worst['routing']} at {n} "
             f"replica{'' if n == 1 else 's'}) and was rejected, counted with no hits; the smallest request holds "
             f"{bounds.smallest_request_pages * bounds.page_size:,} tokens (prompt + output - 1, in whole pages): a "
             f"larger --capacity "
             f"serves them"]
    if any(r["single_cache_optimum"] is None for r in rows):
        notes.append("note: no optimum where one cache of all replicas' capacity holds no request either")
    return notes


def cmd_route(args, load_workload, page_size_of) -> int:
    from core.lab.optimal import Bounds
    from core.lab.page_trace import Overlap
    from core.lab.plan_cli import check_common_args
    from core.lab.replay import replay
    from core.lab.routing import ROUTING_POLICIES, RouterConfig, check_routing, replay_routed, route
    from core.lab.units import in_bytes, parse_capacity
    check_common_args(args)
    counts = _ints(args.replicas, "--replicas")
    routings = list(ROUTING_POLICIES) if args.routing.strip() == "all" else \
        [check_routing(s.strip()) for s in args.routing.split(",") if s.strip()]
    if not routings:
        raise ValueError(f"--routing needs at least one of: {', '.join(ROUTING_POLICIES)}")
    config = RouterConfig(args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold,
                          args.prefix_tokens)
    if in_bytes(args.capacity):   # parse_capacity would say "give a model (--model-config)": route has none
        raise ValueError(f"--capacity {args.capacity!r} is in bytes; route takes tokens (200000, 200k) or pages "
                         f"(400p): python -m core.lab size or sweep --model-config turn bytes into tokens")
    parse_capacity(args.capacity, args.page_size or 1)     # before the trace is read; again at its page size
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)   # an unwritable --out fails before the work
    workload = load_workload(args)
    page_size = page_size_of(args, workload)
    cap = parse_capacity(args.capacity, page_size)
    overlap = Overlap(args.ms_per_output_token) if args.overlap else None
    bounds = Bounds(workload, page_size, overlap)
    inf = bounds.infinite().hit_rate
    print(f"workload {workload.name}: {len(workload):,} requests, {workload.prompt_tokens:,} prompt tokens; "
          f"{cap:,} tokens per replica, eviction {args.policy}, page {page_size}; infinite cache {inf:.4f}")
    print(f"{'replicas':>8} {'routing':>12} {'hit rate':>9} {'one cache':>9} {'optimum':>8} {'rejected':>8}  "
          f"{'per replica':<28} {'requests':<18} imbalance")
    rows = []
    for n in counts:
        one = replay(workload, cap * n, args.policy, page_size, overlap).hit_rate
        # where every request is larger than the pool, the page-level optimum would claim hits (as in sweep)
        opt = bounds.optimal(cap * n).hit_rate if bounds.anything_fits(cap * n) else None
        for routing in routings:
            assign = route(workload, n, routing, config, overlap, concurrency=args.concurrency)
            res = replay_routed(workload, cap, n, routing, args.policy, page_size, overlap, config, assign)
            d = res.to_dict()
            d.update(single_cache_hit_rate=one, single_cache_optimum=opt, infinite_hit_rate=inf)
            rows.append(d)
            per = " ".join(f"{h:.3f}" for h in d["hit_rate_per_replica"])
            print(f"{n:>8} {routing:>12} {res.hit_rate:>9.4f} {one:>9.4f} {'' if opt is None else f'{opt:.4f}':>8} "
                  f"{d['rejected']:>8}  {per:<28} {' '.join(map(str, d['requests_per_replica'])):<18} "
                  f"{d['load_imbalance']:.2f}")
    for note in one_sided_notes(rows, config) + rejected_notes(rows, len(workload), cap, bounds):
        print(note)
    if args.out:
        path = Path(args.out) / "route.json"
        path.write_text(json.dumps({"workload": workload.summary(), "rows": rows}, indent=2))
        print(f"wrote {path}")
    return 0
