"""Eviction research table: every policy against LRU and the offline optimum, as gap closed.

    gap closed = (policy - lru) / (optimum - lru)      (hit rates of prompt tokens)

Parts (each optional):
  --trace     the Mooncake trace through the lab (core.lab.run_sweep) at --capacities blocks
  --halves    the same at one capacity on the trace's first and second half (does it generalise?)
  --generated the four generated workloads at pools of 10 / 25 / 50 % of their distinct pages
  --stats     block reuse statistics of the trace (why the gap is hard)
  --bounds    how far a perfect "will this block be used again?" predictor gets (flat, LRU within two
              groups): the ceiling of admission-style policies, so of any class-based reuse predictor
  --noise-outputs  the trace with output lengths shuffled across requests: what recall-value's output
              field costs on a trace where the output length says nothing
  --flat      libcachesim's flat block caches (LRU, ARC, S3-FIFO, LHD, Belady...) on the same block
              trace: what the leaf-only rule and prefix closure cost, and where flat online policies land

    .venv/bin/python benchmarks/bench_eviction.py --trace data/mooncake/synthetic_trace.jsonl.gz \
        --halves --generated --flat --bounds
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.lab import Bounds, load_mooncake, make_workload, page_trace, run_sweep  # noqa: E402
from core.lab.optimal import next_counted_use  # noqa: E402

NEW = ["arc", "s3fifo", "gdsf", "lhd", "lecar", "recall", "recall-value"]
BASE = ["lru", "fifo", "slru"]
GENERATED = {   # default generator parameters: the lab's own workloads, nothing fitted here
    "generated-shared-prefix": {}, "multi-turn-chat": {}, "few-shot": {}, "tree-of-thought": {},
}


def gap_closed(hit: float, lru: float, opt: float) -> float:
    return (hit - lru) / (opt - lru) if opt - lru > 1e-9 else math.nan


def table(res, policies, label) -> list[dict]:
    """Print one sweep as rows of capacities, columns of policies, and return the rows."""
    df = res.table()
    rows = []
    print(f"\n### {label}\n")
    print("| capacity (pages) | " + " | ".join(policies) + " | optimal | best new: gap closed |")
    print("|---" * (len(policies) + 3) + "|")
    for cap in res.capacities:
        at = df[df.capacity_tokens == cap].set_index("policy")["hit_rate"]
        pages = int(df[df.capacity_tokens == cap].capacity_pages.iloc[0])
        lru, opt = at["lru"], at["optimal"]
        new = {p: at[p] for p in policies if p in NEW}
        best = max(new, key=new.get) if new else None
        cells = [f"{at[p]:.4f}" for p in policies]
        gc = gap_closed(new[best], lru, opt) if best else math.nan
        print(f"| {pages:,} | " + " | ".join(cells) + f" | {opt:.4f} | {best} {gc:+.1%} |")
        rows.append({"label": label, "pages": pages, **{p: at[p] for p in policies}, "optimal": opt})
    print("\ngap closed per policy: " + "; ".join(
        f"{p}: " + ", ".join(f"{gap_closed(r[p], r['lru'], r['optimal']):+.0%}" for r in rows)
        for p in policies if p != "lru"))
    worst = {p: min(r[p] - r["lru"] for r in rows) for p in policies if p != "lru"}
    print("worst loss to lru (points): " + "; ".join(f"{p}: {100 * v:+.2f}" for p, v in worst.items()))
    return rows


def run_trace(path: str, caps: list[int], policies: list[str], workers: int) -> None:
    w = load_mooncake(path)
    t0 = time.perf_counter()
    res = run_sweep(w, [f"{c}p" for c in caps], policies, page_size=512, workers=workers)
    table(res, policies, f"Mooncake {Path(path).name}, 512-token blocks ({time.perf_counter() - t0:.0f} s)")


def run_halves(path: str, cap: int, policies: list[str], workers: int) -> None:
    w = load_mooncake(path)
    n = len(w)
    for lo, hi in ((0, n // 2), (n // 2, n)):
        part = w.slice(lo, hi)
        res = run_sweep(part, [f"{cap // 2}p", f"{cap}p"], policies, page_size=512, workers=workers)
        table(res, policies, f"Mooncake requests [{lo}:{hi}]")


def run_noise(path: str, cap: int, policies: list[str], workers: int, seeds: range = range(1, 9)) -> None:
    """The trace with its output lengths shuffled across requests: where the output length says nothing
    about reuse, what does recall-value's output field cost? (Prompts, order and LRU barely change.)"""
    import random

    from core.lab.workloads import Workload, _copy

    w = load_mooncake(path)
    print(f"\n### Output lengths shuffled across requests ({cap:,} blocks)\n")
    print("| seed | " + " | ".join(policies) + " |\n" + "|---" * (len(policies) + 1) + "|")
    for seed in seeds:
        outs = [r.output_len for r in w.requests]
        random.Random(seed).shuffle(outs)
        reqs = [_copy(r) for r in w.requests]
        for r, o in zip(reqs, outs):
            r.output_len = o
        res = run_sweep(Workload(f"{w.name} shuffled {seed}", reqs, dict(w.params), 0), [f"{cap}p"], policies,
                        page_size=512, workers=workers)
        at = res.table().set_index("policy")["hit_rate"]
        print(f"| {seed} | " + " | ".join(f"{at[p]:.4f}" for p in policies) + " |")


