"""The two bounds every policy is drawn against: infinite capacity, and the offline optimum (Belady).

Both work on the page trace (`core.lab.page_trace`), never on the radix tree:

- infinite capacity: a prompt page hits when any earlier access touched it;
- offline optimum at page granularity, for a pool of C pages (Belady's MIN with bypass):
  on a miss with a full pool, evict the cached page whose next use is farthest away, and do not
  admit the new page at all when its own next use is later than that of every cached page.
  "Next use" is the next *prompt* access (only those can hit); a page never used again is
  never admitted, and when it is already cached it counts as used at infinity + its depth.
  A request that holds more pages than the pool (prompt + output - 1, rounded up) is left out of the
  trace at that capacity: every policy rejects it, so it can neither hit nor leave pages for others.

Why the optimum is an upper bound on every policy, and why its hits are real prefix hits: a page's
parent is always used at or before the page itself, so the parent's next use is never later;
the optimum therefore evicts children before parents and never admits a child without its parent,
so its pool is always prefix-closed (a cached page has its whole prefix cached) and every page hit
is usable. The radix cache is one particular way of choosing which C pages to hold, constrained
further (it must hold each running request's pages, cannot bypass), so it cannot hit more.
"""
from __future__ import annotations

import dataclasses
import heapq
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from core.lab.page_trace import Overlap, PageTrace, page_trace
from core.lab.workloads import Workload

# Keys of pages with no future use: _NEVER + depth, so deeper pages count as used later.
_NEVER = 1 << 40


@dataclass(frozen=True)
class BoundResult:
    """One bound at one capacity (capacity None = infinite)."""

    bound: str                     # "infinite" or "optimal"
    capacity_tokens: Optional[int]
    capacity_pages: Optional[int]
    page_size: int
    hit_tokens: int
    prompt_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate}


