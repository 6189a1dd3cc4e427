"""The K/V pool: `k_buffer` / `v_buffer` of shape [layers, slots, kv_heads, head_dim], slot 0 padding."""
from __future__ import annotations

from typing import Optional, Union

import torch

INT8_MAX = 127.0


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of x [..., head_dim] as int8 with one fp32 scale a row: s = max|x| / 127, values round(x / s) (ties to
    even); a zero row gets scale 0, a row holding NaN or inf scale NaN and values 0. The bits kv8_attention.c's
    kv8_store writes (tested), so a token's K/V are the same whichever path stored them."""
    x = x.float()
    amax = x.abs().amax(dim=-1)
    amax = torch.where(torch.isfinite(x).all(dim=-1), amax, torch.full_like(amax, float("nan")))
    scale = amax / INT8_MAX
    ok = scale > 0                                     # False for NaN, zero and underflow
    safe = torch.where(ok, scale, torch.ones_like(scale))
    q = torch.where(ok[..., None], torch.round(x / safe[..., None]), torch.zeros_like(x)).to(torch.int8)
    return q, torch.where(ok | torch.isnan(scale), scale, torch.zeros_like(scale))


class KVPool:
    """k_buffer / v_buffer of shape [layers, slots, kv_heads, head_dim]; slot 0 (page 0) is padding.

    A slot is a column through every layer: the same index addresses one token's K and V in
    each layer, which is why one slot index per token is all the radix tree needs to store.
    With dtype int8 each (layer, slot, head) row also has an fp32 scale in `k_scale` / `v_scale`
    ([layers, slots, kv_heads]; None otherwise): the stored value is buffer x scale.
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
        self.k_scale: Optional[torch.Tensor] = None
        self.v_scale: Optional[torch.Tensor] = None
        if dtype is torch.int8:
            self.k_scale = torch.zeros(shape[:3], dtype=torch.float32, device=self.device)
            self.v_scale = torch.zeros(shape[:3], dtype=torch.float32, device=self.device)

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of shape [tokens, kv_heads, head_dim] into `slots` of one layer."""
        if self.k_scale is None:
            self.k_buffer[layer, slots] = k.to(self.dtype)
            self.v_buffer[layer, slots] = v.to(self.dtype)
            return
        for buf, scales, x in ((self.k_buffer, self.k_scale, k), (self.v_buffer, self.v_scale, v)):
            q, s = quantize_int8(x)
            buf[layer, slots] = q
            scales[layer, slots] = s

    def nbytes(self) -> int:
        scales = 0 if self.k_scale is None else self.k_scale.numel() * 4 * 2
        return self.k_buffer.numel() * self.k_buffer.element_size() * 2 + scales

    def k_values(self, slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The K each slot holds, [layers, slots, kv_heads, head_dim] fp32 (all slots, or `slots`'), scales applied."""
        k = self.k_buffer if slots is None else self.k_buffer[:, slots]
        if self.k_scale is None:
            return k.float()
        s = self.k_scale if slots is None else self.k_scale[:, slots]
        return k.float() * s[..., None]

    def k_norms(self, slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[layers, slots] L2 norm of the K stored in each slot (all, or `slots`'), the heatmap's cells."""
        return torch.linalg.vector_norm(self.k_values(slots), dim=(-2, -1))
