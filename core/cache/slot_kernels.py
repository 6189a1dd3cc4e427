"""The loops of a CPU pool's `free_pages` kept as runs (core/cache/slot_store.py `RunStore`), compiled with numba.

Why runs: the slots a request frees come in long runs of consecutive slots (a leaf's slots were handed out
together, from runs freed together), ~2,600 slots a run on the Mooncake replay. Kept as (first page, length)
runs, a free reads each freed slot once (to find where its run ends) and writes one record per run; an alloc
writes each slot it hands out once. The double-free check is a bit per page (1 = free), checked and set a
run at a time, a 64-page word at a time: 1M pages are 125 kB, which stays in the core's cache (a byte per
page, 1 MB, did not; benchmarks/README.md has the measurement). One page per slot in a ring plus a
position per page, as before, cost five memory passes per slot; this costs about two.

Why `*_at` (a tensor's address and length instead of an array): a CPU tensor's numpy view costs ~1.5-3 us to
make (`.numpy()`, `torch.from_numpy`), more than the call itself on the small frees and allocs of an engine step;
the caller (core/cache/slot_store.py) passes `data_ptr()` of a contiguous tensor it holds for the whole call: int32,
the pool's slot dtype (core/cache/allocator.py `SLOT_DTYPE`), or int64 for a caller's own tensor (`give_runs_at64`).

Why compiled: the per-run loops in numpy or torch would be several sweeps and microseconds of dispatch per
run; one fused loop per call does it all, and releases the GIL while it runs so the dashboard's thread keeps
drawing.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

OK, OUTSIDE, PADDING, ALREADY_FREE, REPEATED, NOT_WHOLE = 0, 1, 2, 3, 4, 5
WORD = 64    # pages per word of the free bitmap
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
SHORT = 16   # slots looked at one by one before a run is compared in blocks
BLOCK = 64   # slots compared per block: long enough to vectorise, short enough to stop soon after a run ends


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
        block = slots[j:j + BLOCK]       # a slice: indices the compiler knows are in range, so it vectorises
        c = a + (j - i)
        differs = 0
        for t in range(BLOCK):
            differs |= block[t] ^ (c + t)
        if differs:
            break
        j += BLOCK
    while j < total and slots[j] == a + (j - i):
        j += 1
    return j


@njit(cache=True, nogil=True, inline="always")
def _word_mask(lo: int, hi: int) -> np.uint64:
    """Bits lo..hi-1 of a word (0 <= lo < hi <= 64)."""
    return (ALL >> np.uint64(WORD - (hi - lo))) << np.uint64(lo)


@njit(cache=True, nogil=True, inline="always")
def any_free(free: np.ndarray, p0: int, n: int) -> bool:
    """Whether any of pages p0..p0+n-1 is free: a word at a time."""
    seen = np.uint64(0)
    end = p0 + n
    while p0 < end:
        lo = p0 % WORD
        hi = min(WORD, lo + (end - p0))
        seen |= free[p0 // WORD] & _word_mask(lo, hi)
        p0 += hi - lo
    return seen != 0


@njit(cache=True, nogil=True, inline="always")
def is_free(free: np.ndarray, p: int) -> bool:
    return (free[p // WORD] >> np.uint64(p % WORD)) & np.uint64(1) != 0


@njit(cache=True, nogil=True)
def mark(free: np.ndarray, p0: int, n: int, on: bool) -> None:
    """Mark pages p0..p0+n-1 free (on) or held: a word at a time."""
    end = p0 + n
    while p0 < end:
        lo = p0 % WORD
        hi = min(WORD, lo + (end - p0))
        m = _word_mask(lo, hi)
        w = p0 // WORD
        free[w] = (free[w] | m) if on else (free[w] & ~m)
        p0 += hi - lo


@njit(cache=True, nogil=True)
def free_bytes(free: np.ndarray, out: np.ndarray) -> None:
    """The bitmap as one byte per page (1 = free) into `out` (num_pages + 1)."""
    for p in range(out.shape[0]):
        out[p] = 1 if is_free(free, p) else 0


@njit(cache=True, nogil=True)
def _whole_pages(slots: np.ndarray, page_size: int, i: int) -> bool:
    """Whether slots[i:] is whole pages: every maximal run starts on a page boundary and spans whole pages
    (a run of whole pages can only break at a page boundary, so this is exact)."""
    total = slots.shape[0]
    while i < total:
        j = _run_end(slots, i, total)
        if slots[i] % page_size or (j - i) % page_size:
            return False
        i = j
    return True


@njit(cache=True, nogil=True)
def give_runs(slots: np.ndarray, page_size: int, free: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
              tail: int, num_pages: int) -> tuple[int, int, int]:
    """free(): mark the pages of `slots` free and append them, run by run, at runs[tail:].

    Returns (OK, number of pages, new tail) or (error code, index of the first offending page, old tail) with
    nothing changed: the pages this call marked are unmarked, and runs past the old tail are not free_pages.
    The first problem in slot order is named; slots that are not whole pages are refused whatever else is
    wrong (NOT_WHOLE). A page marked free that this call itself marked was listed twice (REPEATED).
    """
    total = slots.shape[0]
    first_run = tail
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
            problem = any_free(free, p0, n)
        if problem:                      # the first offending page of the run, in order
            t = 0
            while t < n:
                p = p0 + t
                if p < 1 or p > num_pages:
                    code = PADDING if p == 0 else OUTSIDE
                    break
                if is_free(free, p):
                    code = ALREADY_FREE
                    for r in range(first_run, tail):
                        if starts[r] <= p < starts[r] + lengths[r]:
                            code = REPEATED
                    break
                t += 1
            bad = first + t
            if not _whole_pages(slots, page_size, j):
                code = NOT_WHOLE
            break
        mark(free, p0, n, True)
        if tail > first_run and starts[tail - 1] + lengths[tail - 1] == p0:
            lengths[tail - 1] += n       # continues this call's last run
        else:
            starts[tail] = p0
            lengths[tail] = n
            tail += 1
        i = j
    if code == OK:
        return OK, total // page_size, tail
    for r in range(first_run, tail):     # roll back: this call's pages are held again
        mark(free, starts[r], lengths[r], False)
    return code, bad, first_run


@njit(cache=True, nogil=True)
def take_runs(starts: np.ndarray, lengths: np.ndarray, head: int, n: int, page_size: int, free: np.ndarray,
              out: np.ndarray) -> int:
    """alloc(): the slots of the first `n` free pages into `out` (n * page_size), unmarked; returns the new
    head. The caller has checked that n pages are free. Consecutive pages have consecutive slots, so each
    run is one contiguous write."""
    k = 0
    while k < n:
        s, length = starts[head], lengths[head]
        take = min(length, n - k)
        mark(free, s, take, False)
        base = s * page_size
        dst = out[k * page_size:(k + take) * page_size]
        for x in range(dst.shape[0]):
            dst[x] = base + x
        k += take
        if take == length:
            head += 1
        else:
            starts[head] = s + take
            lengths[head] = length - take
    return head


@njit(cache=True, nogil=True)
def expand_runs(starts: np.ndarray, lengths: np.ndarray, head: int, tail: int, out: np.ndarray) -> None:
    """free_pages: the runs' pages in order into `out`."""
    k = 0
    for r in range(head, tail):
        s = starts[r]
        for t in range(lengths[r]):
            out[k] = s + t
            k += 1


