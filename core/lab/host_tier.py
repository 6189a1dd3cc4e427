"""A host-memory tier behind the device pool, as SGLang's HiCache (`--enable-hierarchical-cache`).

The device pool is the replay's RadixCache, unchanged; the host tier watches it through the replay's
`host` seam (`core.lab.replay.HostTier`, page ids) and holds copies of pages (a page = a whole page of tokens *with its whole prefix*,
the identity `core.lab.page_trace` uses):

- writes, by `--hicache-write-policy`:
  write_through: a page is copied to host when it enters the device tree;
  write_through_selective: when it is used the second time (placed once, then hit once on device:
  SGLang's write_through_threshold of 2);
  write_back: only when the device evicts it.
  A page the device evicts without a host copy is gone.
- a write into a full host replaces the least recently used host page that is no longer on the
  device (SGLang's evict_host only drops pages whose device copy is gone), provided that page was
  used before the one being written; otherwise the write is dropped. "Used" = placed on the device,
  hit on the device, or hit on host; recency ties (pages of one request) go deepest page first.
- a request first matches its prompt on the device; the pages right after the device match that
  are on host are host hits: loaded back (SGLang's load_back) into device slots the request
  allocates anyway, so the device side (its evictions, its hits) is the same as without the tier.
  If the request is then rejected (no room), nothing it found counts.

Recency: one tick per arrival (on_arrive) and per placement (on_insert).

The estimate of time (`ttft`) is per request, each alone: prefill of the tokens not hit at `prefill_tokens_per_s`, plus moving the host hits over the
host link at `bandwidth_gbps` (serial; SGLang overlaps the load with compute layer by layer, so
the real TTFT is lower, between the two).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional

import numpy as np

from core.cache.eviction.registry import is_stateful
from core.lab.page_trace import Overlap
from core.lab.replay import ReplayResult, check_page_size, replay
from core.lab.units import ModelKV
from core.lab.workloads import Workload

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DEFAULT_BANDWIDTH_GBPS = 25.0          # host -> device, effective: PCIe 4.0 x16 in practice (5.0 x16: ~50)
DEFAULT_PREFILL_TOKENS_PER_S = 10_000  # an 8B model on one H100-class GPU, order of magnitude: measure yours
SELECTIVE_THRESHOLD = 2


def check_write_policy(name: str) -> str:
    if name not in WRITE_POLICIES:
        raise ValueError(f"unknown host write policy {name!r}; choose one of: {', '.join(WRITE_POLICIES)}")
    return name


class HostTier:
    """The replay's `host` seam (`core.lab.replay.HostTier`, page ids): see the module docstring.
    Counts per request."""

    def __init__(self, workload: Workload, page_size: int, host_pages: int,
                 write_policy: str = "write_through") -> None:
        if isinstance(host_pages, bool) or not isinstance(host_pages, (int, np.integer)) or host_pages < 0:
            raise ValueError(f"host capacity must be a whole number of pages >= 0, got {host_pages!r}")
        self.policy = check_write_policy(write_policy)
        self.ps = page_size
        self.capacity = int(host_pages)
        self.requests = len(workload)
        self.begin(workload)

    def begin(self, workload: Workload) -> None:
        """Empty the tier for a replay of `workload` (the replay calls this first). New arrays, not zeroed
        ones: a HostTierResult of an earlier replay keeps its own."""
        if len(workload) != self.requests:
            raise ValueError(f"this host tier counts {self.requests} requests but the workload has "
                             f"{len(workload)}; make a HostTier for each workload")
        self.on_device: set[int] = set()
        self.host: dict[int, tuple[int, int]] = {}     # page -> (last use, -depth): its recency key
        self.last: dict[int, tuple[int, int]] = {}     # every page's recency key
        self.uses: dict[int, int] = {}
        self.heap: list[tuple[int, int, int]] = []     # (last use, -depth, page) of host pages off the device
        self.t = 0
        n = self.requests
        self.device_hits = np.zeros(n, dtype=np.int64)     # tokens
        self.host_hits = np.zeros(n, dtype=np.int64)
        self.rejected = np.zeros(n, dtype=bool)
        self.writes = self.dropped_writes = self.host_evictions = self.lost = 0
        self._request = -1              # the request being matched: on_arrive, then match
        self._depth = 0                 # its device hit, in pages
        self._loading: list[int] = []   # its host hits, being loaded back (undone if it is rejected)

    # ----- recency and writes --------------------------------------------------------------------
    def _touch(self, page: int, depth: int) -> None:
        key = (self.t, -depth)
        self.last[page] = key
        if page in self.host:
            self.host[page] = key

    def _off_device(self, page: int) -> None:
        self.on_device.discard(page)
        if page in self.host:
            k = self.host[page]
            heapq.heappush(self.heap, (k[0], k[1], page))

    def _victim(self) -> Optional[tuple[int, int, int]]:
        heap = self.heap
        while heap:
            t, d, p = heap[0]
            if p in self.host and p not in self.on_device and self.host[p] == (t, d):
                return heap[0]
            heapq.heappop(heap)
        return None

    def _write(self, page: int) -> None:
        if page in self.host or self.capacity == 0:
            if page not in self.host:
                self.dropped_writes += 1
            return
        key = self.last[page]
        if len(self.host) >= self.capacity:
            v = self._victim()
            if v is None or (v[0], v[1]) > key:
                self.dropped_writes += 1
                return
            heapq.heappop(self.heap)
            del self.host[v[2]]
            self.host_evictions += 1
        self.host[page] = key
        self.writes += 1
        if page not in self.on_device:
            heapq.heappush(self.heap, (key[0], key[1], page))

    def _used(self, page: int) -> None:
        u = self.uses.get(page, 0) + 1
        self.uses[page] = u
        if self.policy == "write_through_selective" and u >= SELECTIVE_THRESHOLD:
            self._write(page)

    # ----- the seam (called by core.lab.replay, page level) -------------------------------------------
    def on_arrive(self, i: int, page_ids: np.ndarray) -> None:
        """Request i arrived; the device matched these prompt pages: touch them (a device use)."""
        self.t += 1
        self._request, self._depth, self._loading = i, len(page_ids), []
        for k, p in enumerate(page_ids.tolist()):
            self._touch(p, k)
            self._used(p)
        self.device_hits[i] = len(page_ids) * self.ps
        self.host_hits[i] = 0

    def match(self, page_ids: np.ndarray) -> int:
        """The prompt pages after the device match: how many, from the first, the host serves. They are
        loaded back, so they are on the device (not host victims) from now."""
        for k, p in enumerate(page_ids.tolist(), self._depth):
            if p not in self.host or p in self.on_device:
                break
            self._touch(p, k)
            self.on_device.add(p)
            self._loading.append(p)
        self.host_hits[self._request] = len(self._loading) * self.ps
        return len(self._loading)

    def on_reject(self, i: int) -> None:
        """The request found no room: what it hit does not count, its loads are undone."""
        for p in self._loading:
            self._off_device(p)
        self._loading = []
        self.device_hits[i] = self.host_hits[i] = 0
        self.rejected[i] = True

    def on_insert(self, i: int, page_ids: np.ndarray, depth: int) -> None:
        """These pages of request i (the first at `depth`) entered the device tree."""
        self.t += 1
        for k, p in enumerate(page_ids.tolist(), depth):
            self.on_device.add(p)
            self._touch(p, k)
            self.uses.setdefault(p, 0)
            self._used(p)
            if self.policy == "write_through":
                self._write(p)

    def on_evict(self, page_ids: np.ndarray) -> None:
        """The device evicted these pages (one node's, in order)."""
        for p in page_ids.tolist():
            if self.policy == "write_back":
                self._write(p)
            if p not in self.host:
                self.lost += 1
            self._off_device(p)


@dataclass
class HostTierResult:
    """A replay with a host tier: the device's own result plus what the host added."""

    device: ReplayResult
    host_pages: int
    write_policy: str
    device_hits: np.ndarray       # tokens per request
    host_hits: np.ndarray
    prompt_lens: np.ndarray
    rejected: np.ndarray
    host_writes: int
    host_evictions: int
    dropped_writes: int

    @property
    def page_size(self) -> int:
        return self.device.page_size

    @property
    def device_hit_tokens(self) -> int:
        return int(self.device_hits.sum())

    @property
    def host_hit_tokens(self) -> int:
        return int(self.host_hits.sum())

    @property
    def miss_tokens(self) -> int:
        return int(self.prompt_lens.sum()) - self.device_hit_tokens - self.host_hit_tokens

    def summary(self) -> dict:
        pt = int(self.prompt_lens.sum())
        return {"policy": self.device.policy, "device_tokens": self.device.capacity_tokens,
                "host_tokens": self.host_pages * self.page_size, "write_policy": self.write_policy,
                "prompt_tokens": pt, "device_hit_tokens": self.device_hit_tokens,
                "host_hit_tokens": self.host_hit_tokens, "miss_tokens": self.miss_tokens,
                "device_hit_rate": self.device_hit_tokens / pt, "host_hit_rate": self.host_hit_tokens / pt,
                "hit_rate": (self.device_hit_tokens + self.host_hit_tokens) / pt,
                "host_writes_pages": self.host_writes, "host_evictions_pages": self.host_evictions,
                "dropped_writes_pages": self.dropped_writes, "rejected": int(self.rejected.sum())}

    def ttft(self, kv: ModelKV, prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
             bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS) -> dict:
        """Estimated prefill seconds and time to first token per request (p50 / p99), device only vs with
        the host tier (see the module docstring). Rejected requests are left out; with none served, the
        percentiles are None (not 0 s, which would read as the best latency)."""
        for name, v in (("prefill rate", prefill_tokens_per_s), ("host bandwidth", bandwidth_gbps)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise ValueError(f"the {name} must be a positive number, got {v!r}")
        ok = ~self.rejected
        lens, dev, host = self.prompt_lens[ok], self.device_hits[ok], self.host_hits[ok]
        device_only = (lens - dev) / prefill_tokens_per_s
        load = host * kv.bytes_per_token / (bandwidth_gbps * 1e9)
        tiered = (lens - dev - host) / prefill_tokens_per_s + load
        pct = (lambda a, q: float(np.percentile(a, q)) if a.size else None)
        return {"requests": int(ok.sum()), "prefill_tokens_per_s": prefill_tokens_per_s,
                "bandwidth_gbps": bandwidth_gbps, "load_seconds": float(load.sum()),
                "prefill_seconds_device_only": float(device_only.sum()),
                "prefill_seconds_with_host": float(tiered.sum()),
                "prefill_seconds_saved": float(device_only.sum() - tiered.sum()),
                "ttft_p50_device_only": pct(device_only, 50), "ttft_p99_device_only": pct(device_only, 99),
                "ttft_p50_with_host": pct(tiered, 50), "ttft_p99_with_host": pct(tiered, 99)}


def host_tier_refusal(policies: list[str], page_size: int) -> str:
    """Why `policies` (stateful ones) get no host-tier replay at `page_size` > 1."""
    return (f"no host-tier replay for {', '.join(policies)} at page size {page_size}: the host tier replays by "
            f"page, and a stateful policy names nodes by their first units, so by page it is not what the "
            f"engine's cache does; use --page-size 1 or a stateless policy (lru, lfu, fifo, slru, ...)")


def replay_with_host(workload: Workload, capacity_tokens: int, host_tokens: int, policy: str = "lru",
                     page_size: int = 1, overlap: Optional[Overlap] = None,
                     write_policy: str = "write_through", check_invariants: bool = False) -> HostTierResult:
    """Replay `workload` through a device pool of `capacity_tokens` with a host tier of `host_tokens`.

    The host tier rides on the page-level replay, which is exact for every policy at page size 1 and for the
    stateless ones at any page size; a stateful policy (arc, s3fifo, recall, ...) names nodes by their first
    units, so by page it would not be what the engine's cache does, and is refused there."""
    if isinstance(host_tokens, bool) or not isinstance(host_tokens, (int, np.integer)) or host_tokens < 0:
        raise ValueError(f"host capacity must be a whole number of tokens >= 0, got {host_tokens!r}")
    check_page_size(page_size)
    if page_size > 1 and is_stateful(policy):
        raise ValueError(host_tier_refusal([policy], page_size))
    tier = HostTier(workload, page_size, int(host_tokens) // page_size, write_policy)
    dev = replay(workload, capacity_tokens, policy, page_size, overlap, check_invariants, level="page", host=tier)
    return HostTierResult(dev, tier.capacity, write_policy, tier.device_hits, tier.host_hits,
                          np.array([r.prompt_len for r in workload.requests], dtype=np.int64), tier.rejected,
                          tier.writes, tier.host_evictions, tier.dropped_writes)
