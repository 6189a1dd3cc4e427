"""The per-slot loops of `SlotAllocator.free` (and a paged `alloc`), compiled with numba for CPU pools.

Why compiled: every freed slot must be checked (a whole page, inside the pool, not padding, really handed
out, not listed twice in the call) and given its place at the back of `free_pages`. With numpy or torch that
is a range pass, a gather, a compare, a scatter and a second gather (plus, with pages, a k x page_size
tensor to compare whole pages against), each a separate sweep over memory with microseconds of dispatch; one
fused loop does all of it in a single pass, one check per page, and releases the GIL while it runs so the
dashboard's thread keeps drawing. A paged `alloc` likewise expands its pages to slots in one pass.
"""
from __future__ import annotations

import numpy as np
from numba import njit

OK, OUTSIDE, PADDING, ALREADY_FREE, REPEATED, NOT_WHOLE = 0, 1, 2, 3, 4, 5


@njit(cache=True, nogil=True)
def take(ring: np.ndarray, start: int, n: int, page_size: int, out: np.ndarray) -> None:
    """A paged alloc: the slots of pages ring[start:start+n] into `out` (n * page_size of them)."""
    k = 0
    for i in range(n):
        base = ring[start + i] * page_size
        for j in range(page_size):
            out[k] = base + j
            k += 1


@njit(cache=True, nogil=True)
def mark_free(slots: np.ndarray, page_size: int, pos: np.ndarray, ring: np.ndarray, ring_end: int, head: int,
              tail: int, num_pages: int) -> tuple[int, int]:
    """Give the i-th page of `slots` the position tail + i and write it at ring[ring_end + i].

    Page p is free exactly when pos[p] >= head, so a page that is already free, or that this call has just
    freed (pos[p] >= tail: listed twice), is rejected. Returns (OK, number of pages), or (error code, index
    of the first offending page) with nothing changed that counts: the pages marked before it get -1 back
    (any position below the head means "held", and the head never goes below 0), and ring entries past the
    allocator's tail are not free_pages until it moves. Slots that are not whole pages are refused before
    anything else (NOT_WHOLE): the page numbers mean nothing then.
    """
    k = slots.shape[0] // page_size
    if page_size > 1:
        for i in range(k):
            s0 = slots[i * page_size]
            if s0 % page_size:
                return NOT_WHOLE, i
            for j in range(1, page_size):
                if slots[i * page_size + j] != s0 + j:
                    return NOT_WHOLE, i
    for i in range(k):
        p = slots[i * page_size] // page_size
        if p < 1 or p > num_pages:
            code = PADDING if p == 0 else OUTSIDE
        else:
            q = pos[p]
            if q < head:
                pos[p] = tail + i
                ring[ring_end + i] = p
                continue
            code = REPEATED if q >= tail else ALREADY_FREE
        for j in range(i):
            pos[slots[j * page_size] // page_size] = -1
        return code, i
    return OK, k


def load() -> None:
    """Compile the kernels now (or load them from numba's on-disk cache): the first CPU allocator calls
    this, so the compile never stalls an engine step or a dashboard refresh. Later calls find them compiled
    and cost a microsecond."""
    pos, ring = np.full(2, -1, dtype=np.int64), np.zeros(2, dtype=np.int64)
    take(np.ones(1, dtype=np.int64), 0, 1, 2, np.zeros(2, dtype=np.int64))
    for ps in (1, 2):
        mark_free(np.arange(ps, 2 * ps, dtype=np.int64), ps, pos, ring, 0, 0, 0, 1)
