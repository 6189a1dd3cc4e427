"""Where `SlotAllocator` keeps `free_pages`: as runs on a CPU pool, as a ring of pages on an accelerator.

Both keep the same sequence (free pages, front first: alloc takes from the front, free appends at the back)
and the same free state per page, so the allocator behaves identically on either; tests hold them to the
same results and errors. `take(n)` hands out the slots of the first n free pages (the caller has checked
that n are free); `give(...)` takes pages back and returns (code, offending page), codes as in
core/cache/slot_kernels.py, having changed nothing when the code is not OK.
"""
from __future__ import annotations

import numpy as np
import torch

from core.cache import slot_kernels as K


class RunStore:
    """free_pages as runs (first page, length) in a ring of runs, plus a bit per page (1 = free).

    Why: freed slots come in long runs, and a run costs one record however long it is; the per-page bit
    is the double-free check, read and written a run (a word of 64 pages) at a time (core/cache/slot_kernels.py).
    Runs past `_tail` are not free_pages, so a rejected free only has to unmark its pages.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self._capacity = 2 * num_pages + 1   # live runs <= free pages <= num_pages, plus a call's worth
        self._starts = np.empty(self._capacity, dtype=np.int64)
        self._lengths = np.empty(self._capacity, dtype=np.int64)
        self._free = np.zeros(num_pages // K.WORD + 1, dtype=np.uint64)   # a bit per page; page 0 (padding) never set
        K.load()
        self.clear()

    def clear(self) -> None:
        self._starts[0], self._lengths[0] = 1, self.num_pages
        self._head, self._tail, self._count = 0, 1, self.num_pages
        self._free[:] = 0
        K.mark(self._free, 1, self.num_pages, True)

    def available_pages(self) -> int:
        return self._count

    def free_pages(self) -> torch.Tensor:
        out = np.empty(self._count, dtype=np.int32)
        K.expand_runs(self._starts, self._lengths, self._head, self._tail, out)
        return torch.from_numpy(out)

    def is_free_page(self) -> torch.Tensor:
        out = np.empty(self.num_pages + 1, dtype=np.uint8)
        K.free_bytes(self._free, out)
        return torch.from_numpy(out.view(np.bool_))

    def take(self, num_pages: int) -> torch.Tensor:
        out = torch.empty(num_pages * self.page_size, dtype=torch.int32)   # written in full by the kernel
        self._head = K.take_runs_at(self._starts, self._lengths, self._head, num_pages, self.page_size, self._free,
                                    out.data_ptr())
        self._count -= num_pages
        return out

    def give(self, slots: torch.Tensor) -> tuple[int, int]:
        """Free whole pages given as slots (a contiguous int32 or int64 CPU tensor, held by the caller for the
        call); (code, offending page)."""
        k = slots.shape[0] // self.page_size
        if self._tail + k > self._capacity:  # out of room at the back: move the live runs to the front
            live = self._tail - self._head
            self._starts[:live] = self._starts[self._head:self._tail].copy()
            self._lengths[:live] = self._lengths[self._head:self._tail].copy()
            self._head, self._tail = 0, live
        give = K.give_runs_at if slots.dtype is torch.int32 else K.give_runs_at64
        code, i, self._tail = give(slots.data_ptr(), slots.shape[0], self.page_size, self._free,
                                   self._starts, self._lengths, self._tail, self.num_pages)
        if code == K.OK:
            self._count += i
            return K.OK, 0
        return code, (int(slots[i * self.page_size]) // self.page_size if code != K.NOT_WHOLE else 0)


class RingStore:
    """free_pages as pages in a ring buffer on the pool's device, plus a position per page.

    Why on an accelerator: taken pages index k_buffer/v_buffer with no host round trip, and every step is
    a handful of torch ops. `free_pages` is the window `[_head, _tail)` of an ever-growing sequence of
    positions in a ring twice the pool's size; `_pos[p]` is the position at which page p was last
    appended, so page p is free exactly when `_pos[p] >= _head`: a take only advances `_head`.
    """

    def __init__(self, num_pages: int, page_size: int, device: torch.device) -> None:
        self.num_pages, self.page_size, self.device = num_pages, page_size, device
        self._offsets = torch.arange(page_size, dtype=torch.int32, device=device)
        self._ring = torch.empty(2 * num_pages, dtype=torch.int32, device=device)
        self._pos = torch.empty(num_pages + 1, dtype=torch.int64, device=device)
        self.clear()

    def clear(self) -> None:
        n = self.num_pages
        torch.arange(1, n + 1, out=self._ring[:n])
        self._pos[0] = -1                       # page 0 is padding: never free, never handed out
        torch.arange(n, out=self._pos[1:])
        self._base = 0                          # the position stored at _ring[0]
        self._head, self._tail = 0, n           # free_pages = positions [_head, _tail)

    def available_pages(self) -> int:
        return self._tail - self._head

    def free_pages(self) -> torch.Tensor:
        return self._ring[self._head - self._base:self._tail - self._base].clone()

    def is_free_page(self) -> torch.Tensor:
        return self._pos >= self._head

    def take(self, num_pages: int) -> torch.Tensor:
        start = self._head - self._base
        self._head += num_pages
        pages = self._ring[start:start + num_pages]
        if self.page_size == 1:
            return pages.clone()                # a copy: the ring region is reused later
        return (pages[:, None] * self.page_size + self._offsets[None, :]).reshape(-1)

    def give(self, pages: torch.Tensor) -> tuple[int, int]:
        """Free `pages` (page numbers on the device); (code, offending page). The same checks, and the same
        first offending page, as the run kernel, found with masks (a repeat is a page seen earlier)."""
        k = pages.shape[0]
        if self._tail - self._base + k > 2 * self.num_pages:  # out of room at the back: move the live part
            live = self._ring[self._head - self._base:self._tail - self._base].clone()
            self._ring[:live.numel()] = live
            self._base = self._head
        outside = (pages < 1) | (pages > self.num_pages)
        already = (self._pos[pages.clamp(0, self.num_pages)] >= self._head) & ~outside
        ordered, order = torch.sort(pages, stable=True)
        repeat = torch.zeros_like(outside)
        repeat[order[1:]] = ordered[1:] == ordered[:-1]
        problems = outside | already | repeat
        if bool(problems.any()):
            i = int(problems.nonzero()[0])
            page = int(pages[i])
            if bool(outside[i]):
                return (K.PADDING if page == 0 else K.OUTSIDE), page
            return (K.ALREADY_FREE if bool(already[i]) else K.REPEATED), page
        end = self._tail - self._base
        self._pos[pages] = torch.arange(self._tail, self._tail + k, device=self.device)
        self._ring[end:end + k] = pages
        self._tail += k
        return K.OK, 0
