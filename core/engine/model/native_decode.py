"""DecodeLayers: a decode step's decoder layers as one C call (decode_layers.c), for the int8 model on a CPU; and a
mixed step's (its decodes beside one short prompt chunk attending on AMX tiles: a long prompt's chunks while
streams decode).

Why: the Python loop of NativeLlama makes ~12 kernel calls a layer, each with its checks and its output
allocation (~2 ms of a ~9 ms step for the default model), and holds the GIL in between. decode_layers.c runs the
same kernels in the same order on the same inputs as the loop does below many_rows(), so the logits are the same
bits there (tests/engine/model/test_decode_layers.py); from 12 to 15 rows on AMX the loop would run its projections
on the tiles, so the one call's logits differ from the loop's by fp32 rounding (~1e-5) there. This module checks
the step's tensors once and hands C the addresses it reads.

Taken for int8 weights on fp32 activations with the C kernels built, no sliding window, no Qwen3 q/k norm, and
either every row a decode (no extend, no decode-kernel extend runs), fewer rows than `max_rows()`: where the Python
loop would run exactly these kernels, and for 12-15 decode rows on AMX, where the loop's projections would go to
the tiles (AMX_MIN_ROWS) but one C call on the FMA kernel measured faster (batch 12 at 544 tokens: 306 tok/s as
one call, 293 on the tiles; from 16 the tiles win, 344 vs 336, and 1.15x at 24: benchmarks/README.md, "Mixed
steps"); or decodes and one prompt chunk on the tiles, fewer rows than `many_rows()` (the loop's own kernels,
so the same bits: tested).
"""
from __future__ import annotations

from typing import Protocol

import torch

from core.cache.kv_pool import KVPool
from core.engine.model import native_kernels, pool_attention
from core.engine.model.native_layers import AttentionPlan, decode_launch
from core.engine.model.native_linear import many_rows

DECODE_ROWS_MAX = 16   # a pure decode step of fewer rows runs as one C call even where the loop would use tiles


def max_rows(a16: bool = False) -> int:
    """The rows from which a pure decode step leaves the one C call for the Python loop (`a16`: NativeLlama.a16)."""
    return max(many_rows(a16), DECODE_ROWS_MAX)


class DecodeModel(Protocol):
    """What DecodeLayers reads of a NativeLlama (which imports this module, so it is not imported here)."""
    mode: str
    device: torch.device
    full_attention: bool
    layers: list
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    one_order: bool   # every projection on its panels and decode rows on fma_decode (NativeLlama.one_order)
    a16: bool   # every projection on w8a16_gemm (NativeLlama.a16)
    kv8: bool   # an int8 pool: kv8_attention.c stores and attends (NativeLlama.kv8)

LAYER_POINTERS = 18   # decode_layers.c's DL_PTRS: 4 projections x (weight, scales, bias), 2 norms, K, V, K/V scales
KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}   # decode_layers.c's kv_kind