def _pointer_intrinsic(item: types.Integer):
    """An intrinsic: the `item` pointer at integer `address` (a tensor's data_ptr()), for carray."""
    @intrinsic
    def pointer(typingctx, address):
        if not isinstance(address, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(item)))
        return types.CPointer(item)(address), codegen
    return pointer


_int32_ptr, _int64_ptr = _pointer_intrinsic(types.int32), _pointer_intrinsic(types.int64)


@njit(cache=True, nogil=True)
def give_runs_at(address: int, total: int, page_size: int, free: np.ndarray, starts: np.ndarray,
                 lengths: np.ndarray, tail: int, num_pages: int) -> tuple[int, int, int]:
    """give_runs on the `total` contiguous int32 slots at `address`."""
    return give_runs(carray(_int32_ptr(address), total), page_size, free, starts, lengths, tail, num_pages)


@njit(cache=True, nogil=True)
def give_runs_at64(address: int, total: int, page_size: int, free: np.ndarray, starts: np.ndarray,
                   lengths: np.ndarray, tail: int, num_pages: int) -> tuple[int, int, int]:
    """give_runs on the `total` contiguous int64 slots at `address` (a caller's own int64 tensor)."""
    return give_runs(carray(_int64_ptr(address), total), page_size, free, starts, lengths, tail, num_pages)


@njit(cache=True, nogil=True)
def take_runs_at(starts: np.ndarray, lengths: np.ndarray, head: int, n: int, page_size: int, free: np.ndarray,
                 address: int) -> int:
    """take_runs into the n * page_size contiguous int32 slots at `address`."""
    return take_runs(starts, lengths, head, n, page_size, free, carray(_int32_ptr(address), n * page_size))


def load() -> None:
    """Compile the kernels now (or load them from numba's on-disk cache): the first CPU allocator calls
    this, so the compile never stalls an engine step or a dashboard refresh. Later calls find them compiled
    and cost a microsecond."""
    free, starts, lengths = np.zeros(1, dtype=np.uint64), np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.int64)
    for ps in (1, 2):
        slots = np.arange(ps, 2 * ps, dtype=np.int32)
        give_runs_at(slots.ctypes.data, ps, ps, free, starts, lengths, 0, 1)
        take_runs_at(starts, lengths, 0, 1, ps, free, slots.ctypes.data)
        wide = np.arange(ps, 2 * ps, dtype=np.int64)
        give_runs_at64(wide.ctypes.data, ps, ps, free, starts, lengths, 0, 1)
        take_runs_at(starts, lengths, 0, 1, ps, free, slots.ctypes.data)
    expand_runs(starts, lengths, 0, 0, np.zeros(0, dtype=np.int32))
    mark(free, 1, 1, True)
    free_bytes(free, np.zeros(2, dtype=np.uint8))