def next_counted_use(pages: np.ndarray, counted: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For each access i: the position of the next counted access of the same page after i,
    or _NEVER + depth[i] when there is none. Vectorised: sort by page, suffix-min per page group."""
    n = pages.shape[0]
    out = _NEVER + depth.astype(np.int64)
    if n == 0:
        return out
    order = np.argsort(pages, kind="stable")              # by page, then by position
    sp = pages[order]
    group_start = np.empty(n, dtype=bool)
    group_start[0] = True
    group_start[1:] = sp[1:] != sp[:-1]
    group = np.cumsum(group_start) - 1                   # 0.. per page group, ascending along `order`
    pos = np.where(counted[order], order, n)             # counted positions, others "n" (= none)
    # suffix minimum within each group: offset by group so a later group never wins
    key = group.astype(np.int64) * (n + 1) + pos
    suffix = np.minimum.accumulate(key[::-1])[::-1]
    nxt = np.full(n, n, dtype=np.int64)
    same = ~group_start[1:]                              # element k+1 in the same group as k
    nxt[:-1][same] = suffix[1:][same] - group[:-1][same].astype(np.int64) * (n + 1)
    found = nxt < n
    out[order[found]] = nxt[found]
    return out


def infinite_hits(trace: PageTrace) -> int:
    """Prompt pages touched before (any earlier access) = hits with a pool that never evicts."""
    _, first = np.unique(trace.pages, return_index=True)
    seen_before = np.ones(len(trace), dtype=bool)
    seen_before[first] = False
    return int(np.count_nonzero(trace.counted & seen_before))


def belady_hits(trace: PageTrace, capacity_pages: int, next_use: Optional[np.ndarray] = None) -> int:
    """Prompt-page hits of the offline optimum with a pool of `capacity_pages` pages."""
    if capacity_pages < 1:
        raise ValueError(f"the optimum needs a pool of at least one page, got {capacity_pages}")
    if next_use is None:
        next_use = next_counted_use(trace.pages, trace.counted, trace.depth)
    pages = trace.pages.tolist()
    counted = trace.counted.tolist()
    nxt = next_use.tolist()
    cache: dict[int, int] = {}          # page -> its next use
    heap: list[tuple[int, int]] = []    # (-next use, page); stale entries skipped lazily
    push, pop = heapq.heappush, heapq.heappop
    hits = 0
    never = _NEVER
    for p, c, k in zip(pages, counted, nxt):
        if p in cache:
            hits += c
            if cache[p] != k:
                cache[p] = k
                push(heap, (-k, p))
            continue
        if k >= never:
            continue                    # no future use: admitting it cannot help
        if len(cache) < capacity_pages:
            cache[p] = k
            push(heap, (-k, p))
            continue
        while True:
            negk, q = heap[0]
            if cache.get(q) == -negk:
                break
            pop(heap)
        if -negk > k:                   # the farthest cached page is used later: swap it out
            pop(heap)
            del cache[q]
            cache[p] = k
            push(heap, (-k, p))
        # else bypass: the new page is used later than every cached page
    return hits


def smallest_request_pages(workload: Workload, page_size: int) -> int:
    """Pages the smallest request holds while it runs (prompt + output - 1 tokens, rounded up to pages): a pool
    with fewer pages rejects every request, whatever the policy (core.lab.replay); 0 for an empty workload."""
    return min((-(-r.cached_len // page_size) for r in workload.requests), default=0)


class Bounds:
    """Infinite-capacity and optimal hit rates of one workload at one page size (trace built once)."""

    def __init__(self, workload: Workload, page_size: int = 1, overlap: Optional[Overlap] = None,
                 trace: Optional[PageTrace] = None) -> None:
        self.trace = trace if trace is not None else page_trace(workload, page_size, overlap)
        self.page_size = self.trace.page_size
        self.smallest_request_pages = smallest_request_pages(workload, self.page_size)
        self._next_use: Optional[np.ndarray] = None
        self._infinite: Optional[BoundResult] = None

    @property
    def next_use(self) -> np.ndarray:
        if self._next_use is None:
            t = self.trace
            self._next_use = next_counted_use(t.pages, t.counted, t.depth)
        return self._next_use

    @property
    def distinct_pages(self) -> int:
        """Pages the optimum needs to hold everything: with this many it equals the infinite rate."""
        return self.trace.num_distinct

    def infinite(self) -> BoundResult:
        if self._infinite is None:
            hits = infinite_hits(self.trace)
            self._infinite = BoundResult("infinite", None, None, self.page_size, hits * self.page_size,
                                         self.trace.prompt_tokens)
        return self._infinite

    def anything_fits(self, capacity_tokens: int) -> bool:
        """False where every request is larger than the pool: every policy rejects them all, and the page-level
        optimum (which admits pages, not requests) would claim hits no pool of that size can have."""
        return capacity_pages(capacity_tokens, self.page_size) >= self.smallest_request_pages

    def optimal(self, capacity_tokens: int) -> BoundResult:
        pages = capacity_pages(capacity_tokens, self.page_size)
        t = self.trace
        if t.need is None or int(t.need.max(initial=0)) <= pages:
            hits = belady_hits(t, pages, self.next_use)
        else:     # without the requests no pool of this size runs (they had counted hits no policy can have)
            keep = t.need <= pages
            fits = dataclasses.replace(t, pages=t.pages[keep], counted=t.counted[keep], depth=t.depth[keep],
                                       need=t.need[keep])
            hits = belady_hits(fits, pages) if keep.any() else 0
        return BoundResult("optimal", capacity_tokens, pages, self.page_size, hits * self.page_size,
                           self.trace.prompt_tokens)


def capacity_pages(capacity_tokens: int, page_size: int) -> int:
    """Whole pages in a pool of `capacity_tokens` slots; a ValueError below one page."""
    if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, (int, np.integer)):
        raise ValueError(f"capacity must be an integer number of tokens, got {capacity_tokens!r}")
    if capacity_tokens < page_size:
        raise ValueError(f"capacity of {capacity_tokens} tokens is below one page of {page_size} tokens; "
                         f"give at least {page_size}")
    return int(capacity_tokens) // page_size


def infinite_hit_rate(workload: Workload, page_size: int = 1, overlap: Optional[Overlap] = None) -> float:
    return Bounds(workload, page_size, overlap).infinite().hit_rate


def optimal_hit_rate(workload: Workload, capacity_tokens: int, page_size: int = 1,
                     overlap: Optional[Overlap] = None) -> float:
    return Bounds(workload, page_size, overlap).optimal(capacity_tokens).hit_rate
