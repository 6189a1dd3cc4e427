"""The slot allocator: `free_pages` with alloc / free, in pages.

Slot 0 is padding and never handed out, so a zero in an index tensor is always "no slot".
Slots come out of `alloc` as a tensor on the pool's device, so they index `k_buffer`
and `v_buffer` directly, with no host round trip (as the article stresses).

Slot and page indices are int32 (`SLOT_DTYPE`), as SGLang's `req_to_token` and vLLM's block tables:
a pool never holds 2^31 slots, and half the bytes is half the memory traffic of every alloc, free and
prefix concat (the tree holds a slot id per cached token). Torch ops that insist on int64 indices
(`index_copy_`) get them from `ForwardBatch`, once per batch.
"""
from __future__ import annotations

import operator
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

from core.cache import slot_kernels, slot_store

Indices = Union[torch.Tensor, Sequence[int]]
SLOT_DTYPE = torch.int32
MAX_SLOTS = 2**31 - 2**16   # every slot id, page 0's padding included, fits SLOT_DTYPE with room for a page
_KERNEL_DTYPES = (SLOT_DTYPE, torch.int64)   # what the CPU free kernel reads as it is


def _as_count(n) -> int:
    """An alloc count as a plain int: any integer type (numpy, 0-d tensor) but not bool or float."""
    if isinstance(n, bool):
        raise ValueError(f"alloc needs an integer slot count, got the bool {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise ValueError(f"alloc needs an integer slot count, got {n!r} ({type(n).__name__}); "
                         f"round it to a whole number of slots") from None
    if n < 1:
        raise ValueError(f"alloc needs a positive slot count, got {n}; skip the call when nothing is needed")
    return n