class DecodeLayers:
    """The per-layer address table of one NativeLlama; `run` does one step's layers."""

    def __init__(self, model: DecodeModel) -> None:
        self.model = model
        self.weights = torch.zeros((model.num_layers, LAYER_POINTERS), dtype=torch.int64)
        for li, L in enumerate(model.layers):
            row = []
            for lin in (L.qkv, L.o, L.gate_up, L.down):
                row.extend(lin.decode_pointers())
            nxt = model.layers[li + 1].input_norm.data_ptr() if li + 1 < model.num_layers else 0
            row.extend([L.post_norm.data_ptr(), nxt])
            self.weights[li, :14] = torch.tensor(row, dtype=torch.int64)
        self._tables: tuple = (None, self.weights)   # (pool key, its table), replaced whole: one read per step

    @staticmethod
    def fits_model(model: DecodeModel) -> bool:
        """Whether this model's decode steps can run here at all (the per-step test is `fits_step`)."""
        return (model.mode == "int8" and model.device.type == "cpu" and model.full_attention
                and native_kernels.available()
                and (model.kv8 or native_kernels.attention_fits(model.device, model.num_heads, model.num_kv_heads,
                                                                model.head_dim))
                and all(L.qk_norm is None for L in model.layers)
                and (model.one_order or model.a16 or all(lin.matrix is not None for L in model.layers
                                            for lin in (L.qkv, L.o, L.gate_up, L.down))))

    @staticmethod
    def fits_step(plan: AttentionPlan, rows: int, a16: bool = False) -> bool:
        """Whether the Python loop would run this batch on w8_gemv (w8a16_gemm with `a16`), the decode kernel and
        (a mixed step) one prefill attention call alone (AMX tiles or FMAs)."""
        dec = plan.decodes
        if (plan.extends or plan.fresh is not None or plan.prefixed is not None
                or (dec is not None and (dec.segments is not None or not dec.slots.is_contiguous()))):
            return False
        if not plan.tiled:   # a pure decode step
            return dec is not None and plan.decode_idx is None and rows < max_rows(a16)
        # a mixed step: below many_rows() the loop's projections stay on w8_gemv, as the one call's do; its chunk
        # on the kernel the loop's prefill_kernel picks (AMX tiles, or FMAs without AMX)
        return len(plan.tiled) == 1 and rows < many_rows(a16)

    def _layer_table(self, pool: KVPool) -> torch.Tensor:
        """The address table with this pool's K/V layers. Read once and replaced whole: another engine stepping on
        this model with another pool at the same time never gets a table of the wrong pool. Keyed on every
        address it holds: a new pool can get a freed pool's K/V addresses but not its scales', and a table
        keyed on K/V alone then had C read and write the freed scales (wrong tokens, a corrupted heap)."""
        ks, vs = pool.k_scale, pool.v_scale
        key = (pool.k_buffer.data_ptr(), pool.v_buffer.data_ptr(), pool.k_buffer.shape, pool.k_buffer.dtype,
               None if ks is None else (ks.data_ptr(), ks.shape), None if vs is None else (vs.data_ptr(), vs.shape))
        cached_key, table = self._tables
        if key != cached_key:
            kb, vb = pool.k_buffer, pool.v_buffer
            m = self.model
            scales_ok = (ks is None) if kb.dtype is not torch.int8 else (
                ks is not None and vs is not None and ks.shape == vs.shape == kb.shape[:3] and ks.is_contiguous()
                and vs.is_contiguous() and ks.dtype is vs.dtype is torch.float32)
            if not (kb.is_contiguous() and vb.is_contiguous() and kb.is_cpu and vb.shape == kb.shape
                    and vb.dtype is kb.dtype and kb.dtype in KV_KINDS and scales_ok and (kb.dtype is torch.int8) == m.kv8
                    and kb.dim() == 4 and kb.shape[0] == m.num_layers
                    and tuple(kb.shape[2:]) == (m.num_kv_heads, m.head_dim)):
                raise ValueError(f"decode_layers reads contiguous fp32, bf16 or (with their scales) int8 CPU K/V "
                                 f"buffers [{m.num_layers}, slots, {m.num_kv_heads}, {m.head_dim}] in the dtype the "
                                 f"model writes (NativeLlama.make_pool), got {kb.dtype} {tuple(kb.shape)}, "
                                 f"{vb.dtype} {tuple(vb.shape)}")
            table = self.weights.clone()
            layers = range(self.model.num_layers)
            table[:, 14] = torch.tensor([kb[li].data_ptr() for li in layers])
            table[:, 15] = torch.tensor([vb[li].data_ptr() for li in layers])
            if ks is not None:
                table[:, 16] = torch.tensor([ks[li].data_ptr() for li in layers])
                table[:, 17] = torch.tensor([vs[li].data_ptr() for li in layers])
            self._tables = (key, table)
        return table

    def run(self, x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_slots: torch.Tensor,
            plan: AttentionPlan, pool: KVPool) -> None:
        """Every layer of one decode step: x [R, hidden] (the residual stream, updated in place), y [R, hidden]
        (layer 0's normed input; overwritten), cos / sin [R, D] (each row's RoPE), out_slots [R] (where each
        row's K/V go). After it, x is what the Python loop leaves before the final norm."""
        m = self.model
        r, hidden = x.shape
        h, kvh, d, inter = m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate
        p = plan.decodes
        rd = p.rows if p is not None else 0
        chunk_at, chunk_n, chunk_slots = plan.tiled[0] if plan.tiled else (0, 0, None)
        if (hidden != m.layers[0].o.out_features or rd + chunk_n != r or len(plan.tiled) > 1
                or (p is not None and p.slots.numel() != rd * p.kv_len)):
            raise ValueError(f"decode_layers: {r} rows of {hidden} for a model of hidden size "
                             f"{m.layers[0].o.out_features} and a plan of {rd} decodes and {len(plan.tiled)} chunks "
                             f"({chunk_n} rows); build both from one batch")
        for name, t, shape in (("x", x, (r, hidden)), ("y", y, (r, hidden)), ("cos", cos, (r, d)),
                               ("sin", sin, (r, d))):
            if t.dtype is not torch.float32 or t.shape != shape or not t.is_contiguous() or not t.is_cpu:
                raise ValueError(f"decode_layers: {name} must be contiguous fp32 {shape}, got {t.dtype} "
                                 f"{tuple(t.shape)}")
        table = self._layer_table(pool)
        slots_in_pool = pool.k_buffer.shape[1]
        if (out_slots.dtype is not torch.int64 or out_slots.shape != (r,) or not out_slots.is_contiguous()
                or int(out_slots.min()) < 0 or int(out_slots.max()) >= slots_in_pool):
            raise ValueError(f"decode_layers: out_slots must be {r} contiguous int64 slots of the pool "
                             f"(0 .. {slots_in_pool - 1})")
        mixed = self._mixed_args(plan, r, slots_in_pool) if plan.tiled else (0, 0, 0, 0, 0, 0)
        lib = native_kernels.built()
        # per call (tens of KB): two engines sharing this model may step at once, the GIL let go
        workspace = torch.empty(lib.decode_layers_workspace(r, hidden, h, kvh, d, inter), dtype=torch.float32)
        if p is not None and m.kv8:   # kv8_decode splits rows itself
            decodes = (p.slots.data_ptr(), 0, p.seq_lens.data_ptr(), p.kv_len, 0, 0, 0)
        elif p is not None:
            _, row_chunks, nchunks, scratch = decode_launch(p, h, kvh, d)
            first, lens = p.first_key(None), p.seq_lens
            decodes = (p.slots.data_ptr(), first.data_ptr(), lens.data_ptr(), p.kv_len, row_chunks.data_ptr(), nchunks,
                       scratch.data_ptr())
        else:   # a prompt chunk alone
            decodes = (0, 0, 0, 0, 0, 0, 0)
        lib.decode_layers(x.data_ptr(), y.data_ptr(), table.data_ptr(), m.num_layers, cos.data_ptr(), sin.data_ptr(),
                          out_slots.data_ptr(), *decodes, KV_KINDS[pool.k_buffer.dtype],
                          workspace.data_ptr(), r, hidden, h, kvh, d, inter, m.eps, m.scale, *mixed,
                          int(pool_attention.prefill_kernel(pool.device, h, kvh, d) == "amx"), int(m.one_order),
                          int(m.a16))

    @staticmethod
    def _mixed_args(plan: AttentionPlan, rows: int, slots_in_pool: int) -> tuple:
        """(decode rows, their count, chunk start, chunk rows, chunk key slots, chunk keys) of a mixed step, checked:
        the decodes and the chunk cover the rows once, the chunk's keys are pool slots and include its own."""
        at, n, keys = plan.tiled[0]
        idx = plan.decode_idx if plan.decodes is not None else torch.empty(0, dtype=torch.int64)
        ok = (idx.dtype is torch.int64 and idx.is_contiguous() and keys.dtype is torch.int64 and keys.is_contiguous()
              and 0 <= at and n > 0 and at + n <= rows and keys.numel() >= n
              and int(keys.min()) >= 0 and int(keys.max()) < slots_in_pool
              and (not idx.numel() or (int(idx.min()) >= 0 and int(idx.max()) < rows)))
        if ok:
            covered = torch.zeros(rows, dtype=torch.int64)
            covered.index_add_(0, idx, torch.ones_like(idx))
            covered[at:at + n] += 1
            ok = bool((covered == 1).all())
        if not ok:
            raise ValueError("decode_layers: a mixed step's decode rows and prompt chunk must cover its rows once, "
                             f"its chunk's keys be int64 slots of the pool (0 .. {slots_in_pool - 1}); build the plan "
                             "with AttentionPlan.build")
        return (idx.data_ptr() if idx.numel() else 0, idx.numel(), at, n, keys.data_ptr(), keys.numel())
