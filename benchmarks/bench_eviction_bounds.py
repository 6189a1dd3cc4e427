"""How far a class-based reuse predictor can get, given perfect per-class rates (hindsight) or the rates of
the trace's first half (run on the second): the ceiling of `recall-value`'s design, and of a Hawkeye-style
learner (Jain & Lin, ISCA'16) that learns per class how often Belady's optimum keeps a block to its next use.

Flat per-block caches on the prompt blocks (as `bench_eviction.py --bounds`: a hit counts only in a
request's leading run), at one capacity. Each access of a block gets a class from what an online policy
could know by the time the block is evictable:

    uses   times the block was used before (0, 1, 2, 3+; over the whole trace: an unbounded memory)
    out    bit length of the request's output in tokens (told at the finish; pages are locked until then)
    len    bit length of the request's prompt in blocks
    end    distance from the prompt's end in blocks (0, 1, 2-3, 4-7, 8+)
    gap    requests since the block's previous use (bit length / 2, 0..7; 0 for a first use)

and a rate per class from one of two targets: `ret` (the block is used again) or `opt` (Belady's flat
optimum at this capacity keeps it to that next use: the Hawkeye / OPTgen label). The cache evicts by
`strict` rate order (LRU within a class) or by `thr` (rate >= 1/2 kept first, LRU within each side).

    .venv/bin/python benchmarks/bench_eviction_bounds.py --trace data/mooncake/synthetic_trace.jsonl.gz

gap closed = (x - flat LRU) / (flat Belady - flat LRU), on the hits counted (whole trace, or second half).
"""
from __future__ import annotations

import argparse
import heapq
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_eviction import block_uses  # noqa: E402
from core.lab import load_mooncake  # noqa: E402

NEVER = 1 << 40
TABLES = {   # field name -> (uses, out, len, end, gap) index
    "uses": (0,),
    "uses, out": (0, 1),
    "uses, out, len, end": (0, 1, 2, 3),
    "uses, out, len, end, gap": (0, 1, 2, 3, 4),
}


def next_gaps(reqs: list[list[int]]) -> list[list[int]]:
    """For each access, the requests until the block's next use (-1: never)."""
    nxt: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in reqs]
    for i in range(len(reqs) - 1, -1, -1):
        out[i] = [nxt[b] - i if b in nxt else -1 for b in reqs[i]]
        for b in reqs[i]:
            nxt[b] = i
    return out


def fields(reqs: list[list[int]], outs: list[int]) -> list[list[tuple]]:
    """Every access's five fields, from the past only (and the request's own output length)."""
    uses: Counter = Counter()
    last: dict[int, int] = {}
    res = []
    for i, ids in enumerate(reqs):
        n, ob, lb = len(ids), outs[i].bit_length(), len(ids).bit_length()
        res.append([(min(uses[b], 3), ob, lb, min((n - j - 1).bit_length(), 4),
                     min((i - last[b]).bit_length() // 2, 7) if b in last else 0) for j, b in enumerate(ids)])
        for b in ids:
            uses[b] += 1
            last[b] = i
    return res


def belady_keeps(reqs: list[list[int]], gaps: list[list[int]], cap: int) -> list[list[int]]:
    """1 where flat Belady (farthest next use goes first) keeps the block from this access to its next."""
    cache: dict[int, tuple] = {}
    where: dict[int, tuple[int, int]] = {}
    heap: list = []
    keeps = [[0] * len(ids) for ids in reqs]
    for i, ids in enumerate(reqs):
        for j, b in enumerate(ids):
            if b in cache:
                pi, pj = where[b]
                keeps[pi][pj] = 1
            nu = i + gaps[i][j] if gaps[i][j] >= 0 else NEVER
            cache[b], where[b] = (nu, i, j), (i, j)
            heapq.heappush(heap, (-nu, -i, -j, b))
        while len(cache) > cap:
            nu, mi, mj, b = heapq.heappop(heap)
            if cache.get(b) == (-nu, -mi, -mj):
                del cache[b]
    return keeps


def sim(reqs: list[list[int]], key, cap: int, count_from: int) -> float:
    """Flat cache, lowest key goes first; key(i, j) -> comparable (LRU within equal keys)."""
    cache: dict[int, tuple] = {}
    heap: list = []
    hits = total = 0
    for i, ids in enumerate(reqs):
        k = 0
        while k < len(ids) and ids[k] in cache:
            k += 1
        if i >= count_from:
            hits, total = hits + k, total + len(ids)
        for j, b in enumerate(ids):
            cache[b] = kk = (key(i, j), i, -j)
            heapq.heappush(heap, (kk, b))
        while len(cache) > cap:
            kk, b = heapq.heappop(heap)
            if cache.get(b) == kk:
                del cache[b]
    return hits / total


def rates(cls: list[list[tuple]], label: list[list[int]], lo: int, hi: int) -> dict:
    """(labelled + 1) / (accesses + 2) per class over requests lo..hi-1."""
    n: Counter = Counter()
    r: Counter = Counter()
    for i in range(lo, hi):
        for c, y in zip(cls[i], label[i]):
            n[c] += 1
            r[c] += y
    return {c: (r[c] + 1) / (n[c] + 2) for c in n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True, help="Mooncake JSONL trace")
    ap.add_argument("--capacity", type=int, default=6000, help="blocks")
    a = ap.parse_args()
    w = load_mooncake(a.trace)
    reqs, _ = block_uses(w)
    outs = [r.output_len for r in w.requests]
    cap, half = a.capacity, len(reqs) // 2
    gaps = next_gaps(reqs)
    f5 = fields(reqs, outs)
    labels = {"ret": [[int(g >= 0) for g in row] for row in gaps], "opt": belady_keeps(reqs, gaps, cap)}
    lru = {s: sim(reqs, lambda i, j: 0, cap, s) for s in (0, half)}
    opt = {s: sim(reqs, lambda i, j: -(i + gaps[i][j] if gaps[i][j] >= 0 else NEVER), cap, s) for s in (0, half)}
    print(f"\n### Class-table ceilings (flat, {cap:,} blocks; {len(reqs):,} requests, second half from {half:,})\n")
    print(f"flat LRU {lru[0]:.4f} (second half {lru[half]:.4f}); flat Belady {opt[0]:.4f} "
          f"(second half {opt[half]:.4f})\n")
    print("| class table | target | hindsight, strict | hindsight, thr | 1st half's rates on 2nd, strict "
          "| 1st half's rates on 2nd, thr |\n|---|---|---|---|---|---|")

    def cell(x: float, s: int) -> str:
        return f"{x:.4f} ({(x - lru[s]) / (opt[s] - lru[s]):+.1%})"

    for name, idx in TABLES.items():
        cls = [[tuple(c[k] for k in idx) for c in row] for row in f5]
        for target, lab in labels.items():
            row = [name, target]
            for lo_hi, s in (((0, len(reqs)), 0), ((0, half), half)):
                rt = rates(cls, lab, *lo_hi)
                for thr in (False, True):
                    def key(i: int, j: int, rt=rt, thr=thr) -> float:
                        v = rt.get(cls[i][j], 0.5)
                        return float(v >= 0.5) if thr else v
                    row.append(cell(sim(reqs, key, cap, s), s))
            print("| " + " | ".join(row) + " |", flush=True)
    print("\n(gap closed in brackets, against flat LRU and flat Belady on the same hits; the goal is +25 %)")


if __name__ == "__main__":
    main()
