"""`lrb` and `lrb-arc` (core/cache/eviction/learned.py) against LRU, ARC and the offline optimum, as gap closed.

The harness is benchmarks/bench_eviction.py's (same tables, same lab replays); this script only adds
them to its "new policies" and runs every part for the policies given:

    .venv/bin/python benchmarks/bench_eviction_learned.py --trace data/mooncake/synthetic_trace.jsonl.gz \
        --halves --generated --oracle --sensitivity
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_eviction as be  # noqa: E402

LEARNED = ["lrb", "lrb-arc"]


def run_sensitivity(path: str, cap: int, base: str) -> None:
    """`base` (lrb or lrb-arc) with its two constants varied, plus LRB's own rule (rank every leaf by the
    predicted probability, ties LRU), at one capacity: how much the result hangs on each choice."""
    from core.cache.eviction.base import lru_key
    from core.cache.eviction.registry import POLICIES, STATEFUL
    from core.cache.eviction.learned import LRB, LRBARC
    from core.lab import load_mooncake
    from core.lab.replay import replay

    w = load_mooncake(path)
    parent = LRBARC if base == "lrb-arc" else LRB

    class Rank(LRB):
        def key(self, node):
            return (self.score(node), node.last_access_time)

    def run(name: str, cls: type) -> float:
        STATEFUL[name], POLICIES[name] = cls, lru_key          # this process only: nothing is registered
        r = replay(w, cap * 512, name, page_size=512, level="token")
        return r.hit_tokens / r.prompt_tokens

    lru = replay(w, cap * 512, "lru", page_size=512).hit_tokens / w.prompt_tokens
    print(f"\n### {base} at {cap:,} blocks: boundary (pools) x dead threshold (lru {lru:.4f})\n")
    dead = (0.05, 0.1, 0.2)
    print("| boundary | " + " | ".join(f"dead {d}" for d in dead) + " |")
    print("|---" * (len(dead) + 1) + "|")
    for pools in (0.5, 1.0, 2.0):
        cells = []
        for d in dead:
            cls = type(f"S{pools}{d}", (parent,), {"boundary_pools": pools, "dead": d})
            cells.append(f"{run(f'_s{pools}_{d}', cls):.4f}")
        print(f"| {pools} | " + " | ".join(cells) + " |")
    for pools in (1.0, 2.0):
        cls = type(f"R{pools}", (Rank,), {"boundary_pools": pools})
        print(f"LRB's own rule (rank by predicted P, ties LRU), boundary {pools} pools: {run(f'_r{pools}', cls):.4f}")


def run_oracle(path: str, cap: int) -> None:
    """What a *perfect* predictor would be worth under the same rules: leaves ranked by knowledge of the
    future (the first block's next use, from the trace itself), whole leaves only, as lrb ranks them.
    Reads the trace's block ids back from the token ids (load_mooncake: block h -> ids h*512 ..) and
    the replay's clock (two ticks per request without overlap: arrival 2i+1). Not an online policy."""
    import bisect
    from collections import defaultdict

    from core.cache.eviction.base import EvictionPolicy, lru_key
    from core.cache.eviction.registry import POLICIES, STATEFUL
    from core.lab import load_mooncake
    from core.lab.replay import replay

    w = load_mooncake(path)
    uses = defaultdict(list)
    for i, r in enumerate(w.requests):
        for h in r.hash_ids[: r.prompt_len // r.block_size].tolist():
            uses[h].append(2 * i + 1)

    def oracle(boundary_requests: int) -> type:
        class Oracle(EvictionPolicy):
            stateful = True

            def attach(self, cache) -> None:
                super().attach(cache)
                self.cache = cache

            def key(self, node) -> tuple:
                now, u = self.cache.clock(), uses.get(int(node.key.token_ids[0]) // 512, [])
                k = bisect.bisect_right(u, now)
                nxt = u[k] if k < len(u) else 1 << 40
                if boundary_requests == 0:               # Belady on leaves: farthest next use first
                    return (-nxt, node.last_access_time)
                return (nxt - now <= 2 * boundary_requests, node.last_access_time)
        return Oracle

    print(f"\n### Perfect-knowledge rankings of whole leaves at {cap:,} blocks (not online)\n")
    for b, label in ((0, "leaf Belady (farthest next use first)"), (300, "comes back within 300 requests? then LRU"),
                     (600, "comes back within 600 requests? then LRU")):
        STATEFUL["_oracle"], POLICIES["_oracle"] = oracle(b), lru_key
        r = replay(w, cap * 512, "_oracle", page_size=512, level="token")
        print(f"- {label}: {r.hit_tokens / r.prompt_tokens:.4f}")


def run_reversed(path: str, caps: list[int], policies: list[str], workers: int) -> None:
    """A trace nothing was chosen on: the same requests in reverse order (LRU's and the optimum's hit rates
    are unchanged by reversal, reuse distances are symmetric; what a learner sees first is not)."""
    from core.lab import load_mooncake, run_sweep
    from core.lab.workloads import Workload, _copy

    w = load_mooncake(path)
    reqs = [_copy(r) for r in reversed(w.requests)]
    for r in reqs:
        r.timestamp = None
    rev = Workload(f"{w.name} reversed", reqs, dict(w.params), 0)
    res = run_sweep(rev, [f"{c}p" for c in caps], policies, page_size=512, workers=workers)
    be.table(res, policies, f"Mooncake {Path(path).name}, requests in reverse order")


def run_stats(path: str, horizon: int = 300) -> None:
    """Why prediction is hard: per request, its first-seen blocks (an infinite cache's misses) and the share
    of them used again within `horizon` requests, by request length and by whether a seen prefix was extended."""
    import bisect
    from collections import defaultdict

    from core.lab import load_mooncake

    reqs, uses = be.block_uses(load_mooncake(path))
    seen: set = set()
    kinds = {"full repeat": 0, "extends a seen prefix": 0, "new root": 0}
    by_len, by_kind = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for i, ids in enumerate(reqs):
        m = 0
        while m < len(ids) and ids[m] in seen:
            m += 1
        kind = "full repeat" if m == len(ids) else "extends a seen prefix" if m else "new root"
        kinds[kind] += 1
        for h in ids[m:]:
            u = uses[h]
            k = bisect.bisect_right(u, i)
            back = k < len(u) and u[k] - i <= horizon
            for tab, key in ((by_len, len(ids).bit_length() - 1), (by_kind, kind)):
                tab[key][0] += 1
                tab[key][1] += back
        seen.update(ids)
    n = len(reqs)
    new = sum(v[0] for v in by_kind.values())
    print(f"\n### First-seen blocks used again within {horizon} requests\n")
    print("requests: " + "; ".join(f"{k} {v / n:.0%}" for k, v in kinds.items()))
    print("new blocks: " + "; ".join(f"{k}: {v[0] / new:.0%} of them, {v[1] / v[0]:.1%} back"
                                     for k, v in by_kind.items()))
    print(f"all new blocks back within {horizon}: {sum(v[1] for v in by_kind.values()) / new:.1%}")
    print("by request length 2^k..2^(k+1)-1 blocks: " + "; ".join(
        f"k={k}: {v[1] / v[0]:.1%} of {v[0]:,}" for k, v in sorted(by_len.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="Mooncake JSONL trace")
    ap.add_argument("--capacities", default="1000,2000,4000,6000,12000", help="blocks of 512 tokens")
    ap.add_argument("--policies", default="lru,arc,lrb")
    ap.add_argument("--halves", action="store_true", help="also: first vs second half of the trace at 6,000")
    ap.add_argument("--generated", action="store_true", help="also: the four generated workloads")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--sensitivity", action="store_true",
                    help="also: lrb-arc and lrb with their constants varied, at 6,000 blocks")
    ap.add_argument("--oracle", action="store_true",
                    help="also: leaf rankings with perfect knowledge of the future, at 6,000 blocks")
    ap.add_argument("--reversed", action="store_true", help="also: the trace in reverse order at 3,000 / 6,000")
    ap.add_argument("--stats", action="store_true", help="also: how predictable new blocks' reuse is")
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
        if a.reversed:
            run_reversed(a.trace, [3000, 6000], pols, a.workers)
        if a.stats:
            run_stats(a.trace)
        if a.oracle:
            run_oracle(a.trace, 6000)
        if a.sensitivity:
            run_sensitivity(a.trace, 6000, "lrb-arc")
            run_sensitivity(a.trace, 6000, "lrb")
    if a.generated:
        be.run_generated(pols, a.workers, a.page_size)


if __name__ == "__main__":
    main()
