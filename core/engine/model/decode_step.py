"""One decode step of NativeLlama as a pure torch function: what CUDA graphs capture (native_cuda.py) and
torch.compile traces (benchmarks/bench_native_compile.py). It reads the model's prepared weights and tables and
runs none of the C kernels or host-side plans of NativeLlama.forward, so its shapes come from its inputs alone."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from core.engine.model.native_layers import apply_rope


def decode_step_fn(native: torch.nn.Module, attention: str = "sdpa") -> Callable:
    """A pure torch function of one decode step of `native` (a NativeLlama: this module is below it, so it
    names no type of it), for CUDA graphs and torch.compile:

        step(ids [R], pos [R], out_slots [R], slots [R, L], lens [R], k_cache, v_cache) -> [R, vocab] fp32

    k_cache / v_cache are the pool's whole buffers ([layers, slots, KVH, D]); request r attends
    slots[r, :lens[r]] (its new token's slot included; padding reads slot 0, masked). No Python
    data-dependent branch, no host sync, no C kernel: every shape comes from the inputs.
    attention "sdpa": gather + F.scaled_dot_product_attention (CUDA's kernels); "sum": gather
    written as broadcast multiply + sum, which inductor fuses into one loop over the pool rows.
    """
    if native.kv8:
        raise ValueError("decode_step_fn reads the pool as plain tensors; an int8 pool (kv_dtype 'int8') has "
                         "scales beside them: use kv_dtype fp32 or bf16 for CUDA graphs and torch.compile")
    h, kvh, d, eps = native.num_heads, native.num_kv_heads, native.head_dim, native.eps
    hidden = (native.hidden_size,)
    g, inter, scale, act, kvd = h // kvh, native.intermediate, native.scale, native.act_dtype, native.kv_dtype
    layers, embed, cos_t, sin_t = native.layers, native.embed, native.cos, native.sin
    final_norm, head = native.final_norm, native.lm_head
    windows = sorted({L.window for L in layers}, key=lambda w: -1 if w is None else w)

    def step(ids, pos, out_slots, slots, lens, k_cache, v_cache):
        r, lmax = slots.shape
        x = embed[ids]
        cos, sin = cos_t[pos][:, None, :], sin_t[pos][:, None, :]
        cols = torch.arange(lmax, device=slots.device)[None, :]
        ok = {w: (cols < lens[:, None]) if w is None else (cols < lens[:, None]) & (cols >= lens[:, None] - w)
              for w in windows}                                              # [R, L] per window
        if attention == "sdpa":   # additive masks once per step, not per layer (two kernels a layer fewer)
            masks = {w: torch.zeros((r, 1, 1, lmax), dtype=act, device=x.device).masked_fill_(
                ~visible[:, None, None, :], float("-inf")) for w, visible in ok.items()}
        for li, L in enumerate(layers):
            y = F.rms_norm(x, hidden, L.input_norm, eps)
            qkv = L.qkv(y)
            qk = qkv[:, :(h + kvh) * d].view(r, h + kvh, d)
            if L.qk_norm is not None:
                qk = F.rms_norm(qk, (d,), None, eps) * L.qk_norm
            qk = apply_rope(qk, cos, sin)
            q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + kvh) * d:].view(r, kvh, d)
            k_cache[li].index_copy_(0, out_slots, k.to(kvd))
            v_cache[li].index_copy_(0, out_slots, v.to(kvd))
            kk, vv = k_cache[li][slots].to(act), v_cache[li][slots].to(act)   # [R, L, KVH, D]
            if attention == "sdpa":
                o = F.scaled_dot_product_attention(q[:, :, None, :], kk.transpose(1, 2), vv.transpose(1, 2),
                                                   attn_mask=masks[L.window], scale=scale, enable_gqa=g > 1)
                o = o.reshape(r, h * d)
            else:
                s = (q.view(r, 1, kvh, g, d).float() * kk[:, :, :, None, :].float()).sum(-1) * scale
                s = s.masked_fill(~ok[L.window][:, :, None, None], float("-inf"))
                p = torch.softmax(s, dim=1)                                  # over L
                o = (p[..., None] * vv[:, :, :, None, :].float()).sum(1).to(act).reshape(r, h * d)
            x = x + L.o(o)
            y = F.rms_norm(x, hidden, L.post_norm, eps)
            gu = L.gate_up(y)
            x = x + L.down(F.silu(gu[:, :inter]) * gu[:, inter:])
        return head(F.rms_norm(x, hidden, final_norm, eps)).float()

    return step