class SlotAllocator:
    """Hands out KV slots from the front of `free_pages` and takes them back at the back.

    With `page_size > 1` the unit is a page: page p covers slots p*page_size ..
    p*page_size + page_size - 1, page 0 is padding, and `free_pages` holds page numbers.
    `alloc`/`free` always speak in slot indices, so callers never see the difference.

    Every free is checked (whole pages, inside the pool, not padding, handed out, not twice in one call):
    a bad one raises ValueError naming the first offending slot and changes nothing. Where `free_pages`
    lives (core/cache/slot_store.py): on a CPU pool as runs of consecutive pages (`store="runs"`: a free costs one
    read per slot and a record per run, core/cache/slot_kernels.py), on an accelerator as a ring of pages on the
    device (`store="ring"`: torch ops, no host round trip). Both give the same results and errors.
    """

    def __init__(self, num_slots: int, device: Union[str, torch.device] = "cpu", page_size: int = 1,
                 on_event: Optional[Callable[[str, torch.Tensor], None]] = None,
                 store: Optional[str] = None) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:   # True is no size
            raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
        if not isinstance(num_slots, int) or num_slots < page_size:
            raise ValueError(
                f"a pool needs at least one page of {page_size} slot(s), got num_slots={num_slots!r}; "
                f"raise the pool size")
        if num_slots > MAX_SLOTS:
            raise ValueError(f"num_slots={num_slots:,} is more than a pool can index ({MAX_SLOTS:,} slots: slot ids "
                             f"are int32); use a smaller pool or several")
        if num_slots % page_size:
            raise ValueError(f"num_slots={num_slots} is not a multiple of page_size={page_size}; "
                             f"use {num_slots - num_slots % page_size} or {num_slots + page_size - num_slots % page_size}")
        self.num_slots = num_slots
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.device = torch.device(device)
        self.on_event = on_event
        if store is None:
            store = "runs" if self.device.type == "cpu" else "ring"
        if store not in ("runs", "ring") or (store == "runs" and self.device.type != "cpu"):
            raise ValueError(f"store={store!r}: use 'ring' (any device) or 'runs' (CPU pools only)")
        # On a CPU pool the hot paths work on numpy views of the same memory: a torch call costs
        # microseconds of dispatch, and the engine and the lab call alloc/free thousands of times a second.
        self.use_kernel = store == "runs"
        self._page_offsets = torch.arange(page_size, dtype=SLOT_DTYPE, device=self.device)
        self._store = (slot_store.RunStore(self.num_pages, page_size) if self.use_kernel
                       else slot_store.RingStore(self.num_pages, page_size, self.device))
        self._pristine = True

    def clear(self) -> None:
        """Every page free again, in order 1..num_pages (the state at startup)."""
        if self._pristine:  # nothing handed out or taken back since the last clear (a new cache resets it)
            return
        self._store.clear()
        self._pristine = True

    @property
    def free_pages(self) -> torch.Tensor:
        """Free page numbers (slots when page_size=1), front first: alloc takes from the front. A copy."""
        return self._store.free_pages()

    def free_slots(self) -> torch.Tensor:
        """The slots of `free_pages`, in free_pages order (a copy; equal to free_pages when page_size=1)."""
        pages = self.free_pages
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self._page_offsets[None, :]).reshape(-1)

    def available(self) -> int:
        """Free slots (not pages)."""
        return self._store.available_pages() * self.page_size

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        """Take `n` slots from the front of `free_pages` (a new tensor, the caller's to keep); None when fewer
        than `n` are free."""
        if type(n) is not int or n < 1:   # the common case (a positive int) skips the call
            n = _as_count(n)
        if n % self.page_size:
            raise ValueError(f"alloc({n}) is not page aligned: with page_size={self.page_size} ask for a "
                             f"multiple of {self.page_size} (for example {n + self.page_size - n % self.page_size})")
        num_pages = n // self.page_size
        if num_pages > self._store.available_pages():
            return None
        self._pristine = False
        slots = self._store.take(num_pages)
        if self.on_event is not None:
            self.on_event("alloc", slots)
        return slots

    def _index_tensor(self, indices: Indices) -> torch.Tensor:
        """Slot indices as a 1-D int32 or int64 tensor on the pool's device (other integers become int64,
        wide enough that an id past the pool is refused rather than wrapped); anything else is refused."""
        if isinstance(indices, torch.Tensor):
            if indices.dtype in _KERNEL_DTYPES and indices.dim() == 1 and (indices.is_cpu if self.use_kernel
                                                                         else indices.device == self.device):
                return indices  # the common case, without conversions (an integer tensor never needs grad)
            if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype is torch.bool:
                raise ValueError(f"free() needs integer slot indices, got a {indices.dtype} tensor")
            return indices.detach().to(device=self.device, dtype=torch.int64).reshape(-1)
        try:
            arr = np.array(indices if isinstance(indices, np.ndarray) else list(indices))  # a copy: writable
        except TypeError:
            raise ValueError(f"free() needs a sequence of slot indices (a list or a tensor), got "
                             f"{type(indices).__name__}") from None
        if arr.size and arr.dtype.kind not in "iu":
            raise ValueError(f"free() needs integer slot indices, got {arr.dtype} values such as {arr.flat[0]!r}")
        return torch.from_numpy(arr.astype(np.int64, copy=False).reshape(-1)).to(self.device)

    def _slots_to_pages(self, slots: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return slots
        if slots.numel() % self.page_size:
            raise ValueError(f"free() got {slots.numel()} slots, not whole pages of {self.page_size}; "
                             f"free every slot of a page together")
        rows = slots.reshape(-1, self.page_size)
        pages = rows[:, 0].div(self.page_size, rounding_mode="floor")
        if not torch.equal(rows, pages[:, None] * self.page_size + self._page_offsets[None, :]):
            raise ValueError(f"free() got slots that are not whole pages of {self.page_size} "
                             f"(each page is p*{self.page_size} .. p*{self.page_size}+{self.page_size - 1})")
        return pages

    def free(self, indices: Indices) -> None:
        """Return slots to the back of `free_pages`. A rejected call (ValueError) changes nothing that
        counts: free_pages, the free mask and available() stay as they were."""
        if type(indices) is torch.Tensor and indices.dtype in _KERNEL_DTYPES and indices.dim() == 1 \
                and self.use_kernel and indices.is_cpu:
            slots = indices   # the common case (the tree's own slots), without _index_tensor's call
        else:
            slots = self._index_tensor(indices)
        n = slots.shape[0]
        if n == 0:
            return  # callers free "whatever was left over", which is often nothing
        ps = self.page_size
        if n % ps:
            self._slots_to_pages(slots)            # raises the "not whole pages" error
        if n // ps > self.num_pages:
            raise ValueError(f"free() got {n // ps} pages but the pool has {self.num_pages}: a slot is repeated "
                             f"(double free)")
        if self.use_kernel:     # the kernel checks whole pages itself, in the same pass as the rest
            code, page = self._store.give(slots if slots.is_contiguous() else slots.contiguous())
            if code == slot_kernels.NOT_WHOLE:
                self._slots_to_pages(slots)        # raises the "not whole pages" error
        else:
            code, page = self._store.give(self._slots_to_pages(slots))
        if code != slot_kernels.OK:
            raise self._free_error(code, page)
        self._pristine = False
        if self.on_event is not None:
            self.on_event("free", slots)

    def _free_error(self, code: int, page: int) -> ValueError:
        ps, slot = self.page_size, page * self.page_size
        if code == slot_kernels.OUTSIDE:
            return ValueError(f"free() got slot {slot} outside the pool (slots {ps}..{self.num_slots + ps - 1})")
        if code == slot_kernels.PADDING:
            return ValueError(f"free() got slot {slot}, which is padding (page 0) and is never handed out")
        if code == slot_kernels.ALREADY_FREE:
            return ValueError(f"double free: slot {slot} is already free (or was never handed out)")
        return ValueError(f"free() got the same slot twice in one call (slot {slot}): a double free")

    def is_free_mask(self) -> torch.Tensor:
        """Bool per slot 0..num_slots+page_size-1: True where the slot is in `free_pages`."""
        return self._store.is_free_page().repeat_interleave(self.page_size)
