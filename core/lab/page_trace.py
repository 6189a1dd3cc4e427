"""A workload seen at page granularity: the order in which requests touch cache pages.

A page is a run of `page_size` tokens *together with everything before it*: page k of a request is
identified by the whole prefix up to and including it, exactly as a node path in the radix tree.
Two requests share page k only when their first (k+1)*page_size tokens are equal.

Each request touches its pages at two moments, which is also what the replay does:
- on arrival, the whole pages of its prompt; those before its last token count (a cached page is a hit),
  as the engine matches (matchable_pages: it always computes a prompt's last token);
- on finish, the further whole pages of prompt + output - 1 (what `cache_finished_req` inserts);
  these do not count as hits, they only make the pages available to later requests.

`event_order` gives the moments in time order; without overlap every request arrives and
finishes before the next one arrives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from core.lab.workloads import Workload

ARRIVE, FINISH = 0, 1


@dataclass(frozen=True)
class Overlap:
    """Timestamp overlap: request i runs from its timestamp for a modeled duration, holding its locks.

    duration_ms = fixed_ms + ms_per_prompt_token * prompt_len + ms_per_output_token * output_len.
    The duration depends on the request only (not on what the cache held), so every policy and the
    optimum see the same order of arrivals and finishes.
    """

    ms_per_output_token: float = 20.0
    ms_per_prompt_token: float = 0.0
    fixed_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ms_per_output_token", "ms_per_prompt_token", "fixed_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and np.isfinite(v)):
                raise ValueError(f"Overlap.{name} must be a non-negative number, got {v!r}")

    def duration_ms(self, prompt_len: int, output_len: int) -> float:
        return self.fixed_ms + self.ms_per_prompt_token * prompt_len + self.ms_per_output_token * output_len


# why no pool hits anything when the infinite pool hits nothing: the counting rule of matchable_pages
NO_HITS_NOTE = ("no whole page before a prompt's last token repeats (the rule the engine counts hits by): "
                "no pool hits anything")


def matchable_pages(prompt_len: int, page_size: int) -> int:
    """Whole pages of a prompt that a prefix match may cover: those before its last token. The engine, as SGLang
    (`max_prefix_len = len(fill_ids) - 1`), always computes a prompt's last token, whose logits it samples from,
    so a prompt cached whole hits one token less, and at pages of P a whole page less when its length is a
    multiple of P."""
    return max(0, prompt_len - 1) // page_size


def require_timestamps(workload: Workload) -> None:
    """ValueError unless every request has a timestamp (what an overlap replay orders by), saying how many lack
    one and where a timestamp comes from."""
    missing = sum(r.timestamp is None for r in workload.requests)
    if missing:
        raise ValueError(f"overlap replay needs a timestamp on every request; {missing:,} of {len(workload):,} have "
                         f"none (a trace: a \"timestamp\" on every line; a generated workload: a request_rate), or "
                         f"replay without overlap")


def event_order(workload: Workload, overlap: Optional[Overlap]) -> list[tuple[int, int]]:
    """(kind, request index) in time order; kind is ARRIVE or FINISH.

    With overlap, a finish at the same time as an arrival goes first (its slots are free again),
    and ties keep arrival order. A request that takes no time (no output, no cost per prompt token)
    finishes right after its own arrival, never before it (it would hold its pages forever).
    """
    n = len(workload)
    if overlap is None:
        return [(k, i) for i in range(n) for k in (ARRIVE, FINISH)]
    require_timestamps(workload)
    starts = np.array([r.timestamp for r in workload.requests], dtype=np.float64)
    ends = starts + np.array([overlap.duration_ms(r.prompt_len, r.output_len) for r in workload.requests])
    times = np.concatenate([ends, starts])
    kinds = np.concatenate([np.full(n, FINISH), np.full(n, ARRIVE)])
    idx = np.concatenate([np.arange(n), np.arange(n)])
    # at equal times: finishes of requests that ran, then arrivals, then finishes of zero-time requests
    group = np.where(kinds == ARRIVE, 1, np.where(np.concatenate([ends > starts, np.zeros(n, bool)]), 0, 2))
    order = np.lexsort((idx, group, times))
    return [(int(kinds[j]), int(idx[j])) for j in order]


@dataclass
class PageTrace:
    """The page accesses of a workload in time order (numpy arrays of one length), and per request its
    page ids (what the page-level replay keys the radix tree with)."""

    page_size: int
    pages: np.ndarray        # int64 page id of each access
    counted: np.ndarray      # bool: a matchable prompt page on arrival (its hit counts)
    depth: np.ndarray        # int64 position of the page in its request (0 = first page)
    prompt_tokens: int       # all prompt tokens of the workload (the hit-rate denominator)
    num_distinct: int        # distinct pages touched
    max_request_pages: int   # most pages one request caches (prompt + output - 1, whole pages)
    requests: Optional[list] = None   # per request: (int64 ids of its whole cached pages, prompt pages)
    need: Optional[np.ndarray] = None  # int64 per access: the pages its request holds while it runs (rounded up):
    #                                    a pool of fewer pages rejects that request under every policy

    def __len__(self) -> int:
        return int(self.pages.shape[0])


class _PageIds:
    """Gives each distinct (parent page, page content) a small integer id, i.e. a trie of pages: an id
    names a page *and its whole prefix*, so equal ids at any position mean an identical prefix."""

    def __init__(self) -> None:
        self.ids: dict = {}
        self.roots: dict = {}
        self.count = 0

    def root(self, extra_key: Optional[str]) -> int:
        return self.roots.setdefault(extra_key, -1 - len(self.roots))

    def walk(self, parent: int, contents) -> list[int]:
        ids, out = self.ids, []
        for c in contents:
            k = (parent, c)
            p = ids.get(k)
            if p is None:
                p = ids[k] = self.count
                self.count += 1
            out.append(p)
            parent = p
        return out

    def fresh(self, n: int) -> list[int]:
        """`n` pages known to be unique (they hold a request's own fresh output ids): no lookup needed."""
        start = self.count
        self.count += n
        return list(range(start, start + n))


def _block_contents(r, n_prompt: int, page_size: int) -> Optional[list]:
    """The contents of a block request's whole prompt pages straight from its hash ids (no token expansion):
    a page of k blocks is the k hash ids. None when the page size is not a multiple of the block size."""
    if r.hash_ids is None or r.has_output_ids or page_size % r.block_size:
        return None
    k = page_size // r.block_size
    h = r.hash_ids[:n_prompt * k]
    return h.tolist() if k == 1 else [tuple(row) for row in h.reshape(n_prompt, k).tolist()]


def request_pages(workload: Workload, page_size: int) -> list[tuple[np.ndarray, int]]:
    """Per request: int64 ids of the whole pages of prompt + output - 1, and how many of them are prompt pages.

    Block requests whose page size is a multiple of their block size never expand to tokens: their prompt
    pages come from the hash ids, and every later page holds fresh output ids (plus the partial last block)
    and so is unique to the request. Anything else expands to tokens and names each page by its bytes."""
    trie = _PageIds()
    out = []
    for r in workload.requests:
        n_prompt = r.prompt_len // page_size
        n_cached = r.cached_len // page_size
        root = trie.root(r.extra_key)
        blocks = _block_contents(r, n_prompt, page_size)
        if blocks is not None:
            ids = trie.walk(root, blocks) + trie.fresh(n_cached - n_prompt)
        else:
            toks = r.cached_ids()[:n_cached * page_size]
            if page_size == 1:
                contents = toks.tolist()
            else:
                contents = [row.tobytes() for row in toks.reshape(n_cached, page_size)]
            ids = trie.walk(root, contents)
        out.append((np.asarray(ids, dtype=np.int64), n_prompt))
    return out


def page_trace(workload: Workload, page_size: int, overlap: Optional[Overlap] = None) -> PageTrace:
    """The workload's page accesses in event order (see the module docstring)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    per_req = request_pages(workload, page_size)
    chunks_p, chunks_c, chunks_d, chunks_n = [], [], [], []
    for kind, i in event_order(workload, overlap):
        ids, n_prompt = per_req[i]
        if kind == ARRIVE:
            sel, lo = ids[:n_prompt], 0
            counted = np.arange(sel.shape[0]) < matchable_pages(workload.requests[i].prompt_len, page_size)
        else:
            sel, lo = ids[n_prompt:], n_prompt
            counted = np.zeros(sel.shape[0], dtype=bool)
        if sel.shape[0]:
            chunks_p.append(sel)
            chunks_c.append(counted)
            chunks_d.append(np.arange(lo, lo + sel.shape[0], dtype=np.int64))
            chunks_n.append(np.full(sel.shape[0], -(-workload.requests[i].cached_len // page_size), dtype=np.int64))
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dtype=dt))
    pages = cat(chunks_p, np.int64)
    return PageTrace(page_size=page_size, pages=pages, counted=cat(chunks_c, bool), depth=cat(chunks_d, np.int64),
                     prompt_tokens=workload.prompt_tokens, num_distinct=int(np.unique(pages).shape[0]),
                     max_request_pages=max(ids.shape[0] for ids, _ in per_req), requests=per_req,
                     need=cat(chunks_n, np.int64))
