"""The per-slot loop of `SlotAllocator.free`, compiled with numba for CPU pools.

Why compiled: every freed slot must be checked (inside the pool, not padding, really handed out,
not listed twice in the call) and given its place at the back of `free_pages`. With numpy that is
a range pass, a gather, a compare, a scatter and a second gather to find repeats, each a separate
sweep over memory with microseconds of dispatch; eviction frees tens of millions of slots on a big
trace. One fused loop does all of it in a single pass, and releases the GIL while it runs so the
dashboard's thread keeps drawing.
"""
from __future__ import annotations

import numpy as np
from numba import njit

OK, OUTSIDE, PADDING, ALREADY_FREE, REPEATED = 0, 1, 2, 3, 4


@njit(cache=True, nogil=True)
def mark_free(pages: np.ndarray, pos: np.ndarray, ring: np.ndarray, ring_end: int, head: int, tail: int,
              num_pages: int) -> tuple[int, int]:
    """Give pages[i] the position tail + i and write it at ring[ring_end + i].

    Page p is free exactly when pos[p] >= head, so a page that is already free, or that this call
    has just freed (pos[p] >= tail: listed twice), is rejected. Returns (OK, len(pages)), or
    (error code, index of the first offending page) with nothing changed that counts: the pages
    marked before it get -1 back (any position below the head means "held", and the head never
    goes below 0), and ring entries past the allocator's tail are not free_pages until it moves.
    """
    k = pages.shape[0]
    for i in range(k):
        p = pages[i]
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
            pos[pages[j]] = -1
        return code, i
    return OK, k



def load() -> None:
    """Compile `mark_free` now (or load it from numba's on-disk cache): the first CPU allocator
    calls this, so the compile never stalls an engine step or a dashboard refresh. Later calls
    find it compiled and cost a microsecond."""
    mark_free(np.ones(1, dtype=np.int64), np.full(2, -1, dtype=np.int64), np.zeros(1, dtype=np.int64), 0, 0, 0, 1)
