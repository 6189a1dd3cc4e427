"""NativeLlama: the Llama-family forward (Llama, Mistral, Qwen2, Qwen3) written directly against the
KV pool, a drop-in for ModelRunner.forward without transformers' per-layer machinery.

Built from a loaded Hugging Face model (its weights, config and RoPE frequencies are taken as they
are: `rotary_emb.inv_freq` / `attention_scaling` come from transformers' own ROPE_INIT_FUNCTIONS),
then independent of it:

    native = NativeLlama.from_hf(hf_model, dtype="fp32" | "bf16" | "int8")
    pool = native.make_pool(num_slots, page_size)   # a KVPool in native.kv_dtype
    logits = native.forward(batch, pool)            # [R, vocab] float32, ModelRunner.forward's contract

Per layer: one fused QKV matmul, (Qwen3) one RMSNorm over the q and k heads, RoPE from precomputed
tables, one index_copy_ per K and V into the pool, at most one attention call for all decodes and
one for all extends (the int8 model on AMX tiles: one per prompt chunk, a step holds few) (core/engine/model/
native_layers.py: AttentionPlan, built once per forward), o_proj, one
fused gate+up matmul, SiLU*up, down. The LM head runs on the last token of each request only.
On CPU, decode attention reads K/V straight from the pool by slot (core/engine/model/decode_attention.c, built
with the system compiler on first use; torch fallbacks otherwise), and fp32 activations go through
fused C kernels for residual+RMSNorm, RoPE and SiLU*up at every batch size.

Numerics ("dtype"):
  fp32  weights, activations and KV pool fp32: Hugging Face fp32 to ~1e-7 on the test models.
  bf16  weights, activations and KV pool bf16 (fp32 accumulation inside the kernels).
  int8  weight-only int8 (one fp32 scale per output channel) for every projection and the LM head;
        on fp32 activations rounded to 16 significant bits (native_int8.x16): on a CPU the C kernel
        `w8_gemv` for decode-sized batches and, for prefill-sized ones, AMX tiles (`w8_amx_gemm`, x16 as two
        bf16) or, on AVX-512 CPUs without AMX, weight panels (`w8_panel_gemm`): the same exact products
        summed in another order (native_linear.Linear); on CPUs with AVX512-VNNI and without AMX every row
        instead rounded once to int16 (one scale a row) and summed exactly in integers (`w8a16_gemm`,
        NativeLlama.a16: the same bits in any batch). Activations stay fp32; the KV pool is int8 where
        kv8_attention.c runs every attention (AVX512-VNNI or AVX2; NativeLlama.kv8: int8 rows with a scale each, exact
        integer attention, 3.8x fewer bytes than fp32), else fp32 (kv_dtype picks). With an fp32 or bf16 pool,
        where the CPU has AMX (and the model has
        no sliding window and head_dim a multiple of 32), every prompt chunk's attention runs on tiles too,
        one-token chunks included (pool_attention.amx_attention: ~2^-15 of fp32 attention; given the same
        K/V, the same bits however a prompt is chunked or cached; AttentionPlan.tiled; without AMX, on AVX-512 or
        AVX2, fma_attention.c keeps that promise in fp32 FMAs), decodes on the C
        decode kernel; a step of decodes alone runs all its layers in one C call (native_decode.DecodeLayers:
        the same kernels, the same bits, no Python between them).
Sliding windows (Mistral; Qwen2/3 layers typed "sliding_attention") are applied per layer.
Refused (ValueError, route to the Hugging Face path): other families, non-SiLU MLPs, RoPE types
whose frequencies depend on the sequence length (dynamic, longrope).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from core.engine.model import kv8, native_kernels, pool_attention
from core.engine.model.forward_batch import ForwardBatch
from core.cache.kv_pool import KVPool
from core.engine.model.decode_step import decode_step_fn
from core.engine.model.native_decode import DecodeLayers
from core.engine.model.native_linear import Linear, a16_here
from core.engine.model.native_support import layer_windows, unsupported_reason
from core.engine.model.native_layers import (AttentionPlan, apply_rope, attend_decodes, attend_padded,
                                             attend_prefixed, fresh_causal_mask, rope_tables)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}   # activations
KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}
ROPE_TABLE_START = 4096   # RoPE rows built at load; forward doubles them as positions need, up to the model's limit


class _Layer:
    __slots__ = ("input_norm", "post_norm", "qk_norm", "qkv", "o", "gate_up", "down", "window")


class NativeLlama(torch.nn.Module):
    """See the module docstring. Holds its own copies of the weights (fused, converted)."""

    def __init__(self, hf_model: torch.nn.Module, dtype: str = "fp32", kv_dtype: Optional[str] = None,
                 max_positions: Optional[int] = None, cuda_graph: bool = False) -> None:
        super().__init__()
        reason = unsupported_reason(hf_model)
        if reason is not None:
            raise ValueError(f"NativeLlama cannot run {type(hf_model).__name__}: {reason}; use the Hugging Face path")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        cfg = hf_model.config.get_text_config()
        base = hf_model.model
        self.config = cfg
        self.mode = dtype
        self.act_dtype = DTYPES[dtype]
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {kv_dtype!r}: choose one of {', '.join(KV_DTYPES)}")
        self.device = next(hf_model.parameters()).device
        attn0 = base.layers[0].self_attn
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = attn0.head_dim
        windows = layer_windows(cfg)
        shape = (self.num_heads, self.num_kv_heads, self.head_dim)
        self.kv_dtype = KV_DTYPES[kv_dtype] if kv_dtype else (
            torch.int8 if kv8.default_here(dtype, self.device, *shape, windows) else self.act_dtype)
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.scale = float(attn0.scaling)
        self.eps = float(cfg.rms_norm_eps)
        wkind = dtype
        # an int8 pool (kv8_attention.c): every prompt chunk and decode row attends on its kernels
        self.kv8 = self.kv_dtype is torch.int8
        if self.kv8:
            kv8.check_model(self.act_dtype is torch.float32, self.device, *shape, windows)

        def norm_w(w: torch.Tensor) -> torch.Tensor:
            return w.detach().to(self.act_dtype).contiguous()

        def cat_bias(*mods) -> Optional[torch.Tensor]:
            if all(m.bias is None for m in mods):
                return None
            return torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features, device=m.weight.device)
                              for m in mods])

        self.layers: list[_Layer] = []
        # one order of sums for every batch shape (int8 with a bf16 pool without AMX: AVX-512, or AVX2 with
        # w8a16_gemm): every projection on its panels (or w8a16_gemm's exact sums) and decode rows on fma_attention.c's arithmetic, so a token's K/V are the same bits
        # decoded, prefilled in any chunk or batched with anyone, and rounding them to bf16 cannot part cache on
        # from cache off. An fp32 pool keeps the faster decode kernels (cache on == off there by measurement).
        want_one_order = (dtype == "int8" and self.kv_dtype is torch.bfloat16 and self.device.type == "cpu"
                          and all(w is None for w in windows)
                          and pool_attention.prefill_kernel(self.device, self.num_heads, self.num_kv_heads,
                                                            self.head_dim) == "fma")
        want_a16 = dtype == "int8" and a16_here(self.device)   # every projection's rows on w8a16_gemm

        def proj(w: torch.Tensor, b: Optional[torch.Tensor]) -> Linear:
            return Linear(w, b, wkind, want_one_order, want_a16)

        for i, hl in enumerate(base.layers):
            a, m = hl.self_attn, hl.mlp
            L = _Layer()
            L.input_norm = norm_w(hl.input_layernorm.weight)
            L.post_norm = norm_w(hl.post_attention_layernorm.weight)
            if hasattr(a, "q_norm"):   # Qwen3: RMSNorm over each head's D, separate weights for q and k
                L.qk_norm = torch.cat([a.q_norm.weight.detach()[None].expand(self.num_heads, -1),
                                       a.k_norm.weight.detach()[None].expand(self.num_kv_heads, -1)]).to(self.act_dtype)
            else:
                L.qk_norm = None
            L.qkv = proj(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                         cat_bias(a.q_proj, a.k_proj, a.v_proj))
            L.o = proj(a.o_proj.weight, a.o_proj.bias)
            L.gate_up = proj(torch.cat([m.gate_proj.weight, m.up_proj.weight]), cat_bias(m.gate_proj, m.up_proj))
            L.down = proj(m.down_proj.weight, m.down_proj.bias)
            L.window = windows[i]
            self.layers.append(L)
        self.intermediate = self.layers[0].gate_up.out_features // 2
        self.final_norm = norm_w(base.norm.weight)
        emb = base.embed_tokens.weight.detach()
        self.embed = emb.to(self.act_dtype).contiguous()
        head_w = hf_model.lm_head.weight
        tied = head_w.data_ptr() == emb.data_ptr() and wkind != "int8"
        # a row's logits the same bits however many rows the head runs
        self.lm_head = proj(self.embed if tied else head_w, getattr(hf_model.lm_head, "bias", None))
        rotary = base.rotary_emb
        self.max_positions = int(max_positions or getattr(cfg, "max_position_embeddings", 2048))
        # RoPE tables as long as the positions run so far (grown by doubling in forward), not the model's whole
        # limit: a 1M-position Qwen2.5 took 986 MB and 7 s for tables no request of an 8,192-slot pool can read
        self._rope_freq = (rotary.inv_freq.detach().cpu(), float(rotary.attention_scaling))
        self._grow_rope(min(self.max_positions, ROPE_TABLE_START))
        # pure decode steps on CUDA replay captured graphs (native_cuda.py): no per-kernel launch from Python
        self.cuda_graph = bool(cuda_graph) and self.device.type == "cuda"
        self.full_attention = all(L.window is None for L in self.layers)   # no sliding window in any layer
        # the graphs of the pool last run (they bake in its buffers' addresses): a new pool replaces them, so a
        # server rebuild that keeps this model frees the old pool's graphs and the pool they hold
        self.graph_decoder = None
        # every layer's projections on panels (the LM head's too where they fit: it moves logits, not K/V)
        self.one_order = want_one_order and all(lin.matrix is None for L in self.layers
                                                for lin in (L.qkv, L.o, L.gate_up, L.down))
        # every layer's projections on w8a16_gemm (decode_layers.c then runs it too)
        self.a16 = want_a16 and all(L.qkv.a16 and L.o.a16 and L.gate_up.a16 and L.down.a16 for L in self.layers)
        # int8 on a CPU: a pure decode step's layers as one C call (native_decode.py; None turns it off)
        self.decode_layers: Optional[DecodeLayers] = DecodeLayers(self) if DecodeLayers.fits_model(self) else None

    @classmethod
    def from_hf(cls, hf_model: torch.nn.Module, dtype: str = "fp32", **kw) -> "NativeLlama":
        return cls(hf_model, dtype=dtype, **kw)

    def make_pool(self, num_slots: int, page_size: int = 1) -> KVPool:
        return KVPool(self.num_layers, num_slots, self.num_kv_heads, self.head_dim,
                      dtype=self.kv_dtype, device=self.device, page_size=page_size)

    def weight_bytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in (self.embed, self.final_norm, self.cos, self.sin))
        for L in self.layers:
            n += L.qkv.nbytes() + L.o.nbytes() + L.gate_up.nbytes() + L.down.nbytes()
        return n + (0 if self.lm_head.weight is self.embed else self.lm_head.nbytes())

    def decode_step_fn(self, attention: str = "sdpa"):
        """A pure torch function of one decode step, for CUDA graphs and torch.compile (decode_step.py)."""
        return decode_step_fn(self, attention)

    def _grow_rope(self, positions: int) -> None:
        """cos / sin for positions 0..positions-1 (each row the same bits however long the table). The
        decode graphs read the old tables: they are captured again."""
        inv_freq, scaling = self._rope_freq
        cos, sin = rope_tables(inv_freq, scaling, positions, self.act_dtype)
        self.cos, self.sin = cos.to(self.device), sin.to(self.device)
        self.graph_decoder = None

    # ------------------------------------------------------------------ forward
    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Run the new tokens of `batch`, writing their K/V into `pool`; [R, vocab] float32 logits."""
        if pool.dtype != self.kv_dtype:
            raise ValueError(f"the KV pool holds {pool.dtype}, NativeLlama({self.mode}) writes {self.kv_dtype}; "
                             f"make the pool with NativeLlama.make_pool")
        top = max(p + n for p, n in zip(batch.prefix_lens, batch.extend_lens)) - 1
        if top >= self.max_positions:
            raise ValueError(f"position {top} is past the model's {self.max_positions} positions")
        if top >= self.cos.shape[0]:
            self._grow_rope(min(self.max_positions, max(top + 1, 2 * self.cos.shape[0])))
        with torch.inference_mode(), self._sdpa_backends():
            if self.cuda_graph:
                decoder = self.graph_decoder
                if decoder is None or decoder.pool is not pool:
                    from core.engine.model.native_cuda import CudaGraphDecoder
                    # rebinding drops the old pool's graphs; the new decoder captures lazily, in try_run
                    decoder = self.graph_decoder = CudaGraphDecoder(self, pool)
                logits = decoder.try_run(batch)
                if logits is not None:
                    return logits
            return self._forward(batch, pool)

    def _sdpa_backends(self):
        """On CUDA, SDPA without cuDNN's kernel: it builds a plan for every new shape, and a prompt's chunks and a
        growing context are new shapes every step (on an H200, 2.8 ms of host time per call and ~1 s steps while
        plans were built; flash / memory-efficient attention need no plan)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        # short extends as decode-kernel rows (fp32 activations: in bf16 the kernel's fp32 softmax would
        # differ from SDPA's at bf16 rounding, and cache on / off would drift apart)
        row_kernel = self.kv8 or (self.act_dtype == torch.float32 and native_kernels.attention_fits(
            batch.device, self.num_heads, self.num_kv_heads, self.head_dim))
        # int8 on a CPU: every extend's attention on AMX tiles, or on FMAs without AMX (AVX-512 or AVX2; the same
        # promise; AttentionPlan.tiled says why all of them)
        kernel = pool_attention.prefill_kernel(batch.device, self.num_heads, self.num_kv_heads, self.head_dim) \
            if self.mode == "int8" and self.full_attention else None
        if self.one_order:   # the chunks on fma_decode's arithmetic
            kernel = "one_order"
        if self.kv8:
            kernel = "kv8"
        plan = AttentionPlan.build(batch, row_kernel=row_kernel, tiles=kernel is not None)
        t = batch.num_tokens
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        cos = self.cos.index_select(0, batch.positions)[:, None, :]    # [T, 1, D], shared by all layers
        sin = self.sin.index_select(0, batch.positions)[:, None, :]
        out_slots = batch.out_slots
        x = self.embed.index_select(0, batch.input_ids)                   # [T, hidden]
        eps, hidden = self.eps, (self.hidden_size,)
        q_end, k_end = h * d, (h + kvh) * d
        kvd = self.kv_dtype
        kv_cast = kvd != self.act_dtype
        # fp32 activations on a CPU: residual add + RMSNorm, RoPE and SiLU*up as single C calls
        # (core/engine/model/fused_elementwise.c), for every batch size: at decode each replaces 6-8 torch ops of
        # ~5 us dispatch each, at prefill 3-5 passes over memory; a row's result does not depend on the batch
        # it is in, so these kernels add no batch dependence of their own (the int8 projections' sums do, by
        # fp32 rounding: native_linear.Linear).
        fused = self.act_dtype == torch.float32 and x.device.type == "cpu" and native_kernels.available()
        cos2, sin2 = cos[:, 0], sin[:, 0]                               # [T, D] for native_kernels.rope

        def resid_norm(x: torch.Tensor, delta: Optional[torch.Tensor], w: torch.Tensor):
            if fused:
                return x, native_kernels.add_rms_norm(x, delta, w, eps)   # x += delta in place
            if delta is not None:
                x = x + delta
            return x, F.rms_norm(x, hidden, w, eps)

        inter = self.intermediate
        layers = self.layers
        x, y = resid_norm(x, None, layers[0].input_norm)
        if fused and self.decode_layers is not None and DecodeLayers.fits_step(plan, t, self.a16):   # all layers, one C call
            self.decode_layers.run(x, y, cos2, sin2, out_slots, plan, pool)
        else:
            for li, L in enumerate(layers):
                qkv = L.qkv(y)                                                # [T, (H + 2 KVH) D]
                qk = qkv[:, :k_end].view(t, h + kvh, d)
                if L.qk_norm is not None:
                    qk = F.rms_norm(qk, (d,), None, eps) * L.qk_norm
                qk = native_kernels.rope(qk, cos2, sin2) if fused else apply_rope(qk, cos, sin)
                q, k = qk[:, :h], qk[:, h:]
                v = qkv[:, k_end:].view(t, kvh, d)
                k_buf, v_buf = pool.k_buffer[li], pool.v_buffer[li]
                scales = None
                if self.kv8:   # int8 rows and their scales; every read below is of those
                    scales = (pool.k_scale[li], pool.v_scale[li])
                    kv8.kv8_store(k, k_buf, scales[0], out_slots)
                    kv8.kv8_store(v, v_buf, scales[1], out_slots)
                elif kv_cast:   # what the pool holds is what every later read sees: attend to that, too
                    k, v = k.to(kvd), v.to(kvd)
                    k_buf.index_copy_(0, out_slots, k)
                    v_buf.index_copy_(0, out_slots, v)
                    k, v = k.to(self.act_dtype), v.to(self.act_dtype)
                else:
                    k_buf.index_copy_(0, out_slots, k)
                    v_buf.index_copy_(0, out_slots, v)
                o = self._attention(plan, q, k, v, k_buf, v_buf, L.window, kernel, scales)  # [T, H, D]
                x, y = resid_norm(x, L.o(o.reshape(t, q_end)), L.post_norm)
                if fused:
                    act = L.gate_up.silu_mul(y)
                else:
                    gu = L.gate_up(y)
                    act = F.silu(gu[:, :inter]) * gu[:, inter:]
                delta = L.down(act)
                if li + 1 < len(layers):
                    x, y = resid_norm(x, delta, layers[li + 1].input_norm)
                else:
                    x = x + delta
        last = x.index_select(0, batch.logits_indices)
        return self.lm_head(F.rms_norm(last, hidden, self.final_norm, eps)).float()

    def _decodes(self, dec, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, window: Optional[int],
                 kernel: Optional[str], scales: Optional[tuple] = None) -> torch.Tensor:
        """Decode rows' attention: over an int8 pool on kv8_decode, with one order of sums on fma_attention.c's
        arithmetic (a token's attention the same bits decoded or prefilled either way), else on the decode
        kernel."""
        if kernel == "kv8":
            rd = q.shape[0]
            return kv8.kv8_decode(q, k_buf, v_buf, *scales, dec.slots.view(rd, dec.kv_len), dec.seq_lens, self.scale)
        if kernel == "one_order" and dec.segments is None:
            rd = q.shape[0]
            return pool_attention.fma_decode(q, k_buf, v_buf, dec.slots.view(rd, dec.kv_len), dec.seq_lens,
                                             self.scale)
        return attend_decodes(dec, q, k_buf, v_buf, window, self.scale)

    def _attention(self, plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   k_buf: torch.Tensor, v_buf: torch.Tensor, window: Optional[int],
                   kernel: Optional[str], scales: Optional[tuple] = None) -> torch.Tensor:
        """One layer's attention for the plan's rows; `kernel` (pool_attention.prefill_kernel, picked once a
        forward, or "kv8" over an int8 pool, whose `scales` are (k_scale, v_scale) of the layer) attends
        plan.tiled's chunks."""
        t, h, d = q.shape
        gqa = h != k.shape[1]
        dec = plan.decodes
        if dec is not None and plan.decode_idx is None:   # a pure decode batch: the common step
            return self._decodes(dec, q, k_buf, v_buf, window, kernel, scales)
        out = q.new_empty((t, h, d))
        if dec is not None:
            o = self._decodes(dec, q.index_select(0, plan.decode_idx), k_buf, v_buf, window, kernel, scales)
            out.index_copy_(0, plan.decode_idx, o)
        for s, n, seq_slots in plan.tiled:   # K/V read from the pool (this step's were written above)
            o = (kv8.kv8_attention(q[s:s + n], k_buf, v_buf, *scales, seq_slots, self.scale) if kernel == "kv8"
                 else pool_attention.attention_pool(kernel, q[s:s + n], k_buf, v_buf, seq_slots, self.scale))
            if s == 0 and n == t:
                return o
            out[s:s + n] = o
        if plan.fresh is not None:
            s, n = plan.fresh
            mask = fresh_causal_mask(n, window, q.device)
            # 4-D inputs: with 3-D ones CPU SDPA takes the O(n^2)-memory math path (4x slower at n=1024)
            o = F.scaled_dot_product_attention(
                q[s:s + n].transpose(0, 1)[None], k[s:s + n].transpose(0, 1)[None], v[s:s + n].transpose(0, 1)[None],
                attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=gqa)[0]   # [H, n, D]
            if s == 0 and n == t:
                return o.transpose(0, 1)
            out[s:s + n] = o.transpose(0, 1)
        if plan.prefixed is not None and window is None and q.device.type == "cpu":
            s, n, prefix = plan.prefixed
            o = attend_prefixed(plan.extends[0], prefix, q[s:s + n], k[s:s + n], v[s:s + n], k_buf, v_buf,
                                self.scale)
            if s == 0 and n == t:
                return o
            out[s:s + n] = o
            return out
        for p in plan.extends:
            qp = q if p.q_index is None else q.index_select(0, p.q_index)
            o = attend_padded(p, qp, k_buf, v_buf, window, self.scale)
            if p.out_index is None and p.q_index is None:
                return o
            if p.valid is None:
                out.index_copy_(0, p.q_index, o)
            else:
                out.index_copy_(0, p.out_index, o[p.valid])
        return out

