"""`lrb` / `lrb-arc`: eviction that learns online which leaves will not come back soon (after LRB, Song et
al., NSDI'20, "Learning Relaxed Belady").

LRB's idea: the optimum evicts what is used again last, but any node whose next use lies beyond a *Belady
boundary* is as good a victim as the farthest one, so it is enough to learn, online, P(used again within
the boundary | what the engine knows about the node now). On the radix tree:

- Boundary W = one pool of tokens inserted (the policy's clock, as in core/cache/eviction/classic.py): the LRU
  pool's turnover. A multiple of the pool, so the same rule means the same thing on any trace.
- Samples: a node's features when it is inserted, hit, evicted, and (live leaves) once per retrain period.
  The label arrives W later: the share of the node's tokens asked for again within W. Reuse after
  eviction is observed too: an evicted node's pages are remembered for W (prefix hashes) with its pending
  samples, and an insert that brings them back labels them; LRU-trained statistics (core/cache/eviction/lhd.py)
  never see reuse later than the pool's lifetime.
- Features (known online, in pages and pools, no trace scale): length of the sequence that inserted the
  node, new pages it brought, its depth, whether it extended a cached prefix, its current size, hits since
  insert, age since last use, the last gap between two uses; log2 bins, one-hot: logistic regression over
  them is an additive model, fitted by block-coordinate Newton (no matrix solve) on the newest labels
  every quarter pool of inserts, warm-started.
- Decision ("relaxed"): a leaf whose predicted P is below DEAD is a victim before any other; within each
  class the base order decides: LRU (`lrb`) or ARC (`lrb-arc`). Ranking *every* leaf by its predicted P
  (LRB's own rule) was measured and loses to LRU on the Mooncake trace (docs/eviction.md ("A learned predictor")): the
  model separates dead leaves well but ranks the rest worse than recency does.
  Before the first model every leaf is "alive": the policies start as LRU / ARC.

Cost: hooks are O(1) per node plus O(tokens) numpy hashing on insert/evict; a key is 8 table look-ups;
training is amortised over a quarter pool of inserts. Deterministic: no randomness, leaves are sampled
in node-id order.
"""
from __future__ import annotations

import math
import zlib
from collections import OrderedDict, deque

import numpy as np

from core.cache.eviction.base import PolicyCache
from core.cache.eviction.classic import ARC
from core.cache.radix_node import TreeNode

BOUNDARY_POOLS = 1.0     # Belady boundary, in pools of inserted tokens
RETRAIN_SHARE = 0.25     # retrain every quarter pool of inserted tokens
BUFFER = 32768           # labelled samples kept for training (the newest)
BINS = 16                # log2 bins per feature
AGE_UNIT = 64            # ages and gaps in 1/64 pool before log2 binning
SWEEPS = 3               # backfitting sweeps per retrain (warm-started)
L2 = 1.0                 # ridge on the bin weights (the intercept is free)
DEAD = 0.1               # below this predicted P(reuse within the boundary) a leaf goes first
MIN_SAMPLES = 64         # train only once this many labelled samples exist, with both outcomes
FEATURES = ("seq_pages", "new_pages", "depth_pages", "extends", "size_pages", "hits", "age", "gap")
_HASH_P = np.uint64(0x9E3779B97F4A7C15)


def _bin(x: float) -> int:
    """log2 bin of a non-negative quantity: 0 for x < 1, then 1, 2, ... (capped)."""
    b = int(x).bit_length() if x >= 1 else 0
    return b if b < BINS else BINS - 1


class _PrefixHash:
    """Polynomial hashes of token prefixes (mod 2^64): a page is named by everything up to its end,
    so an evicted node's pages are recognised when a later insert brings the same prefix back."""

    def __init__(self) -> None:
        self.pow = np.ones(1, dtype=np.uint64)

    def _powers(self, lo: int, hi: int) -> np.ndarray:
        if hi > self.pow.shape[0]:
            n = max(hi, 2 * self.pow.shape[0])
            step = np.full(n, _HASH_P, dtype=np.uint64)
            step[0] = 1
            self.pow = np.cumprod(step, dtype=np.uint64)
        return self.pow[lo:hi]

    def pages(self, h0: int, start: int, ids: np.ndarray, page: int) -> np.ndarray:
        """Hashes of the prefixes ending at each page end of `ids` (which start at depth `start`)."""
        with np.errstate(over="ignore"):
            inc = np.cumsum((ids.astype(np.uint64) + np.uint64(1)) * self._powers(start, start + ids.shape[0]),
                            dtype=np.uint64)
            return np.uint64(h0) + inc[page - 1::page]


