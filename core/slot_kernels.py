"""The per-slot loops of `SlotAllocator.alloc` and `.free`, compiled with numba for CPU pools.

Why compiled: every freed slot must be checked (a whole page, inside the pool, not padding, really handed
out, not listed twice in the call) and given its place at the back of `free_pages`; every allocated page
must be marked held and (with pages) expanded to its slots. With numpy or torch that is several sweeps over
memory with microseconds of dispatch each, plus temporaries; one fused loop does each in a single pass, and
releases the GIL while it runs so the dashboard's thread keeps drawing.

The free state is one bit per page (`bits`, set = in free_pages): a pool of a million pages keeps it in
128 KB, inside the L2 cache; a position per page (8 MB) missed the cache on nearly every freed slot
(about 10 ns a slot against 1.5 ns measured for the bit).
"""
from __future__ import annotations

import numpy as np
from numba import njit

OK, OUTSIDE, PADDING, ALREADY_FREE, REPEATED, NOT_WHOLE = 0, 1, 2, 3, 4, 5


@njit(cache=True, nogil=True)
def take(ring: np.ndarray, start: int, n: int, bits: np.ndarray, page_size: int, out: np.ndarray) -> None:
    """alloc: pages ring[start:start+n] as slots into `out` (n * page_size), each page marked held."""
    if page_size == 1:
        for i in range(n):
            p = ring[start + i]
            bits[p >> 6] &= ~(np.uint64(1) << np.uint64(p & 63))
            out[i] = p
        return
    k = 0
    for i in range(n):
        p = ring[start + i]
        bits[p >> 6] &= ~(np.uint64(1) << np.uint64(p & 63))
        base = p * page_size
        for j in range(page_size):
            out[k] = base + j
            k += 1


@njit(cache=True, nogil=True)
def mark_free(slots: np.ndarray, page_size: int, bits: np.ndarray, ring: np.ndarray, ring_end: int,
              num_pages: int) -> tuple[int, int]:
    """free: check every page of `slots` (whole pages, in order) and append it at ring[ring_end:].

    Returns (OK, number of pages), or (error code, index of the first offending page) with nothing changed
    that counts: pages marked free before it are marked held again, and ring entries past the allocator's
    tail are not free_pages until the tail moves. A call that is not whole pages is refused before anything
    else (NOT_WHOLE), as the page numbers mean nothing then.
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
        elif not bits[p >> 6] & (np.uint64(1) << np.uint64(p & 63)):
            bits[p >> 6] |= np.uint64(1) << np.uint64(p & 63)
            ring[ring_end + i] = p
            continue
        else:
            code = ALREADY_FREE
            for j in range(i):
                if ring[ring_end + j] == p:
                    code = REPEATED
                    break
        for j in range(i):
            q = ring[ring_end + j]
            bits[q >> 6] &= ~(np.uint64(1) << np.uint64(q & 63))
        return code, i
    return OK, k


def load() -> None:
    """Compile the kernels now (or load them from numba's on-disk cache): the first CPU allocator calls
    this, so the compile never stalls an engine step or a dashboard refresh. Later calls find them compiled
    and cost a microsecond."""
    mask, ring = np.zeros(1, dtype=np.uint64), np.zeros(4, dtype=np.int64)
    for ps in (1, 2):
        take(np.ones(1, dtype=np.int64), 0, 1, mask, ps, np.zeros(ps, dtype=np.int64))
        mark_free(np.arange(ps, 2 * ps, dtype=np.int64), ps, mask, ring, 0, 1)
