"""Routing in the lab: N replicas, each its own radix cache, behind a model of SGLang's router.

A router never asks a replica what it holds. `sglang-router`'s `cache_aware` policy keeps an
*approximate* tree of what it sent where (the prompts only, never outputs), and per request:

    if the loads are imbalanced ((max - min) > balance_abs_threshold and
                                 max > balance_rel_threshold * min):  send to the least loaded
    else: match the prompt against the tree; if matched / prompt > cache_threshold, send it to
          the worker holding that match, else to the least loaded worker (the first one in the
          router's worker list among equals: sglang-router 0.3, read in its source and seen
          running it), or, in older sglang-router releases, to the worker with the smallest tree;
    then insert the prompt into the tree under the chosen worker.

A load is the number of requests in flight at that worker. Without timestamps every request
ends before the next arrives, so every load is 0 and a miss always goes to the first worker:
with sequential traffic sglang-router 0.3 sends all of it to one replica.

So routing is a function of the request sequence alone (and of the loads, which depend only on
timestamps and modeled durations), not of what the caches really kept. `route` computes the
assignment; `replay_routed` then replays each replica's share through the real RadixCache with
`core.lab.replay.replay`, so every eviction policy and page size work as in a single-cache replay.

Units: the real router matches characters of the request text; here a request is matched by
its token ids (or, for block traces, by block hash ids weighted by the block size). `route_texts`
matches characters exactly as the router does, for workloads whose text is known.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from core.lab.page_trace import Overlap
from core.lab.replay import ReplayResult, replay
from core.lab.workloads import TraceRequest, Workload

ROUTING_POLICIES = ("round_robin", "cache_aware", "prefix_hash", "least_load")
DESCRIPTIONS = {
    "round_robin": "request i goes to replica i mod N (sglang-router round_robin)",
    "cache_aware": "sglang-router cache_aware: approximate prefix tree per worker, cache and balance thresholds",
    "prefix_hash": "the first prefix_tokens tokens hashed to a replica (session/prefix affinity)",
    "least_load": "the replica with the fewest requests in flight (ties: fewest routed so far)",
}
MISS_POLICIES = ("min_load", "smallest_tree")
_P = np.uint64(0x9E3779B97F4A7C15)          # odd: invertible mod 2**64
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))


@dataclass(frozen=True)
class RouterConfig:
    """The router's knobs, with sglang-router 0.3's defaults (`launch_router --help`)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    prefix_tokens: int = 256            # prefix_hash: how much of the prompt picks the replica
    miss_policy: str = "min_load"       # cache_aware below the threshold: "min_load" or "smallest_tree"

    def __post_init__(self) -> None:
        if not (isinstance(self.cache_threshold, (int, float)) and 0 <= self.cache_threshold <= 1):
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold!r}")
        if isinstance(self.balance_abs_threshold, bool) or not isinstance(self.balance_abs_threshold, int) \
                or self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be an integer >= 0, got {self.balance_abs_threshold!r}")
        if not (isinstance(self.balance_rel_threshold, (int, float)) and self.balance_rel_threshold >= 1):
            raise ValueError(f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold!r}")
        if isinstance(self.prefix_tokens, bool) or not isinstance(self.prefix_tokens, int) or self.prefix_tokens < 1:
            raise ValueError(f"prefix_tokens must be an integer >= 1, got {self.prefix_tokens!r}")
        if self.miss_policy not in MISS_POLICIES:
            raise ValueError(f"miss_policy must be one of {', '.join(MISS_POLICIES)}, got {self.miss_policy!r}")


def check_routing(policy: str) -> str:
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}; choose one of: {', '.join(ROUTING_POLICIES)}")
    return policy