def run_generated(policies: list[str], workers: int, page_size: int) -> None:
    for name, params in GENERATED.items():
        w = make_workload(name, **params)
        distinct = Bounds(w, page_size).distinct_pages
        caps = sorted({max(1, int(distinct * f)) * page_size for f in (0.10, 0.25, 0.50)})
        res = run_sweep(w, caps, policies, page_size=page_size, workers=workers)
        table(res, policies, f"{name} (page {page_size}, {distinct:,} distinct pages)")


def run_flat(path: str, caps: list[int]) -> None:
    """libcachesim on the flat block trace: every page access is a get; a prompt page's hit counts.

    `flat` counts every prompt page found; `usable` only the leading run of hits of each request
    (a page past the first miss cannot be used by prefill: the radix tree's prefix closure)."""
    import libcachesim as lcs

    w = load_mooncake(path)
    tr = page_trace(w, 512)
    nxt = next_counted_use(tr.pages, tr.counted, tr.depth)
    pages, counted, depth = tr.pages.tolist(), tr.counted.tolist(), tr.depth.tolist()
    never = 1 << 62
    nxt = [k if k < (1 << 40) else never for k in nxt.tolist()]
    total = tr.prompt_tokens / 512
    # ClockPro, LRB and 3L-Cache are left out: with libcachesim's defaults ClockPro hits 0.05 at 6,000 blocks
    # (misconfigured, not a policy result) and LRB / 3L-Cache equal LRU to the last digit (their learned part
    # never engages on a trace this short)
    algos = {"LRU": lcs.LRU, "FIFO": lcs.FIFO, "ARC": lcs.ARC, "S3FIFO": lcs.S3FIFO, "LHD": lcs.LHD,
             "LeCaR": lcs.LeCaR, "Cacheus": lcs.Cacheus, "Sieve": lcs.Sieve, "LIRS": lcs.LIRS, "MQ": lcs.MQ,
             "TwoQ": lcs.TwoQ, "WTinyLFU": lcs.WTinyLFU, "LRUK": lcs.LRUK, "Hyperbolic": lcs.Hyperbolic,
             "GLCache": lcs.GLCache, "Clock2QPlus": lcs.Clock2QPlus, "Belady": lcs.Belady}
    print("\n### libcachesim flat block caches on the same block trace (hit rate of prompt blocks)\n")
    print("| capacity (blocks) | " + " | ".join(f"{a} flat / usable" for a in algos) + " |")
    print("|---" * (len(algos) + 1) + "|")
    for cap in caps:
        cells = []
        for name, cls in algos.items():
            cache = cls(cap)
            req = lcs.Request()
            req.obj_size = 1
            flat = usable = 0
            lead = False
            for i, (p, c, d) in enumerate(zip(pages, counted, depth)):
                req.obj_id = p
                req.clock_time = i
                req.next_access_vtime = nxt[i]
                hit = cache.get(req)
                if c:
                    if d == 0:
                        lead = True
                    flat += hit
                    lead = lead and hit
                    usable += lead
            cells.append(f"{flat / total:.4f} / {usable / total:.4f}")
        print(f"| {cap:,} | " + " | ".join(cells) + " |")


