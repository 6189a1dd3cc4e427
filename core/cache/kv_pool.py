"""The K/V pool: `k_buffer` / `v_buffer` of shape [layers, slots, kv_heads, head_dim], slot 0 padding."""
from __future__ import annotations

from typing import Union

import torch


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