def prefix_keys(units: np.ndarray) -> list[int]:
    """One 64-bit key per prefix of `units` (key i names units[:i+1]), vectorised: the polynomial
    hash h_i = sum_j u_j P^(i-j) mod 2^64 is P^i * cumsum(u_j P^-j). Equal prefixes, equal keys."""
    u = np.asarray(units, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    n = u.shape[0]
    if n == 0:
        return []
    with np.errstate(over="ignore"):
        pw = np.cumprod(np.full(n, _P, dtype=np.uint64))
        inv = np.cumprod(np.full(n, _P_INV, dtype=np.uint64))
        h = pw * np.cumsum(u * inv, dtype=np.uint64)
    return h.tolist()


class ApproxTree:
    """The router's multi-tenant prefix tree, as a prefix-closed map key -> {worker: last access}.

    Inserting a sequence adds all its prefixes, so "is prefix i present" is monotone in i and the
    longest match is a binary search. A worker's size is the number of units it holds (the router
    counts characters), which is what `smallest_worker` compares."""

    def __init__(self, workers: int) -> None:
        self.nodes: dict[int, dict[int, int]] = {}
        self.size = [0] * workers
        self._clock = 0

    def prefix_match(self, keys: Sequence[int]) -> tuple[int, Optional[int]]:
        """(units matched, the worker holding them: the most recent one among those that do)."""
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if keys[mid - 1] in self.nodes:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return 0, None
        owners = self.nodes[keys[lo - 1]]
        return lo, max(owners, key=lambda w: (owners[w], -w))

    def insert(self, keys: Sequence[int], worker: int) -> None:
        self._clock += 1
        t = self._clock
        for k in keys:
            owners = self.nodes.get(k)
            if owners is None:
                self.nodes[k] = {worker: t}
                self.size[worker] += 1
            else:
                if worker not in owners:
                    self.size[worker] += 1
                owners[worker] = t

    def smallest_worker(self) -> int:
        return min(range(len(self.size)), key=lambda w: (self.size[w], w))


def _units(r: TraceRequest) -> tuple[np.ndarray, int]:
    """What the router matches a request by, and how many tokens one unit stands for."""
    if r.hash_ids is not None:
        return r.hash_ids, r.block_size
    return r.prompt_ids(), 1


def _in_flight(workload: Workload, overlap: Optional[Overlap], concurrency: Optional[int]) -> list[np.ndarray]:
    """Per request: the indices of earlier requests still running when it arrives.

    With `concurrency` c (a closed-loop client of c workers, as a load generator runs), the c-1
    requests before it are in flight; with `overlap`, those whose modeled duration covers its
    timestamp; with neither, none: each request ends before the next one arrives."""
    n = len(workload)
    if concurrency is not None:
        return [np.arange(max(0, i - concurrency + 1), i, dtype=np.int64) for i in range(n)]
    if overlap is None:
        return [np.empty(0, dtype=np.int64)] * n
    starts = np.array([r.timestamp for r in workload.requests], dtype=np.float64)
    ends = starts + np.array([overlap.duration_ms(r.prompt_len, r.output_len) for r in workload.requests])
    return [np.flatnonzero(ends[:i] > starts[i]) for i in range(n)]


def _hash_worker(units: np.ndarray, weight: int, prefix_tokens: int, workers: int) -> int:
    take = max(1, -(-prefix_tokens // weight))
    digest = hashlib.blake2b(np.asarray(units[:take], dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % workers


def route(workload: Workload, replicas: int, policy: str = "cache_aware", config: RouterConfig = RouterConfig(),
          overlap: Optional[Overlap] = None, keys: Optional[list[list[int]]] = None,
          concurrency: Optional[int] = None) -> list[int]:
    """The replica each request goes to, in arrival order. `keys` override what the cache_aware
    tree matches by (route_texts passes character keys); loads come from `concurrency` or `overlap`."""
    check_routing(policy)
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if concurrency is not None and overlap is not None:
        raise ValueError("give concurrency (a closed-loop client) or overlap (timestamps), not both")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    if overlap is not None and not workload.has_timestamps:
        raise ValueError("routing with overlap needs a timestamp on every request")
    reqs = workload.requests
    flight = _in_flight(workload, overlap, concurrency)
    out: list[int] = []
    routed = np.zeros(replicas, dtype=np.int64)
    tree = ApproxTree(replicas) if policy == "cache_aware" else None
    for i, r in enumerate(reqs):
        load = np.bincount(np.asarray(out, dtype=np.int64)[flight[i]], minlength=replicas) if out else \
            np.zeros(replicas, dtype=np.int64)
        first_free = int(np.argmin(load))                                   # the router's min_by_key
        least = int(np.lexsort((np.arange(replicas), routed, load))[0])     # ties: fewest routed so far
        if policy == "round_robin":
            w = i % replicas
        elif policy == "least_load":
            w = least
        elif policy == "prefix_hash":
            units, weight = _units(r)
            w = _hash_worker(units, weight, config.prefix_tokens, replicas)
        else:
            k = keys[i] if keys is not None else prefix_keys(_units(r)[0])
            hi, lo = int(load.max()), int(load.min())
            if hi - lo > config.balance_abs_threshold and hi > lo * config.balance_rel_threshold:
                w = first_free
            else:
                matched, owner = tree.prefix_match(k)
                rate = matched / len(k) if k else 0.0
                if owner is not None and rate > config.cache_threshold:
                    w = owner
                else:
                    w = first_free if config.miss_policy == "min_load" else tree.smallest_worker()
            tree.insert(k, w)
        out.append(w)
        routed[w] += 1
    return out


def route_texts(workload: Workload, texts: Sequence[str], replicas: int, policy: str = "cache_aware",
                config: RouterConfig = RouterConfig(), overlap: Optional[Overlap] = None,
                concurrency: Optional[int] = None) -> list[int]:
    """`route` with the cache_aware tree keyed by characters of each request's text, as the HTTP
    router does (`/v1/completions` routes by its prompt string)."""
    if len(texts) != len(workload):
        raise ValueError(f"{len(texts)} texts for {len(workload)} requests")
    keys = [prefix_keys(np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)) for t in texts]
    return route(workload, replicas, policy, config, overlap, keys=keys, concurrency=concurrency)


@dataclass
class RoutedResult:
    replicas: int
    routing: str
    policy: str
    capacity_tokens: int                 # per replica
    page_size: int
    assignment: list[int]
    per_replica: list[Optional[ReplayResult]] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.per_replica if r is not None)

    @property
    def hit_tokens(self) -> int:
        return sum(r.hit_tokens for r in self.per_replica if r is not None)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def rejected(self) -> int:
        """Requests larger than their replica's pool (or than what running requests left): never served."""
        return sum(r.rejected for r in self.per_replica if r is not None)

    def requests_per_replica(self) -> list[int]:
        return np.bincount(np.asarray(self.assignment, dtype=np.int64), minlength=self.replicas).tolist()

    def load_imbalance(self) -> float:
        """max / mean prompt tokens per replica: 1.0 is perfectly even."""
        toks = [0 if r is None else r.prompt_tokens for r in self.per_replica]
        mean = sum(toks) / len(toks)
        return max(toks) / mean if mean else 1.0

    def to_dict(self) -> dict:
        return {"replicas": self.replicas, "routing": self.routing, "policy": self.policy,
                "capacity_tokens": self.capacity_tokens, "page_size": self.page_size,
                "hit_rate": self.hit_rate, "hit_tokens": self.hit_tokens, "prompt_tokens": self.prompt_tokens,
                "requests_per_replica": self.requests_per_replica(),
                "hit_tokens_per_replica": [0 if r is None else r.hit_tokens for r in self.per_replica],
                "hit_rate_per_replica": [0.0 if r is None else r.hit_rate for r in self.per_replica],
                "load_imbalance": self.load_imbalance(), "rejected": self.rejected,
                "rejected_per_replica": [0 if r is None else r.rejected for r in self.per_replica]}


def split(workload: Workload, assignment: Sequence[int], replicas: int) -> list[Optional[Workload]]:
    """Each replica's share of the workload, in arrival order (None for a replica that got nothing)."""
    shares: list[list[TraceRequest]] = [[] for _ in range(replicas)]
    for r, w in zip(workload.requests, assignment):
        shares[w].append(r.copy())
    return [Workload(f"{workload.name}@replica{w}", s, dict(workload.params)) if s else None
            for w, s in enumerate(shares)]


def replay_routed(workload: Workload, capacity_tokens: int, replicas: int, routing: str = "cache_aware",
                  policy: str = "lru", page_size: int = 1, overlap: Optional[Overlap] = None,
                  config: RouterConfig = RouterConfig(), assignment: Optional[Sequence[int]] = None) -> RoutedResult:
    """Route the workload over `replicas` caches of `capacity_tokens` each and replay every share."""
    assign = list(assignment) if assignment is not None else route(workload, replicas, routing, config, overlap)
    res = RoutedResult(replicas, routing, policy, int(capacity_tokens), page_size, assign)
    res.per_replica = [None if share is None else replay(share, capacity_tokens, policy, page_size, overlap)
                       for share in split(workload, assign, replicas)]
    return res