def run_stats(path: str) -> None:
    """Why the gap is hard: how likely a block is to come back after k uses, and how late."""
    import numpy as np
    from collections import defaultdict

    w = load_mooncake(path)
    _, uses = block_uses(w)
    again, gaps = defaultdict(lambda: [0, 0]), defaultdict(list)
    for seq in uses.values():
        for j, i in enumerate(seq):
            k = min(j + 1, 4)
            again[k][0] += 1
            if j + 1 < len(seq):
                again[k][1] += 1
                gaps[k].append(seq[j + 1] - i)
    print("\n### Block reuse on the trace (requests between uses)\n")
    print("| used so far | blocks | used again | gap p25 | gap median | gap p75 |")
    print("|---|---|---|---|---|---|")
    for k in sorted(again):
        n, m = again[k]
        q = np.percentile(gaps[k], [25, 50, 75])
        label = f"{k}" if k < 4 else "4+"
        print(f"| {label} | {n:,} | {m / n:.0%} | {q[0]:.0f} | {q[1]:.0f} | {q[2]:.0f} |")
    # a block's place in the request that brought it (the prompt's last blocks come back least), and that
    # request's output length (what recall-value hears at the finish)
    back, by_out = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    seen: set = set()
    for r in w.requests:
        ids = r.hash_ids[: r.prompt_len // r.block_size].tolist()
        out = int(r.output_len).bit_length()
        for j, h in enumerate(ids):
            if h not in seen:
                end = len(ids) - 1 - j
                b = "0 (last)" if end == 0 else "1" if end == 1 else "2-7" if end < 8 else "8+"
                used = len(uses[h]) > 1
                back[b][0] += 1
                back[b][1] += used
                by_out[out][0] += 1
                by_out[out][1] += used
        seen.update(ids)
    print("\nnew blocks by distance from the end of their prompt: " + "; ".join(
        f"{b}: {m / n:.0%} used again ({n:,})" for b, (n, m) in back.items()))
    print("\n| its request's output (tokens) | new blocks | used again |\n|---|---|---|")
    for b in sorted(by_out):
        n, m = by_out[b]
        span = "0" if b == 0 else f"{1 << (b - 1)}-{(1 << b) - 1}"
        print(f"| {span} | {n:,} | {m / max(n, 1):.0%} |")
    # what the optimum admits: first uses of blocks it caches at 6,000 blocks
    tr = page_trace(w, 512)
    nxt = next_counted_use(tr.pages, tr.counted, tr.depth).tolist()
    first = np.zeros(len(tr), dtype=bool)
    first[np.unique(tr.pages, return_index=True)[1]] = True
    import heapq
    cache, heap, admitted = {}, [], 0
    for i, (p, k) in enumerate(zip(tr.pages.tolist(), nxt)):
        if p in cache:
            cache[p] = k
            heapq.heappush(heap, (-k, p))
            continue
        if k >= 1 << 40:
            continue
        if len(cache) >= 6000:
            while cache.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)
            if -heap[0][0] <= k:
                continue
            del cache[heapq.heappop(heap)[1]]
        cache[p] = k
        heapq.heappush(heap, (-k, p))
        admitted += bool(first[i])
    print(f"the optimum at 6,000 blocks admits {admitted:,} of {int(first.sum()):,} new blocks "
          f"({admitted / first.sum():.0%})")


