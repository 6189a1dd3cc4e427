"""Cache-only replay: a workload through the real RadixCache + SlotAllocator, no model, no KV tensors.

Each request does what the engine does with it, minus the forward pass:
  match_prefix(whole pages of the prompt) -> lock the matched path -> alloc slots for the rest of
  prompt + output - 1 (evicting when alloc fails) -> insert prompt + output - 1 (whole pages) ->
  free the duplicates and the unaligned tail page -> unlock.
Without overlap each request finishes before the next arrives. With `Overlap`, a request arrives
at its timestamp, inserts its prompt at once (SGLang's `cache_unfinished_req`: later arrivals can
hit it) and keeps its path locked and its slots held until it finishes, timestamp + modeled
duration later; then its output is inserted as above.

A request whose slots cannot be found even after evicting everything evictable (its prompt is
larger than the pool, or running requests hold the rest) is *rejected*: counted with zero hits,
nothing inserted. The clock ticks once per arrival and once per finish.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from core.eviction import POLICIES
from core.lab.optimal import capacity_pages
from core.lab.pages import ARRIVE, Overlap, event_order
from core.lab.workloads import Request, Workload
from core.memory import SlotAllocator
from core.radix_cache import RadixCache, RadixKey


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

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def tokens_saved(self) -> int:
        return self.hit_tokens

    def to_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate, "tokens_saved": self.tokens_saved}


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    return policy


class _Replayer:
    def __init__(self, capacity_tokens: int, policy: str, page_size: int, check: bool, host=None) -> None:
        self.pages = capacity_pages(capacity_tokens, page_size)
        self.page_size = page_size
        self.alloc = SlotAllocator(self.pages * page_size, page_size=page_size)
        self.cache = RadixCache(self.alloc, page_size=page_size, eviction_policy=check_policy(policy),
                                record_events=False)
        self.frees = 0
        self.host = host              # optional second tier (core.lab.host_tier.HostTier)
        self._evicting = False
        chained = self.alloc.on_event

        def count(kind: str, slots: torch.Tensor) -> None:
            if kind == "free":
                self.frees += 1
                if self._evicting and host is not None:
                    host.evicted(slots)
            if chained is not None:
                chained(kind, slots)
        self.alloc.on_event = count
        self.check = check
        self.evictions = self.evicted_tokens = self.rejected = self.hits = 0
        self.running: dict[int, tuple] = {}    # rid -> (locked node, slots, prompt pages' length)
        self._empty = torch.empty(0, dtype=torch.int64)

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _ceil(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def _alloc(self, n: int) -> Optional[torch.Tensor]:
        if n == 0:
            return self._empty
        slots = self.alloc.alloc(n)
        if slots is None:
            before = self.frees
            self._evicting = True
            try:
                self.evicted_tokens += self.cache.evict(n - self.alloc.available())
            finally:
                self._evicting = False
            self.evictions += self.frees - before
            slots = self.alloc.alloc(n)
        return slots

    def _free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self.alloc.free(slots)

    def arrive(self, r: Request, keep_running: bool) -> None:
        cache = self.cache
        seq = r.cached_ids()             # prompt + output - 1; the prompt is its head
        prompt = seq[:r.prompt_len]
        n_prompt = self._aligned(r.prompt_len)
        m = cache.match_prefix(RadixKey(prompt[:n_prompt], r.extra_key))
        hit = int(m.indices.numel())
        cache.inc_lock_ref(m.last_node)
        if self.host is not None:
            self.host.lookup(r, hit)
        slots = self._alloc(self._ceil(r.cached_len) - hit)
        if slots is None:
            cache.dec_lock_ref(m.last_node)
            self.rejected += 1
            if self.host is not None:
                self.host.reject(r)
            return
        self.hits += hit
        value = torch.cat([m.indices, slots]) if hit else slots
        # cache_unfinished_req: the prompt goes into the tree when its prefill ends, as the engine does;
        # the request keeps it locked until it finishes
        if n_prompt > hit:
            cached = cache.insert(RadixKey(prompt[:n_prompt], r.extra_key), value[:n_prompt])
            if self.host is not None:
                self.host.placed(r, value[cached:n_prompt], cached, n_prompt)
            self._free(value[hit:cached])
            m2 = cache.match_prefix(RadixKey(prompt[:n_prompt], r.extra_key))
            cache.inc_lock_ref(m2.last_node)
            cache.dec_lock_ref(m.last_node)
            m = m2
            value = torch.cat([m.indices, value[n_prompt:]])
        if not keep_running:
            self._finish(r, m.last_node, value, int(m.indices.numel()), seq)
            return
        self.running[r.rid] = (m.last_node, value, int(m.indices.numel()))
        self._check()

    def finish(self, r: Request) -> None:
        if r.rid in self.running:       # rejected requests never ran
            node, value, in_tree = self.running.pop(r.rid)
            self._finish(r, node, value, in_tree)

    def _finish(self, r: Request, node, value: torch.Tensor, in_tree: int, seq=None) -> None:
        """cache_finished_req: insert prompt + output - 1 (whole pages), free duplicates and the tail."""
        n_cached = self._aligned(r.cached_len)
        if n_cached > in_tree:
            seq = r.cached_ids() if seq is None else seq
            cached = self.cache.insert(RadixKey(seq[:n_cached], r.extra_key), value[:n_cached])
            if self.host is not None:
                self.host.placed(r, value[cached:n_cached], cached, n_cached)
            self._free(value[in_tree:cached])
        self._free(value[max(n_cached, in_tree):])
        self.cache.dec_lock_ref(node)
        self._check()

    def _check(self) -> None:
        if self.check:
            held = [v[t:] for _, v, t in self.running.values()]
            self.cache.check_invariants(torch.cat(held) if held else self._empty)


def replay(workload: Workload, capacity_tokens: int, policy: str = "lru", page_size: int = 1,
           overlap: Optional[Overlap] = None, check_invariants: bool = False,
           progress: Optional[Callable[[int, int], None]] = None, host=None) -> ReplayResult:
    """Replay `workload` through a RadixCache of `capacity_tokens` slots (rounded down to whole pages).

    progress(done, total) is called about every 1% of the events (an arrival and a finish per request).
    host: an optional second tier behind the pool (core.lab.host_tier.HostTier), told of evictions
    (evicted(slots)), of each device match (lookup(request, hit tokens); reject(request) when it
    then finds no room) and of pages entering the tree (placed(request, slots, lo, hi)).
    """
    t0 = time.perf_counter()
    rep = _Replayer(capacity_tokens, policy, page_size, check_invariants, host)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the tensors are small: intra-op threads only add contention (10x on 2 cores)
    try:
        _run(rep, workload, overlap, progress)
    finally:
        torch.set_num_threads(threads)
    return ReplayResult(policy=policy, capacity_tokens=int(capacity_tokens), capacity_pages=rep.pages,
                        page_size=page_size, overlap=overlap is not None, requests=len(workload),
                        prompt_tokens=workload.prompt_tokens, hit_tokens=rep.hits, evictions=rep.evictions,
                        evicted_tokens=rep.evicted_tokens, rejected=rep.rejected,
                        seconds=time.perf_counter() - t0)


def _run(rep: _Replayer, workload: Workload, overlap: Optional[Overlap],
         progress: Optional[Callable[[int, int], None]]) -> None:
    reqs = workload.requests
    order = event_order(workload, overlap)
    every = max(1, len(order) // 100)
    tick = rep.cache.tick
    for j, (kind, i) in enumerate(order):
        tick()
        if kind == ARRIVE:
            rep.arrive(reqs[i], overlap is not None)
        elif overlap is not None:
            rep.finish(reqs[i])
        if progress is not None and j % every == 0:
            progress(j, len(order))
    if progress is not None:
        progress(len(order), len(order))
