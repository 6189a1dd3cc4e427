"""Independent reference replays for the lab's tests, written from the definitions and sharing no code with
core.lab beyond the TraceRequest fields: pages are named by the tuple of every token (or hash id) up to their end,
the pool is an OrderedDict, the optimum is Belady's MIN by scanning.

- `accesses`: a sequential workload as page accesses: on arrival the whole prompt pages, counted when they end
  before the prompt's last token (the engine always computes that token, as SGLang: `matchable`), on finish
  the further whole pages of prompt + output - 1 (not counted: they only make pages available).
- `reference_infinite`: counted accesses of pages seen before.
- `reference_lru`: a plain page-level LRU: the longest cached prefix of the prompt hits and is touched, the
  least recently used other pages make room for the request's pages (all of prompt + output - 1, rounded up),
  its whole pages go in as most recent; a request larger than the pool is rejected (no hits, nothing kept).
- `reference_optimum`: Belady's MIN with bypass over the counted accesses: on a miss with a full pool, the cached
  page whose next counted use is farthest goes, unless the new page's own next use is farther still.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, defaultdict

INF = float("inf")


def page_keys(r, page_size: int) -> tuple[list, int]:
    """(keys of the whole pages of prompt + output - 1, number of whole prompt pages) of one request."""
    n_prompt, n_cached = r.prompt_len // page_size, r.cached_len // page_size
    if r.hash_ids is not None and r._output is None and page_size == r.block_size:
        h = r.hash_ids.tolist()
        return [tuple(h[:k + 1]) for k in range(n_prompt)] + [("out", r.rid, k) for k in range(n_prompt, n_cached)], n_prompt
    toks = r.cached_ids().tolist()
    return [(r.extra_key, tuple(toks[:(k + 1) * page_size])) for k in range(n_cached)], n_prompt


def matchable(r, page_size: int) -> int:
    """Whole pages of the prompt before its last token: what a prefix match may cover."""
    return (r.prompt_len - 1) // page_size


def accesses(workload, page_size: int, capacity_pages: int = 1 << 62) -> list[tuple[object, bool]]:
    """(page, counted) in order; a request that holds more pages than `capacity_pages` is left out (no pool of
    that size runs it)."""
    out = []
    for r in workload.requests:
        if -(-r.cached_len // page_size) > capacity_pages:
            continue
        keys, n_prompt = page_keys(r, page_size)
        m = matchable(r, page_size)
        out += [(k, i < m) for i, k in enumerate(keys[:n_prompt])] + [(k, False) for k in keys[n_prompt:]]
    return out


def reference_infinite(workload, page_size: int) -> int:
    seen, hits = set(), 0
    for k, counted in accesses(workload, page_size):
        hits += counted and k in seen
        seen.add(k)
    return hits * page_size


def reference_lru(workload, capacity_pages: int, page_size: int) -> int:
    cache: OrderedDict = OrderedDict()
    hits = 0
    for r in workload.requests:
        keys, n_prompt = page_keys(r, page_size)
        need = -(-r.cached_len // page_size)
        if need > capacity_pages:
            continue
        h, m = 0, matchable(r, page_size)
        while h < m and keys[h] in cache:
            h += 1
        for k in keys[:h]:
            cache.move_to_end(k)
        hits += h * page_size
        mine = set(keys[:h])
        while capacity_pages - len(cache) < need - h:
            victim = next(k for k in cache if k not in mine)
            del cache[victim]
        for k in keys[h:]:
            cache[k] = None
            cache.move_to_end(k)     # a page still cached past the match is used again (the insert finds it)
    return hits


def reference_optimum(seq: list[tuple[object, bool]], capacity_pages: int) -> int:
    """Hit pages of Belady's MIN with bypass on (page, counted) accesses."""
    uses = defaultdict(list)
    for i, (k, counted) in enumerate(seq):
        if counted:
            uses[k].append(i)

    def next_use(k, i):
        u = uses.get(k, [])
        j = bisect_right(u, i)
        return u[j] if j < len(u) else INF

    cache: dict = {}
    hits = 0
    for i, (k, counted) in enumerate(seq):
        if k in cache:
            hits += counted
            cache[k] = next_use(k, i)
            continue
        nxt = next_use(k, i)
        if nxt == INF:
            continue
        if len(cache) < capacity_pages:
            cache[k] = nxt
            continue
        victim = max(cache, key=cache.get)
        if cache[victim] > nxt:
            del cache[victim]
            cache[k] = nxt
    return hits