def block_uses(w) -> tuple[list[list[int]], dict[int, list[int]]]:
    """Each request's whole prompt blocks (hash ids), and for each block the requests that use it, in order."""
    from collections import defaultdict

    reqs = [r.hash_ids[: r.prompt_len // r.block_size].tolist() for r in w.requests]
    uses: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(reqs):
        for h in ids:
            uses[h].append(i)
    return reqs, uses


def run_bounds(path: str, cap: int) -> None:
    """Flat per-block caches (prompt blocks; a hit counts only in a request's leading run) that evict one
    group before the other, LRU (or the true next use) within each: what knowing *which* blocks come back,
    or *when*, is worth, by kind."""
    import bisect
    import heapq
    from collections import OrderedDict

    w = load_mooncake(path)
    reqs, uses = block_uses(w)
    out = [r.output_len for r in w.requests]
    total = sum(len(ids) for ids in reqs)
    never = 1 << 40

    def next_use(h: int, i: int) -> int:
        u = uses[h]
        k = bisect.bisect_right(u, i)
        return u[k] if k < len(u) else never

    def sim(keep) -> float:     # keep(seen_before, next_use, i, t) -> a key; the lowest goes first
        cache, heap, ghost, hits, t = {}, [], OrderedDict(), 0, 0
        for i, ids in enumerate(reqs):
            lead = True
            for h in ids:
                lead = lead and h in cache
                hits += lead
            for h in ids:
                t += 1
                seen = h in cache or ghost.pop(h, None) is not None
                cache[h] = t
                heapq.heappush(heap, (keep(seen, next_use(h, i), i, t), t, h))
                while len(cache) > cap:
                    _, t0, h0 = heapq.heappop(heap)
                    if cache.get(h0) == t0:
                        del cache[h0]
                        ghost[h0] = True
                        if len(ghost) > 4 * cap:    # recall's memory: 4 pools
                            ghost.popitem(last=False)
        return hits / total

    rows = {"lru": lambda s, n, i, t: (0, t),
            "seen before (4 pools) kept first, as static recall": lambda s, n, i, t: (int(s), t),
            "oracle on first-seen blocks (seen ones as lru)": lambda s, n, i, t: (int(s or n < never), t),
            "oracle on seen-before blocks (first-seen as lru)": lambda s, n, i, t: (int(not s or n < never), t),
            "oracle on every block": lambda s, n, i, t: (int(n < never), t),
            "seen first; first-seen by their true next use": lambda s, n, i, t: (int(s), -n if not s else t),
            "seen first; seen by their true next use": lambda s, n, i, t: (int(s), -n if s else t),
            "seen first; first-seen of a request with < 16 output tokens as seen":
                lambda s, n, i, t: (int(s or out[i] < 16), t)}
    print(f"\n### What knowing which blocks come back is worth (flat, {cap:,} blocks)\n")
    print("| keep first | hit rate |\n|---|---|")
    for label, fn in rows.items():
        print(f"| {label} | {sim(fn):.4f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="Mooncake JSONL trace")
    ap.add_argument("--capacities", default="1000,2000,4000,6000,12000", help="blocks of 512 tokens")
    ap.add_argument("--policies", default=",".join(BASE + NEW))
    ap.add_argument("--halves", action="store_true", help="also: first vs second half of the trace")
    ap.add_argument("--generated", action="store_true", help="also: the four generated workloads")
    ap.add_argument("--page-size", type=int, default=16, help="page size of the generated workloads")
    ap.add_argument("--flat", action="store_true", help="also: libcachesim flat caches on the block trace")
    ap.add_argument("--stats", action="store_true", help="also: block reuse statistics of the trace")
    ap.add_argument("--bounds", action="store_true", help="also: what a perfect reuse predictor is worth (flat)")
    ap.add_argument("--noise-outputs", action="store_true",
                    help="also: the trace with output lengths shuffled across requests, seeds 1-8, 6,000 blocks")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    caps = [int(c) for c in a.capacities.split(",")]
    pols = [p.strip() for p in a.policies.split(",")]
    if "lru" not in pols:
        pols.insert(0, "lru")
    if a.trace:
        run_trace(a.trace, caps, pols, a.workers)
        if a.halves:
            run_halves(a.trace, 6000, pols, a.workers)
        if a.flat:
            run_flat(a.trace, caps)
        if a.stats:
            run_stats(a.trace)
        if a.bounds:
            run_bounds(a.trace, 6000)
        if a.noise_outputs:
            run_noise(a.trace, 6000, pols, a.workers)
    if a.generated:
        run_generated(pols, a.workers, a.page_size)


if __name__ == "__main__":
    main()