class _Sample:
    """One training example waiting for its label: features `x` at time `t`; the label is the largest share
    of its `size` tokens one request asked for again (a split node's halves add up within one request)."""

    __slots__ = ("t", "size", "label", "x", "event", "acc")

    def __init__(self, t: int, size: int, x: tuple) -> None:
        self.t, self.size, self.label, self.x, self.event, self.acc = t, size, 0.0, x, -1, 0


class LRB(ARC):
    name = "lrb"
    description = ("learned relaxed Belady: a model trained online on delayed labels (were the node's "
                   "pages, evicted or not, asked for again within a pool?) evicts predicted-dead leaves "
                   "first, then least recently used")

    boundary_pools = BOUNDARY_POOLS     # class attributes, so a benchmark can vary them per run
    dead = DEAD

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.cache = cache
        self.page = max(1, int(cache.page_size))
        self.window = max(1, int(self.boundary_pools * self.capacity))
        self.unit = max(1, self.capacity // AGE_UNIT)
        self.period = max(1, int(RETRAIN_SHARE * self.capacity))
        self.next_update = self.period
        self.hasher = _PrefixHash()
        self.pending: deque = deque()               # samples in time order, label not final
        self.ghosts: OrderedDict = OrderedDict()    # first-page hash -> (evict time, page hashes, samples)
        self.X = np.zeros((BUFFER, len(FEATURES)), dtype=np.int32)
        self.y = np.zeros(BUFFER)
        self.n = 0                                  # labelled samples written so far (ring buffer)
        self.table = [0.0] * (len(FEATURES) * BINS)
        self.bias = 0.0
        self.trained = False
        self.dead_logit = math.log(self.dead / (1.0 - self.dead))
        self.trainings = 0
        self.event = 0

    # ----- features ----------------------------------------------------------------------------
    def _features(self, node: "TreeNode") -> tuple:
        """Column indices of the node's bins, one per feature (FEATURES order)."""
        age = (self.clock - node.ev_time) // self.unit
        return node.ev_static + (
            4 * BINS + _bin(len(node.key) // self.page),
            5 * BINS + (node.ev_hits if node.ev_hits < BINS else BINS - 1),
            6 * BINS + _bin(age),
            7 * BINS + (0 if node.ev_gap < 0 else min(_bin(node.ev_gap // self.unit) + 1, BINS - 1)),
        )

    def _sample(self, node: "TreeNode") -> None:
        s = _Sample(self.clock, len(node.key), self._features(node))
        node.ev_samples.append(s)
        self.pending.append(s)

    def _credit(self, samples: list, tokens: int) -> list:
        """Credit `tokens` asked for again (by request event self.event) to every sample still inside its
        window; returns those (the expired ones are final and leave the node)."""
        kept, now, window, event = [], self.clock, self.window, self.event
        for s in samples:
            if now - s.t <= window:
                s.acc = s.acc + tokens if s.event == event else tokens
                s.event = event
                share = s.acc / s.size
                if share > s.label:
                    s.label = share if share < 1.0 else 1.0
                kept.append(s)
        return kept

    # ----- hooks -------------------------------------------------------------------------------
    def admit(self, node: "TreeNode") -> None:
        parent = node.parent
        root = parent.parent is None
        page = self.page
        start = node.ev_start
        node.ev_h0 = (zlib.crc32(node.key.extra_key.encode("utf-8", "surrogatepass")) if
                      node.key.extra_key is not None else 0) if root else parent.ev_h1
        node.ev_gap = -1
        node.ev_static = (_bin((start + len(node.key)) // page), BINS + _bin(len(node.key) // page),
                          2 * BINS + _bin(start // page), 3 * BINS + (0 if root else 1))
        node.ev_samples = []
        hashes = self.hasher.pages(node.ev_h0, start, node.key.token_ids, page)
        node.ev_h1 = int(hashes[-1]) if hashes.shape[0] else node.ev_h0
        if self.ghosts:
            self._ghost_hits(hashes)
        self._sample(node)
        super().admit(node)

    def _ghost_hits(self, hashes: np.ndarray) -> None:
        """Pages of evicted nodes come back with this insert: label their samples."""
        ghosts = self.ghosts
        self.event += 1
        for j, h in enumerate(hashes.tolist()):
            g = ghosts.pop(h, None)
            if g is None:
                continue
            _, pages, samples = g
            m = min(pages.shape[0], hashes.shape[0] - j)
            same = pages[:m] == hashes[j:j + m]
            run = m if same.all() else int(np.argmin(same))
            self._credit(samples, run * self.page)

    def hit(self, node: "TreeNode") -> None:
        node.ev_samples = self._credit(node.ev_samples, len(node.key))
        node.ev_gap = self.clock - node.ev_time
        # ev_hits / ev_time are updated by Tracked after this call: sample with the new values
        node.ev_hits += 1
        node.ev_time = self.clock
        self._sample(node)
        node.ev_hits -= 1
        super().hit(node)

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        super().split(head, tail)
        head.ev_static, head.ev_gap = tail.ev_static, tail.ev_gap
        head.ev_samples = list(tail.ev_samples)   # both halves answer for the samples of the whole
        head.ev_h0 = tail.ev_h0
        hashes = self.hasher.pages(head.ev_h0, head.ev_start, head.key.token_ids, self.page)
        head.ev_h1 = tail.ev_h0 = int(hashes[-1])

    def on_evict(self, node: "TreeNode") -> None:
        self._sample(node)
        hashes = self.hasher.pages(node.ev_h0, node.ev_start, node.key.token_ids, self.page)
        if hashes.shape[0]:
            first = int(hashes[0])
            self.ghosts.pop(first, None)
            self.ghosts[first] = (self.clock, hashes, node.ev_samples)
        node.ev_samples = []
        super().on_evict(node)

    def on_match(self, path, now: float) -> None:
        self.event += 1           # one request: the halves of a split node add up in its samples' labels
        super().on_match(path, now)

    def on_insert(self, node: "TreeNode", now: float) -> None:
        super().on_insert(node, now)
        if self.clock >= self.next_update:    # on insert, not in begin_evict: eviction_order changes nothing
            self._update()

    # ----- learning ----------------------------------------------------------------------------
    def _update(self) -> None:
        self.next_update = self.clock + self.period
        for leaf in sorted(self.cache.evictable_leaves, key=lambda n: n.id):
            if hasattr(leaf, "ev_samples"):
                self._sample(leaf)
        now, window, pending = self.clock, self.window, self.pending
        while pending and now - pending[0].t > window:
            s = pending.popleft()
            i = self.n % BUFFER
            self.X[i] = s.x
            self.y[i] = s.label
            self.n += 1
        while self.ghosts:
            first = next(iter(self.ghosts))
            if now - self.ghosts[first][0] <= window:
                break
            del self.ghosts[first]
        self._train()

    def _train(self) -> None:
        """L2-regularised logistic regression on one-hot bins by block-coordinate Newton (backfitting):
        a feature's bins never co-occur, so its block of the Hessian is diagonal and each step is two
        bincounts. No matrix solve: no LAPACK threads on a shared CPU, and exact for each block."""
        m = min(self.n, BUFFER)
        y = self.y[:m]
        if m < MIN_SAMPLES or y.max() <= 0.0 or y.min() >= 1.0:
            return
        cols = self.X[:m].astype(np.int64)
        w = np.array([self.bias] + self.table)
        z = w[0] + w[1:][cols].sum(axis=1)
        for _ in range(SWEEPS):
            for f in range(-1, len(FEATURES)):
                p = 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))
                if f < 0:
                    step = (p - y).sum() / max(float((p * (1.0 - p)).sum()), 1e-9)
                    w[0] -= step
                    z -= step
                    continue
                c = cols[:, f] - f * BINS
                g = np.bincount(c, p - y, BINS) + L2 * w[1 + f * BINS: 1 + (f + 1) * BINS]
                h = np.bincount(c, p * (1.0 - p), BINS) + L2
                step = g / h
                w[1 + f * BINS: 1 + (f + 1) * BINS] -= step
                z -= step[c]
        if not np.all(np.isfinite(w)):
            return
        self.bias = float(w[0])
        self.table = w[1:].tolist()
        self.trained = True
        self.trainings += 1

    def score(self, node: "TreeNode") -> float:
        """Log-odds that the node is used again within the boundary (0 before the first model)."""
        if not self.trained:
            return 0.0
        t = self.table
        return self.bias + sum(t[i] for i in self._features(node))

    def probability(self, node: "TreeNode") -> float:
        """Predicted P(the node's tokens are asked for again within the boundary)."""
        return 1.0 / (1.0 + math.exp(-self.score(node)))

    def key(self, node: "TreeNode") -> tuple:
        return (self.score(node) >= self.dead_logit, node.last_access_time)


class LRBARC(LRB):
    name = "lrb-arc"
    description = ("lrb's learned dead-first rule over arc: leaves predicted unlikely to return within a "
                   "pool go first, then ARC's order")

    def key(self, node: "TreeNode") -> tuple:
        return (self.score(node) >= self.dead_logit, node.ev_list != self.first, node.last_access_time)

