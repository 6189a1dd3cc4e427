"""The physical KV memory: a slot allocator (`free_pages`), the K/V pool, and request rows.

Slot 0 is padding and never handed out, so a zero in an index tensor is always "no slot".
`free_pages` is a tensor on the pool's device, so indices taken from it index `k_buffer`
and `v_buffer` directly, with no host round trip (as the article stresses).
"""
from __future__ import annotations

import operator
from typing import Callable, Optional, Sequence, Union

import torch

Indices = Union[torch.Tensor, Sequence[int]]


def _as_index_tensor(indices: Indices, device: torch.device) -> torch.Tensor:
    if isinstance(indices, torch.Tensor):
        return indices.to(device=device, dtype=torch.int64).reshape(-1)
    return torch.as_tensor(list(indices), dtype=torch.int64, device=device).reshape(-1)


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
    """

    def __init__(self, num_slots: int, device: Union[str, torch.device] = "cpu", page_size: int = 1,
                 on_event: Optional[Callable[[str, torch.Tensor], None]] = None) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
        if not isinstance(num_slots, int) or num_slots < page_size:
            raise ValueError(
                f"a pool needs at least one page of {page_size} slot(s), got num_slots={num_slots!r}; "
                f"raise the pool size")
        if num_slots % page_size:
            raise ValueError(f"num_slots={num_slots} is not a multiple of page_size={page_size}; "
                             f"use {num_slots - num_slots % page_size} or {num_slots + page_size - num_slots % page_size}")
        self.num_slots = num_slots
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.device = torch.device(device)
        self.on_event = on_event
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self.clear()

    def clear(self) -> None:
        """Every page free again, in order 1..num_pages (the state at startup)."""
        # free_pages lives in _buf[_head:_tail] of a buffer twice its maximum size, so alloc (advance
        # _head) and free (write at _tail) cost O(slots moved), not O(pool): when the back runs out,
        # the live part is copied to the front, at most once per num_pages appended pages.
        self._buf = torch.empty(2 * self.num_pages, dtype=torch.int64, device=self.device)
        self._buf[:self.num_pages] = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self._head, self._tail = 0, self.num_pages
        # _free_count[p] for p in 0..num_pages: 1 while page p is in free_pages, else 0. Page 0 is
        # padding, never free, never allocated. free() adds 1 per page and rejects any count above 1,
        # which catches a double free and a page repeated within one call in the same O(k) pass.
        self._free_count = torch.ones(self.num_pages + 1, dtype=torch.int32, device=self.device)
        self._free_count[0] = 0
        self._ones = torch.ones(self.num_pages, dtype=torch.int32, device=self.device)

    @property
    def free_pages(self) -> torch.Tensor:
        """Free page numbers (slots when page_size=1), front first. A view into the allocator's buffer:
        read it now, or `.clone()` / `.tolist()` it to keep it (a later free() may overwrite it)."""
        return self._buf[self._head:self._tail]

    @free_pages.setter
    def free_pages(self, pages: torch.Tensor) -> None:
        pages = torch.as_tensor(pages, dtype=torch.int64, device=self.device).reshape(-1).clone()
        if pages.numel() > self._buf.numel():
            self._buf = torch.empty(2 * pages.numel(), dtype=torch.int64, device=self.device)
        self._buf[:pages.numel()] = pages
        self._head, self._tail = 0, pages.numel()

    def available(self) -> int:
        """Free slots (not pages)."""
        return (self._tail - self._head) * self.page_size

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages.clone()
        return (pages[:, None] * self.page_size + self._page_offsets[None, :]).reshape(-1)

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        """Take `n` slots from the front of `free_pages`; None when fewer than `n` are free."""
        n = _as_count(n)
        if n % self.page_size:
            raise ValueError(f"alloc({n}) is not page aligned: with page_size={self.page_size} ask for a "
                             f"multiple of {self.page_size} (for example {n + self.page_size - n % self.page_size})")
        num_pages = n // self.page_size
        if num_pages > self._tail - self._head:
            return None
        pages = self._buf[self._head:self._head + num_pages]
        self._head += num_pages
        self._free_count.index_add_(0, pages, self._ones[:num_pages], alpha=-1)  # 1 -> 0; faster than index_fill_
        slots = self._pages_to_slots(pages)  # a copy: the buffer region is reused later
        if self.on_event is not None:
            self.on_event("alloc", slots)
        return slots

    def _slots_to_pages(self, slots: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return slots
        if slots.numel() % self.page_size:
            raise ValueError(f"free() got {slots.numel()} slots, not whole pages of {self.page_size}; "
                             f"free every slot of a page together")
        rows = slots.view(-1, self.page_size)
        pages = rows[:, 0] // self.page_size
        if not torch.equal(rows, pages[:, None] * self.page_size + self._page_offsets[None, :]):
            raise ValueError(f"free() got slots that are not whole pages of {self.page_size} "
                             f"(each page is p*{self.page_size} .. p*{self.page_size}+{self.page_size - 1})")
        return pages

    def free(self, indices: Indices) -> None:
        """Return slots to the back of `free_pages`. Validates everything before changing anything."""
        slots = _as_index_tensor(indices, self.device)
        if slots.numel() == 0:
            return
        lo, hi = (int(x) for x in torch.aminmax(slots))
        if lo < 0 or hi >= self.num_slots + self.page_size:
            raise ValueError(f"free() got slot {lo if lo < 0 else hi} outside the pool "
                             f"(slots {self.page_size}..{self.num_slots + self.page_size - 1})")
        if lo < self.page_size:
            raise ValueError(f"free() got slot {lo}, which is padding (page 0) and is never handed out")
        pages = self._slots_to_pages(slots)
        k = pages.numel()
        if k > self.num_pages:
            raise ValueError(f"free() got {k} pages but the pool has {self.num_pages}: a slot is repeated (double free)")
        self._free_count.index_add_(0, pages, self._ones[:k])
        if int(self._free_count.index_select(0, pages).max()) > 1:
            self._free_count.index_add_(0, pages, self._ones[:k], alpha=-1)  # undo before raising
            already = self._free_count.index_select(0, pages).bool()
            if bool(already.any()):
                bad = int(pages[already][0]) * self.page_size
                raise ValueError(f"double free: slot {bad} is already free (or was never handed out)")
            raise ValueError("free() got the same slot twice in one call (double free)")
        if self._tail + k > self._buf.numel():
            live = self._buf[self._head:self._tail].clone()
            self._buf[:live.numel()] = live
            self._head, self._tail = 0, live.numel()
        self._buf[self._tail:self._tail + k] = pages
        self._tail += k
        if self.on_event is not None:
            self.on_event("free", slots)

    def is_free_mask(self) -> torch.Tensor:
        """Bool per slot 0..num_slots+page_size-1: True where the slot is in `free_pages`."""
        return self._free_count.bool().repeat_interleave(self.page_size)


class KVPool:
    """k_buffer / v_buffer of shape [layers, slots, kv_heads, head_dim]; slot 0 (page 0) is padding.

    A slot is a column through every layer: the same index addresses one token's K and V in
    each layer, which is why one slot index per token is all the radix tree needs to store.
    """

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: Union[str, torch.device] = "cpu",
                 page_size: int = 1) -> None:
        if num_slots < 1:
            raise ValueError(f"a KV pool needs at least 1 slot, got {num_slots}; raise the pool size")
        shape = (num_layers, num_slots + page_size, num_kv_heads, head_dim)
        self.num_layers, self.num_slots, self.page_size = num_layers, num_slots, page_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.k_buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v_buffer = torch.zeros(shape, dtype=dtype, device=self.device)

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of shape [tokens, kv_heads, head_dim] into `slots` of one layer."""
        self.k_buffer[layer, slots] = k.to(self.dtype)
        self.v_buffer[layer, slots] = v.to(self.dtype)

    def nbytes(self) -> int:
        return self.k_buffer.numel() * self.k_buffer.element_size() * 2

    def k_norms(self) -> torch.Tensor:
        """[layers, slots] L2 norm of the K stored in each slot, the heatmap's cells."""
        return torch.linalg.vector_norm(self.k_buffer.float(), dim=(-2, -1))


class ReqToTokenPool:
    """Request row -> slot indices of its tokens, as SGLang's `req_to_token` table."""

    def __init__(self, max_requests: int, max_context_len: int,
                 device: Union[str, torch.device] = "cpu") -> None:
        if max_requests < 1 or max_context_len < 1:
            raise ValueError("ReqToTokenPool needs max_requests >= 1 and max_context_len >= 1")
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((max_requests, max_context_len), dtype=torch.int64,
                                        device=torch.device(device))
        self._free_rows = list(range(max_requests))

    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> Optional[int]:
        return self._free_rows.pop(0) if self._free_rows else None

    def free(self, row: int) -> None:
        if row in self._free_rows or not 0 <= row < self.req_to_token.shape[0]:
            raise ValueError(f"request row {row} is not in use")
        self.req_to_token[row].zero_()
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        end = start + slots.numel()
        if end > self.max_context_len:
            raise ValueError(f"request needs {end} tokens, more than max_context_len={self.max_context_len}")
        self.req_to_token[row, start:end] = slots

    def read(self, row: int, length: int) -> torch.Tensor:
        return self.req_to_token[row, :length]
