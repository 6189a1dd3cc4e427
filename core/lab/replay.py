"""Cache-only replay: a workload through the real RadixCache + SlotAllocator, no model, no KV tensors.

Each request does what the engine does with it, minus the forward pass:
  match_prefix(whole pages of the prompt) -> lock the matched path -> alloc slots for the rest of
  prompt + output - 1 (evicting when alloc fails) -> insert prompt + output - 1 (whole pages) ->
  free the duplicates and the unaligned tail page -> unlock.
Without overlap each request finishes before the next arrives. With `Overlap`, a request arrives
at its timestamp, inserts its prompt at once (SGLang's `cache_unfinished_req`: later arrivals can
hit it) and keeps its path locked and its slots held until it finishes, timestamp + modeled
duration later; then its output is inserted as above.

Two levels, the same numbers (tests/lab/test_replay.py holds them equal on every policy):
- level="page" keys the tree by page: one id per page (`core.lab.page_trace.request_pages`, a trie id that
  names the page and its whole prefix), one slot per page, so the work per request scales with its
  pages, not its tokens. A page-level node splits, ages and is evicted exactly where the token-level
  node would, so every hit, eviction and rejection is the same.
- level="token" expands every page into its tokens (a Mooncake block into 512 ids) and keys the tree
  by token, with the tree's own page_size: what the engine's cache does. Kept as the reference.
"auto" is "page" for page_size > 1 and "token" for page_size 1 (where they are the same thing), and
"token" for the stateful policies (core.cache.eviction.registry.is_stateful: arc, s3fifo, lecar, lhd, gdsf, recall...): they
name nodes by their first units for their ghosts, and the first 4 tokens of a node are not its first
4 pages, so only the token level replays exactly what the engine's cache does with them.

A request whose slots cannot be found even after evicting everything evictable (its prompt is
larger than the pool, or running requests hold the rest) is *rejected*: counted with zero hits,
nothing inserted. The clock ticks once per arrival and once per finish.

A pool larger than the workload can ever fill (`pool_pages_needed`) is replayed at that size: no
policy evicts anything there, so the result equals the larger pool's, and "80G" never allocates
80 billion slots. `ReplayResult.pool_pages` says what was allocated.

Seam for a second tier (a host pool behind the device pool), page level only, `host=` (a `HostTier`;
core/lab/host_tier.py is the HiCache-like one). All pages are named by trie id, so each id stands for its
whole prefix and a flat dict keyed by id is a correct cache of prefixes; `i` is the request's index:
- `host.on_arrive(i, page_ids)`: request i arrived and the device matched these prompt pages;
- `host.match(page_ids) -> int`: then, how many of the following prompt pages the host holds (consecutive
  from the first). They count as `host_hit_tokens`, not as device hits, and still take device slots (they
  are loaded back), so the device flow is unchanged;
- `host.on_reject(i)`: request i then found no room (nothing it matched counts);
- `host.on_insert(i, page_ids, depth)`: these pages of request i (the first at `depth` in its sequence)
  just entered the device tree (its prompt at arrival, its output when it finishes);
- `host.on_evict(page_ids)`: the device pool just evicted these pages (one node's, in order).
Optionally `host.begin(workload)`, called before the first event: a tier starts each replay empty, so one
tier object can serve several replays (the points of a sweep) without carrying pages from one to the next.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Protocol

import numpy as np
import torch

from core.cache.allocator import SLOT_DTYPE, SlotAllocator
from core.cache.eviction.registry import POLICIES, is_stateful
from core.cache.radix_cache import RadixCache, RadixKey
from core.lab.lab_cache import LabCache
from core.lab.optimal import capacity_pages
from core.lab.page_trace import ARRIVE, Overlap, PageTrace, event_order, matchable_pages, request_pages
from core.lab.workloads import TraceRequest, Workload
from core.observe.invariants import check_cache_invariants

LEVELS = ("auto", "page", "token")
HOST_METHODS = ("on_arrive", "match", "on_reject", "on_insert", "on_evict")   # HostTier's, in call order


@dataclass(frozen=True)
class ReplayResult:
    """One (capacity, policy) point."""

    policy: str
    capacity_tokens: int
    capacity_pages: int
    page_size: int
    overlap: bool
    requests: int
    prompt_tokens: int
    hit_tokens: int          # prompt tokens served from the cache (= tokens of prefill saved)
    evictions: int           # tree nodes evicted
    evicted_tokens: int
    rejected: int            # requests that found no room (see the module docstring)
    seconds: float
    pool_pages: int = 0      # pages actually allocated: capacity_pages, or fewer when that is all the workload can fill
    level: str = "page"
    host_hit_tokens: int = 0  # prompt tokens a second tier served (0 without one)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def tokens_saved(self) -> int:
        return self.hit_tokens

    def to_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate, "tokens_saved": self.tokens_saved}


class HostTier(Protocol):
    """What the replay tells a second tier and asks of it (see the module docstring)."""

    def on_arrive(self, i: int, page_ids: np.ndarray) -> None: ...

    def match(self, page_ids: np.ndarray) -> int: ...

    def on_reject(self, i: int) -> None: ...

    def on_insert(self, i: int, page_ids: np.ndarray, depth: int) -> None: ...

    def on_evict(self, page_ids: np.ndarray) -> None: ...


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    return policy


def check_page_size(page_size: int) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer (tokens per page), got {page_size!r}")
    return int(page_size)


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def pool_pages_needed(workload: Workload, page_size: int, overlap: Optional[Overlap] = None,
                      distinct: Optional[int] = None) -> int:
    """Pages a pool needs so that no policy ever evicts: the `distinct` whole pages the tree can hold (when
    not given, all whole cached pages of every request: an upper bound) plus the most pages the running
    requests hold at once. Any larger pool replays to the same numbers."""
    page_size = check_page_size(page_size)
    held = [_ceil_div(r.cached_len, page_size) for r in workload.requests]
    tree = distinct if distinct is not None else sum(r.cached_len // page_size for r in workload.requests)
    if overlap is None:
        return tree + max(held)
    peak = running = 0
    for kind, i in event_order(workload, overlap):
        running += held[i] if kind == ARRIVE else -held[i]
        peak = max(peak, running)
    return tree + peak


class _Replayer:
    """Works in *units*: tokens (level "token", the tree's page_size = page_size) or pages (level "page",
    tree page_size 1, one slot per page). `unit` tokens per unit turns counts back into tokens."""

    def __init__(self, workload: Workload, pool_pages: int, policy: str, page_size: int, page_level: bool,
                 check: bool, pages: Optional[list], host: Optional[HostTier]) -> None:
        self.workload = workload
        self.page_size = page_size
        self.page_level = page_level
        self.unit = page_size if page_level else 1
        tree_page = 1 if page_level else page_size
        self.alloc = SlotAllocator(pool_pages * (1 if page_level else page_size), page_size=tree_page)
        cls = LabCache if page_level else RadixCache   # the token level is the engine's cache, untouched
        self.cache = cls(self.alloc, page_size=tree_page, eviction_policy=check_policy(policy), record_events=False)
        self.pages = pages
        self.host = host
        if host is not None:
            if not page_level:
                raise ValueError("a host tier needs the page-level replay (level='page')")
            self.cache.on_evict = host.on_evict
        self.frees = 0
        if page_level:
            self.alloc.on_event = None      # no events are recorded; evictions are counted by LabCache
        else:
            chained = self.alloc.on_event

            def count(kind: str, slots: torch.Tensor) -> None:
                if kind == "free":
                    self.frees += 1
                if chained is not None:
                    chained(kind, slots)
            self.alloc.on_event = count
        self.check = check
        self.evictions = self.evicted_tokens = self.rejected = self.hits = self.host_hits = 0
        self.running: dict[int, tuple] = {}    # rid -> (locked node, slots, units in the tree)
        self._empty = torch.empty(0, dtype=SLOT_DTYPE)

    def _units(self, i: int, r: TraceRequest) -> tuple[np.ndarray, int, int, int]:
        """(keys, whole prompt units, whole cached units, units to hold) of request i."""
        ps = self.page_size
        if self.page_level:
            ids, n_prompt = self.pages[i]
            return ids, n_prompt, ids.shape[0], _ceil_div(r.cached_len, ps)
        return (r.cached_ids(), r.prompt_len - r.prompt_len % ps, r.cached_len - r.cached_len % ps,
                _ceil_div(r.cached_len, ps) * ps)

    def _alloc(self, n: int) -> Optional[torch.Tensor]:
        if n == 0:
            return self._empty
        slots = self.alloc.alloc(n)
        if slots is None:
            before = self.cache.evicted_nodes if self.page_level else self.frees
            self.evicted_tokens += self.cache.evict(n - self.alloc.available()) * self.unit
            self.evictions += (self.cache.evicted_nodes if self.page_level else self.frees) - before
            slots = self.alloc.alloc(n)
        return slots

    def _free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self.alloc.free(slots)

    def _host_hits(self, i: int, keys: np.ndarray, hit: int, n_match: int) -> int:
        """Seam: tell the host of the device's `hit`; matchable prompt pages after it that the host serves (0
        without one)."""
        if self.host is None:
            return 0
        self.host.on_arrive(i, keys[:hit])
        if hit >= n_match:
            return 0
        return min(int(self.host.match(keys[hit:n_match])), n_match - hit)

    def _inserted(self, i: int, keys: np.ndarray, lo: int, hi: int) -> None:
        """Seam: pages [lo, hi) of request i entered the device tree."""
        if self.host is not None and hi > lo:
            self.host.on_insert(i, keys[lo:hi], lo)

    def arrive(self, i: int, keep_running: bool) -> None:
        cache, r = self.cache, self.workload.requests[i]
        keys, n_prompt, n_cached, need = self._units(i, r)
        prompt = RadixKey.wrap(keys[:n_prompt], r.extra_key)
        n_match = matchable_pages(r.prompt_len, self.page_size) * (1 if self.page_level else self.page_size)
        m = cache.match_prefix(RadixKey.wrap(keys[:n_match], r.extra_key))
        hit = int(m.indices.numel())
        extra = self._host_hits(i, keys, hit, n_match)
        cache.inc_lock_ref(m.last_node)
        slots = self._alloc(need - hit)
        if slots is None:
            cache.dec_lock_ref(m.last_node)
            self.rejected += 1
            if self.host is not None:
                self.host.on_reject(i)
            return
        self.hits += hit * self.unit
        self.host_hits += extra * self.unit
        value = torch.cat([m.indices, slots]) if hit else slots
        # cache_unfinished_req: the prompt goes into the tree when its prefill ends, as the engine does;
        # the request keeps it locked until it finishes
        inserted = 0                     # the request's cache_inserted_len: its hits count once a node
        if n_prompt > hit:
            cached = cache.insert(prompt, value[:n_prompt])
            inserted = n_prompt
            self._inserted(i, keys, cached, n_prompt)
            self._free(value[hit:cached])
            m2 = cache.match_prefix(prompt)
            cache.inc_lock_ref(m2.last_node)
            cache.dec_lock_ref(m.last_node)
            m = m2
            value = torch.cat([m.indices, value[n_prompt:]])
        in_tree = int(m.indices.numel())
        if not keep_running:
            self._finish(i, m.last_node, value, in_tree, keys, n_cached, inserted)
            return
        self.running[r.rid] = (m.last_node, value, in_tree, inserted)
        self._check()

    def finish(self, i: int) -> None:
        r = self.workload.requests[i]
        if r.rid in self.running:       # rejected requests never ran
            node, value, in_tree, inserted = self.running.pop(r.rid)
            keys, _, n_cached, _ = self._units(i, r)
            self._finish(i, node, value, in_tree, keys, n_cached, inserted)

    def _finish(self, i: int, node, value: torch.Tensor, in_tree: int, keys: np.ndarray, n_cached: int,
                inserted: int) -> None:
        """cache_finished_req: insert prompt + output - 1 (whole pages), free duplicates and the tail. The insert
        runs even when it adds nothing, as the engine's (and SGLang's): it stamps the path and counts hits."""
        r = self.workload.requests[i]
        if n_cached > 0:
            cached = self.cache.insert(RadixKey.wrap(keys[:n_cached], r.extra_key), value[:n_cached],
                                       output_len=r.output_len, inserted_len=inserted)
            self._inserted(i, keys, cached, n_cached)
            self._free(value[in_tree:cached])
        else:
            self.cache.request_finished(node, r.output_len)
        self._free(value[max(n_cached, in_tree):])
        self.cache.dec_lock_ref(node)
        self._check()

    def _check(self) -> None:
        if self.check:
            held = [v[t:] for _, v, t, _ in self.running.values()]
            check_cache_invariants(self.cache, torch.cat(held) if held else self._empty)


def replay(workload: Workload, capacity_tokens: int, policy: str = "lru", page_size: int = 1,
           overlap: Optional[Overlap] = None, check_invariants: bool = False,
           progress: Optional[Callable[[int, int], None]] = None, *, level: str = "auto",
           trace: Optional[PageTrace] = None, host: Optional[HostTier] = None) -> ReplayResult:
    """Replay `workload` through a RadixCache of `capacity_tokens` slots (rounded down to whole pages).

    progress(done, total) is called about every 1% of the events (an arrival and a finish per request).
    level: "page", "token" or "auto" (see the module docstring). trace: the workload's PageTrace at this
    page size, when the caller has it (a sweep builds it once), so the page ids are not derived again.
    host: a second tier (see the module docstring).
    """
    t0 = time.perf_counter()
    page_size = check_page_size(page_size)
    check_policy(policy)
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    missing = [m for m in HOST_METHODS if host is not None and not callable(getattr(host, m, None))]
    if missing:
        raise ValueError(f"host= must implement core.lab.replay.HostTier ({', '.join(HOST_METHODS)}); "
                         f"{type(host).__name__} lacks {', '.join(missing)}")
    want = capacity_pages(capacity_tokens, page_size)
    order = event_order(workload, overlap)     # checks the timestamps before any work
    page_level = level == "page" or (level == "auto" and page_size > 1 and not is_stateful(policy))
    if trace is not None and (trace.page_size != page_size or trace.requests is None):
        trace = None
    pages = None
    if page_level:
        pages = trace.requests if trace is not None else request_pages(workload, page_size)
    distinct = trace.num_distinct if trace is not None else None
    if page_level and trace is None:
        distinct = int(np.unique(np.concatenate([ids for ids, _ in pages])).shape[0])
    needed = pool_pages_needed(workload, page_size, overlap, distinct)
    pool = max(1, min(want, needed))
    begin = getattr(host, "begin", None)
    if callable(begin):
        begin(workload)                        # an empty tier for this replay
    rep = _Replayer(workload, pool, policy, page_size, page_level, check_invariants, pages, host)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the tensors are small: intra-op threads only add contention (10x on 2 cores)
    try:
        _run(rep, order, overlap is not None, progress)
    finally:
        torch.set_num_threads(threads)
    return ReplayResult(policy=policy, capacity_tokens=int(capacity_tokens), capacity_pages=want,
                        page_size=page_size, overlap=overlap is not None, requests=len(workload),
                        prompt_tokens=workload.prompt_tokens, hit_tokens=rep.hits, evictions=rep.evictions,
                        evicted_tokens=rep.evicted_tokens, rejected=rep.rejected,
                        seconds=time.perf_counter() - t0, pool_pages=pool,
                        level="page" if page_level else "token", host_hit_tokens=rep.host_hits)


def _run(rep: _Replayer, order: list[tuple[int, int]], overlapped: bool,
         progress: Optional[Callable[[int, int], None]]) -> None:
    every = max(1, len(order) // 100)
    tick = rep.cache.tick
    total = len(order)
    for j, (kind, i) in enumerate(order):
        tick()
        if kind == ARRIVE:
            rep.arrive(i, overlapped)
        elif overlapped:
            rep.finish(i)
        if progress is not None and j % every == 0:
            progress(j, total)
    if progress is not None:
        progress(total, total)
