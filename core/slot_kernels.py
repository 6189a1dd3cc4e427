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
SHORT = 16   # slots looked at one by one before a run is compared in blocks
BLOCK = 64   # slots compared per block: long enough to vectorise, short enough to stop soon after a run ends


@njit(cache=True, nogil=True)
def take(ring: np.ndarray, start: int, n: int, page_size: int, out: np.ndarray) -> None:
    """A paged alloc: the slots of pages ring[start:start+n] into `out` (n * page_size of them)."""
    k = 0
    for i in range(n):
        base = ring[start + i] * page_size
        for j in range(page_size):
            out[k] = base + j
            k += 1


@njit(cache=True, nogil=True, inline="always")
def _run_end(slots: np.ndarray, i: int, total: int) -> int:
    """The end of the run of consecutive slots starting at slots[i]: a scalar look at the first few, then
    blocks of BLOCK compared without early exit (a loop the compiler vectorises), then a scalar tail."""
    a = slots[i]
    j = i + 1
    short = min(total, i + SHORT)
    while j < short and slots[j] == a + (j - i):
        j += 1
    if j < short or j == total:
        return j
    while j + BLOCK <= total:
        c = a + (j - i)
        differs = 0
        for t in range(BLOCK):
            differs |= slots[j + t] ^ (c + t)
        if differs:
            break
        j += BLOCK
    while j < total and slots[j] == a + (j - i):
        j += 1
    return j


@njit(cache=True, nogil=True)
def _whole_pages(slots: np.ndarray, page_size: int, i: int) -> bool:
    """Whether slots[i:] is whole pages: every maximal run starts on a page boundary, spans whole pages."""
    total = slots.shape[0]
    while i < total:
        j = _run_end(slots, i, total)
        if slots[i] % page_size or (j - i) % page_size:
            return False
        i = j
    return True


@njit(cache=True, nogil=True)
def mark_free(slots: np.ndarray, page_size: int, pos: np.ndarray, ring: np.ndarray, ring_end: int, head: int,
              tail: int, num_pages: int) -> tuple[int, int]:
    """Give the i-th page of `slots` the position tail + i and write it at ring[ring_end + i].

    Page p is free exactly when pos[p] >= head, so a page that is already free, or that this call has just
    freed (pos[p] >= tail: listed twice), is rejected. Returns (OK, number of pages), or (error code, index
    of the first offending page) with nothing changed that counts: the pages marked before it get -1 back
    (any position below the head means "held", and the head never goes below 0), and ring entries past the
    allocator's tail are not free_pages until it moves. Slots that are not whole pages are refused whatever
    else is wrong (NOT_WHOLE): the page numbers mean nothing then.

    Freed slots come in runs (a leaf's slots were handed out together), so the work is per run: find where
    the run of consecutive slots ends, then check and write its pages as contiguous slices, loops the
    compiler turns into vector code. A slot-level run of whole pages starts on a page boundary and spans
    whole pages, which is also the whole-page check. Short runs (shuffled slots) take a scalar path.
    """
    total = slots.shape[0]
    code, bad = OK, 0
    i = 0
    while i < total:
        j = _run_end(slots, i, total)
        a = slots[i]
        if a % page_size or (j - i) % page_size:
            code, bad = NOT_WHOLE, i // page_size
            break
        p0, n, first = a // page_size, (j - i) // page_size, i // page_size
        problem = p0 < 1 or p0 > num_pages - n + 1
        if not problem:
            q = pos[p0:p0 + n]
            top = q[0]
            for t in range(1, n):
                top = max(top, q[t])
            problem = top >= head
        if problem:                      # find the first offending page of the run, in order
            for t in range(n):
                p = p0 + t
                if p < 1 or p > num_pages:
                    code = PADDING if p == 0 else OUTSIDE
                    break
                if pos[p] >= head:
                    code = REPEATED if pos[p] >= tail else ALREADY_FREE
                    break
            bad = first + t
            if not _whole_pages(slots, page_size, j):
                code = NOT_WHOLE
            break
        q = pos[p0:p0 + n]
        r = ring[ring_end + first:ring_end + first + n]
        for t in range(n):
            q[t] = tail + first + t
        for t in range(n):
            r[t] = p0 + t
        i = j
    if code == OK:
        return OK, total // page_size
    for t in range(i // page_size):      # roll back the pages of the runs before: held again
        pos[slots[t * page_size] // page_size] = -1
    return code, bad


def load() -> None:
    """Compile the kernels now (or load them from numba's on-disk cache): the first CPU allocator calls
    this, so the compile never stalls an engine step or a dashboard refresh. Later calls find them compiled
    and cost a microsecond."""
    pos, ring = np.full(2, -1, dtype=np.int64), np.zeros(2, dtype=np.int64)
    take(np.ones(1, dtype=np.int64), 0, 1, 2, np.zeros(2, dtype=np.int64))
    for ps in (1, 2):
        mark_free(np.arange(ps, 2 * ps, dtype=np.int64), ps, pos, ring, 0, 0, 0, 1)
