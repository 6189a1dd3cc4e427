"""Continuous batching over the radix cache: admit, allocate (evicting), batch, cache, retract.

One `schedule()` call builds a mixed batch: running requests first (a decode is one new
token; a chunked prefill continues within the token budget), then waiting requests in
policy order (`lpm` = longest prefix match first, as SGLang, falling back to `fcfs` above
128 waiting, where sorting costs more than it saves and starves unique prompts). Unlike SGLang,
lpm cannot starve: a request that later arrivals overtook 4 times goes first (one client's batch of
prompts sharing a few cached tokens kept a lone prompt waiting 100 s). As SGLang's
in-batch prefix caching does, a waiting request that shares 32+ not-yet-cached prefix tokens
with one admitted this step (or still prefilling) is held back a step, so it hits the cache
instead of computing the same prefix twice. Slots come from the allocator; when it runs dry,
`RadixCache.evict` frees unlocked leaves, and if decoding still cannot continue the newest
running request is retracted (its computed tokens stay cached).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from core.cache.allocator import SLOT_DTYPE, SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.cache.radix_node import common_len
from core.engine.config import SCHEDULE_POLICIES
from core.engine.request import ABORTED, FINISHED, RUNNING, WAITING, Request

LPM_FALLBACK_WAITING = 128      # SGLang: above this many waiting requests lpm schedules as fcfs
LPM_MAX_OVERTAKEN = 4           # a waiting request that lpm let this many later arrivals overtake goes first
IN_BATCH_PREFIX_TOKENS = 32     # SGLang's IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD
MAX_HELD_PER_STEP = LPM_FALLBACK_WAITING  # hold-back checks stop here, so a step costs O(128), not O(queue)
INSERT_GROWTH = 64              # mid-prompt, new tokens go into the tree once they are 1/64 of what it holds of it
                                # (0: every chunk, as SGLang; benchmarks/bench_mixed_steps.py compares)


@dataclass
class ScheduledItem:
    req: Request
    tokens: list[int]          # the tokens computed this step: fill_ids[computed : computed + n]
    new_slots: torch.Tensor    # where their K/V go


class Scheduler:
    def __init__(self, cache: RadixCache, allocator: SlotAllocator, schedule_policy: str,
                 max_running_requests: int, max_prefill_tokens: int) -> None:
        """The settings come from EngineConfig (its defaults, checks and help)."""
        if schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"unknown schedule policy {schedule_policy!r}; choose one of: {', '.join(SCHEDULE_POLICIES)}")
        if max_running_requests < 1 or max_prefill_tokens < 1:
            raise ValueError("max_running_requests and max_prefill_tokens must be >= 1")
        self.cache, self.allocator = cache, allocator
        self.page_size = allocator.page_size
        self.policy = schedule_policy
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._admit_counter = 0
        self._arrivals = 0             # arrival order of waiting requests (Request.arrival)
        self.retractions = 0
        self.held_back = 0             # admissions deferred a step by in-batch prefix sharing
        self.failed: list[tuple[Request, BaseException]] = []  # requests a step could not serve

    # ----- slots -----------------------------------------------------------------------------
    def _alloc(self, req: Request, n: int) -> Optional[torch.Tensor]:
        """`n` slots for the request's next tokens: its partly filled page first, then new pages."""
        tail = req.tail_slots
        if n <= tail.numel():
            req.tail_slots = tail[n:]
            return tail[:n]
        need = n - tail.numel()
        need += (-need) % self.page_size
        slots = self.allocator.alloc(need)
        if slots is None:
            self.cache.evict(need - self.allocator.available())
            slots = self.allocator.alloc(need)
            if slots is None:
                return None
        got = torch.cat([tail, slots])
        req.tail_slots = got[n:]
        return got[:n]

    def _key(self, req: Request, n: int) -> RadixKey:
        return RadixKey(req.fill_ids[:n], req.extra_key)

    def _lock(self, req: Request, node) -> None:
        self.cache.inc_lock_ref(node)
        req.last_node = node

    def _unlock(self, req: Request) -> None:
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
            req.last_node = None

    def cache_unfinished(self, req: Request, prefill_done: bool = False) -> None:
        """After a prefill chunk: put the computed tokens in the tree and lock the longer path (SGLang's
        cache_unfinished_req). Mid-prompt, new tokens fewer than 1/INSERT_GROWTH of the request's tokens already in
        the tree wait for the next chunks: the fairness cap runs a long prompt in chunks of 2-6 tokens beside
        decoding streams, and a node per chunk made a 3,000-node chain that every later chunk's insert, match
        and locks walked (8 ms a step 5,000 tokens deep); this way a 6,000-token prompt makes ~300 nodes, a
        short one still one per chunk, and a request sharing the prompt meanwhile misses at most 1/64 of it.
        The waiting tokens are the request's own slots; the prefill's end inserts them all."""
        n = req.computed - req.computed % self.page_size
        if self.cache.disable or n <= req.tree_len:
            return
        if not prefill_done and INSERT_GROWTH and (n - req.tree_len) * INSERT_GROWTH < req.tree_len:
            return
        key = self._key(req, n)
        cached = self.cache.insert(key, req.kv_slots[:n], req.params.priority, inserted_len=req.inserted_len)
        self.allocator.free(req.kv_slots[req.tree_len:cached])
        # the tree owns the first n tokens' slots from here: said before anything below can raise, so a
        # failing request's release frees only what is still its own (kv_slots[n:]), never the tree's
        req.tree_len = req.inserted_len = n
        m = self.cache.match_prefix(key)
        req.kv_slots = torch.cat([m.indices, req.kv_slots[n:]])
        old = req.last_node
        self._lock(req, m.last_node)
        if old is not None:
            self.cache.dec_lock_ref(old)

    def release(self, req: Request, cache_kv: bool = True, finished: bool = False, count_hits: bool = True) -> None:
        """Give back everything `req` holds; with `cache_kv` its computed tokens go into the tree
        first (cache_finished_req: prompt + output minus the last token, whose KV never existed).
        `finished`: it ended normally, so the policy hears its output length (an abort's is cut short).
        The insert runs even when it adds nothing, as SGLang's: it stamps the path and counts the hits of a request
        that never inserted (its prompt all cached). A retraction's (`count_hits` False) counts none: the request
        counts its path when it runs again."""
        n = req.computed - req.computed % self.page_size
        free_from = req.tree_len
        told = len(req.output_ids) if finished else None
        try:
            if cache_kv and not self.cache.disable and n > 0:
                cached = self.cache.insert(self._key(req, n), req.kv_slots[:n], req.params.priority,
                                           output_len=told, inserted_len=req.inserted_len if count_hits else n)
                free_from = max(n, req.tree_len)      # the tree owns the new pages from here, whatever follows
                if cached > req.tree_len:
                    self.allocator.free(req.kv_slots[req.tree_len:cached])   # duplicates of what it held
            elif told is not None and req.last_node is not None:   # the finish added no page
                self.cache.request_finished(req.last_node, told)
            self.allocator.free(torch.cat([req.kv_slots[free_from:], req.tail_slots]))
        finally:                      # a failed insert or free still lets go of the path and of the slots' record
            self._unlock(req)
            req.kv_slots = req.kv_slots[:0]
            req.tail_slots = req.tail_slots[:0]
            req.tree_len = req.inserted_len = 0

    def held_slots(self) -> torch.Tensor:
        """Slots running requests own outside the tree (for the conservation invariant)."""
        parts = [r.own_slots() for r in self.running]
        return torch.cat(parts) if parts else torch.empty(0, dtype=SLOT_DTYPE)

    # ----- queue -----------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.state = WAITING
        req.arrival, req.overtaken = self._arrivals, 0
        self._arrivals += 1
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self.release(req, cache_kv=True)
        req.state = ABORTED

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.release(req, cache_kv=True, finished=True)
        req.state = FINISHED

    def _retract_newest(self) -> Request:
        victim = max(self.running, key=lambda r: r.admit_order)
        self.running.remove(victim)
        self.release(victim, cache_kv=True, count_hits=False)   # it counts its hits when it runs again
        victim.state = WAITING
        self.waiting.insert(0, victim)
        self.retractions += 1
        return victim

    # ----- one step --------------------------------------------------------------------------
    def schedule(self, budget: Optional[int] = None) -> list[ScheduledItem]:
        """Pick this step's work and give it slots. Returns an empty list when idle.

        `budget`: the prefill tokens this step may carry (default max_prefill_tokens; the engine passes
        a smaller one while requests decode, see step_budget.py). Running decodes always step. Waiting
        requests are owed up to half of the budget before a running chunked prefill takes the rest, so
        a short request arriving behind a long prompt is admitted at the next step, finishes its prefill
        before the long one's next chunk (`_share_chunks`), and the long prompt still advances every step."""
        budget = self.max_prefill_tokens if budget is None else max(1, budget)
        for_new = self._owed_to_waiting(budget)
        items: list[ScheduledItem] = []
        allowance = self._share_chunks(budget, for_new)
        for req in sorted(self.running, key=lambda r: r.admit_order):
            if req not in self.running:
                continue  # retracted while making room for an older request
            mine = allowance.get(id(req), 0)
            try:
                item, left = self._continue(req, items, mine)
            except Exception as exc:  # this request fails, the others run
                items = [it for it in items if it.req is not req]
                self._fail(req, exc)
                continue
            budget -= mine - left
            if item is not None:
                items.append(item)
        items.extend(self._admit(budget))
        return items

    def _share_chunks(self, budget: int, for_new: int) -> dict[int, int]:
        """Prefill tokens each running chunked prefill may compute this step. The oldest keeps up to half the
        budget, so it advances every step; of the other half, waiting requests get what they are owed (`for_new`)
        first (else a second long prompt took it all), then the younger chunked prefills, shortest remaining first
        (a short prompt admitted in part finishes its prefill at the next step); the rest goes to the oldest."""
        chunked = [r for r in self.running if len(r.fill_ids) - r.computed > 1]
        if not chunked:
            return {}
        remaining = {id(r): len(r.fill_ids) - r.computed for r in chunked}
        oldest = min(chunked, key=lambda r: r.admit_order)
        reserve = min(remaining[id(oldest)], budget // 2)
        left = max(0, budget - reserve - for_new)
        allowance: dict[int, int] = {}
        for r in sorted(chunked, key=lambda r: (remaining[id(r)], r.admit_order)):
            if r is not oldest:
                allowance[id(r)] = take = min(remaining[id(r)], left)
                left -= take
        allowance[id(oldest)] = min(remaining[id(oldest)], reserve + left)
        return allowance

    def decoding(self) -> int:
        """Running requests whose next step is a decode (one token)."""
        return sum(1 for r in self.running if len(r.fill_ids) - r.computed == 1)

    def _owed_to_waiting(self, budget: int) -> int:
        """Prefill tokens kept from running chunked prefills for waiting requests: what those that could be admitted
        want, at most half the budget and the slots free or evictable (0 when nothing waits or no chunked prefill
        runs). One that `_hold_back` defers this step (its prefix is being computed now) wants nothing: counted, it
        left half of every step idle while a system prompt that the queue shares was prefilled."""
        if not self.waiting or not any(len(r.fill_ids) - r.computed > 1 for r in self.running):
            return 0
        half = budget // 2
        room = self.max_running_requests - len(self.running)
        in_flight = self._in_flight()
        want = held = 0
        for r in self.waiting[:max(0, room)]:
            if want >= half:
                break
            if self._defers(r, in_flight, {}):
                held += 1
                if held >= MAX_HELD_PER_STEP:
                    break       # as _admit: a step never scans a huge queue
                continue
            want += len(r.fill_ids)
        return min(half, want, self.allocator.available() + self.cache.evictable_size())

    def discard(self, req: Request) -> None:
        """Take `req` out of the queues and give back what it holds, uncached (its K/V may be half
        written): what a failed request leaves behind."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self.release(req, cache_kv=False)

    def _fail(self, req: Request, exc: BaseException) -> None:
        """Discard `req` and hand it to the engine to complete with the error."""
        try:
            self.discard(req)
        finally:
            self.failed.append((req, exc))

    def take_failed(self) -> list[tuple[Request, BaseException]]:
        out, self.failed = self.failed, []
        return out

    def _continue(self, req: Request, items: list[ScheduledItem], budget: int):
        """The next item of a running request (one decode token or the next prefill chunk)."""
        remaining = len(req.fill_ids) - req.computed
        n = 1 if remaining == 1 else min(remaining, budget)
        if n <= 0:
            return None, budget
        slots = self._alloc(req, n)
        while slots is None and len(self.running) > 1:
            victim = self._retract_newest()
            items[:] = [it for it in items if it.req is not victim]
            if victim is req:
                break
            slots = self._alloc(req, n)
        if slots is None:
            return None, budget
        if remaining > 1:
            budget -= n
        return ScheduledItem(req, req.fill_ids[req.computed:req.computed + n], slots), budget

    def _order_waiting(self) -> tuple[list[Request], dict[int, int]]:
        """Waiting requests in admission order, and the cached prefix length of those it measured."""
        if self.policy == "fcfs" or len(self.waiting) < 2 or len(self.waiting) > LPM_FALLBACK_WAITING:
            return list(self.waiting), {}
        lens = {id(r): self.cache.peek_prefix_len(self._key(r, len(r.fill_ids) - 1)) for r in self.waiting}
        overtaken = [r for r in self.waiting if r.overtaken >= LPM_MAX_OVERTAKEN]   # in queue order
        rest = [r for r in self.waiting if r.overtaken < LPM_MAX_OVERTAKEN]
        return overtaken + sorted(rest, key=lambda r: -lens[id(r)]), lens  # stable: FCFS among equals

    def _count_overtakes(self, admitted: list[Request]) -> None:
        """Each waiting request counts the requests that arrived after it and were admitted before it."""
        if self.policy != "lpm" or not admitted or len(self.waiting) > LPM_FALLBACK_WAITING:
            return
        arrivals = sorted(r.arrival for r in admitted)
        for r in self.waiting:
            r.overtaken += len(arrivals) - bisect.bisect_right(arrivals, r.arrival)

    def _in_flight(self) -> list[tuple[np.ndarray, Optional[str]]]:
        """Prompts still being prefilled: a waiting request sharing their prefix waits for the cache."""
        return [(np.asarray(r.prompt_ids, dtype=np.int64), r.extra_key) for r in self.running
                if r.computed < len(r.prompt_ids)]

    def _defers(self, req: Request, in_flight: list[tuple[np.ndarray, Optional[str]]], lens: dict[int, int]) -> bool:
        """Whether `req` is held back this step (`_hold_back`), its cached prefix read from `lens` when measured."""
        cached = lens.get(id(req))
        if cached is None and in_flight and not self.cache.disable:
            cached = self.cache.peek_prefix_len(self._key(req, len(req.fill_ids) - 1))
        return self._hold_back(req, cached or 0, in_flight)

    def _hold_back(self, req: Request, cached: int, in_flight: list[tuple[np.ndarray, Optional[str]]]) -> bool:
        """True if `req` shares 32+ uncached prefix tokens with a prompt being computed now."""
        if self.cache.disable or not in_flight:
            return False
        ids = np.asarray(req.fill_ids[:-1], dtype=np.int64)
        if ids.shape[0] - cached < IN_BATCH_PREFIX_TOKENS:
            return False
        return any(extra == req.extra_key and common_len(other, ids, 1) - cached >= IN_BATCH_PREFIX_TOKENS
                   for other, extra in in_flight)

    def _admit(self, budget: int) -> list[ScheduledItem]:
        items: list[ScheduledItem] = []
        order, lens = self._order_waiting()
        in_flight = self._in_flight()
        held = 0
        for req in order:
            if len(self.running) >= self.max_running_requests or budget <= 0:
                break
            try:
                if self._defers(req, in_flight, lens):
                    self.held_back += 1
                    held += 1
                    if held >= MAX_HELD_PER_STEP:
                        break   # a step never scans a huge queue: the rest wait their turn anyway
                    continue
                item = self._admit_one(req, budget)
            except Exception as exc:  # this request fails, the others are admitted
                self._fail(req, exc)
                continue
            if item is None:
                break
            budget -= len(item.tokens)
            items.append(item)
            in_flight.append((np.asarray(req.prompt_ids, dtype=np.int64), req.extra_key))
        self._count_overtakes([it.req for it in items])
        return items

    def _admit_one(self, req: Request, budget: int) -> Optional[ScheduledItem]:
        """Match `req`'s prefix, lock it and give it slots for its first chunk; None if the pool is full."""
        m = self.cache.match_prefix(self._key(req, len(req.fill_ids) - 1))
        self._lock(req, m.last_node)
        n = min(len(req.fill_ids) - int(m.indices.numel()), budget)
        req.kv_slots, req.tree_len = m.indices, int(m.indices.numel())
        slots = self._alloc(req, n)
        if slots is None:
            self._unlock(req)
            req.kv_slots, req.tree_len = req.kv_slots[:0], 0
            return None
        if req.cached_tokens is None:
            req.cached_tokens = min(req.tree_len, len(req.prompt_ids))
        req.admissions.append(req.tree_len)
        self.waiting.remove(req)
        req.state = RUNNING
        self._admit_counter += 1
        req.admit_order = self._admit_counter
        self.running.append(req)
        return ScheduledItem(req, req.fill_ids[req.computed:req.computed + n], slots)

    def commit(self, item: ScheduledItem) -> bool:
        """Record a computed item; True when the request's whole fill is computed (sample now)."""
        req = item.req
        req.kv_slots = torch.cat([req.kv_slots, item.new_slots])
        if req.computed == len(req.fill_ids):
            if req.computed - len(item.tokens) < len(req.prompt_ids):
                # its prefill just ended: share the prompt now, not when the request finishes, so the
                # requests admitted next step hit it (SGLang caches every prefilled request this way)
                self.cache_unfinished(req, prefill_done=True)
            return True
        self.cache_unfinished(req)
        return False

    def drop(self, item: ScheduledItem) -> None:
        """A step failed: hand the item's fresh slots back to its request, which the caller then
        releases without caching (their K/V may be half written)."""
        item.req.tail_slots = torch.cat([item.new_slots, item.req.tail_slots])
