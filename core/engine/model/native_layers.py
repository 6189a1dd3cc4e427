"""Building blocks of the native Llama-family forward (core/engine/model/native_llama.py): RoPE tables and the
attention plan of one ForwardBatch (the projections: core/engine/model/native_linear.py).

Everything here is plain torch ops, chosen for CPU decode, where one forward of a small model is a
few hundred ops and every op and every copy shows:

* `rope_tables`: cos / sign-folded sin for every position, computed once as Hugging Face does
  (float32 `position * inv_freq`, `cos`, `sin`, times `attention_scaling`), so RoPE costs two
  multiplies, a roll and an add per layer, bit-identical to `apply_rotary_pos_emb`.
* `AttentionPlan`: the gather indices and masks of a batch, built once per forward and shared by
  every layer; `attend` then runs at most one attention call for all decodes and one for all
  extends (the few cases that would pad too much fall back to the batch's own padded groups).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from core.engine.model import native_kernels
from core.engine.model.forward_batch import ForwardBatch

# An all-extends padded call may cost at most this many times the attention work of the requests
# run alone (same rule, same value, as ForwardBatch's own extend groups).
PAD_FACTOR = 2.0


def rope_tables(inv_freq: torch.Tensor, attention_scaling: float, num_positions: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [P, D] and sign-folded sin [P, D] (first half negated) for positions 0..P-1.

    Hugging Face: freqs = position.float() * inv_freq; emb = cat(freqs, freqs); cos = emb.cos() *
    scaling, cast to the activations' dtype. `x * cos + roll(x, D/2) * sin_signed` then equals
    `x * cos + rotate_half(x) * sin` bit for bit ((-a) * b == -(a * b) in IEEE arithmetic).
    """
    pos = torch.arange(num_positions, dtype=torch.int64).float()
    freqs = pos[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * attention_scaling).to(dtype)
    sin = (emb.sin() * attention_scaling).to(dtype)
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.contiguous(), sin.contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, 1, D] from `rope_tables`."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin


def _additive(ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, float("-inf"))


@dataclass(eq=False)
class Padded:
    """Requests attended in one padded call: queries padded to q_len, keys to kv_len."""

    rows: int
    q_len: int
    kv_len: int
    q_index: Optional[torch.Tensor]  # [rows * q_len] flat token of each padded query; None: all tokens, in order
    slots: torch.Tensor              # [rows * kv_len] pool slot of each padded key (pads read slot 0)
    q_pos: torch.Tensor              # [rows, q_len] position of each padded query
    seq_lens: torch.Tensor           # [rows]
    valid: Optional[torch.Tensor]    # [rows * q_len] real queries; None: all are
    out_index: Optional[torch.Tensor]  # [real] flat token of each real query; None when valid is None
    cache: dict = field(default_factory=dict)
    segments: Optional[torch.Tensor] = None  # one-query rows only: [runs + 1] row starts of each request's rows

    def mask(self, window: Optional[int], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """[rows, 1, q_len, kv_len] additive mask (causal, window, padding), or None when every key
        of every query is visible (plain decodes of one length, no window)."""
        key = ("mask", window, dtype)
        if key not in self.cache:
            k_pos = torch.arange(self.kv_len, device=self.slots.device)[None, None, :]
            q_pos = self.q_pos[:, :, None]
            ok = k_pos <= q_pos                   # q_pos < seq_len, so this also masks padded keys
            if window is not None:
                ok = ok & (k_pos > q_pos - window)
            self.cache[key] = None if bool(ok.all()) else _additive(ok, dtype)[:, None]
        return self.cache[key]

    def first_key(self, window: Optional[int]) -> torch.Tensor:
        """[rows] first visible key of each decode (0, or seq_len - window inside a sliding window)."""
        key = ("first", window)
        if key not in self.cache:
            lens = self.seq_lens
            self.cache[key] = (torch.zeros_like(lens) if window is None
                               else (lens - window).clamp(min=0)).contiguous()
        return self.cache[key]

    def buffer(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A scratch tensor reused by every layer of this forward (no per-layer allocation)."""
        key = ("buf", name, shape, dtype)
        if key not in self.cache:
            self.cache[key] = torch.empty(shape, dtype=dtype, device=self.slots.device)
        return self.cache[key]


def _padded(batch: ForwardBatch, rows: list[int], all_tokens: bool) -> Padded:
    dev = batch.device
    ns = torch.tensor([batch.extend_lens[r] for r in rows], dtype=torch.int64)
    ps = torch.tensor([batch.prefix_lens[r] for r in rows], dtype=torch.int64)
    starts = torch.tensor([batch.extend_starts[r] for r in rows], dtype=torch.int64)
    q_len, kv_len = int(ns.max()), int((ns + ps).max())
    i = torch.arange(q_len)[None, :]
    step = torch.minimum(i, ns[:, None] - 1)          # pads repeat the request's last query
    table = torch.zeros((len(rows), kv_len), dtype=torch.int64, device=dev)
    for b, r in enumerate(rows):
        s = batch.seq_slots[r]
        table[b, : s.numel()] = s
    valid = (i < ns[:, None]).reshape(-1)
    q_index = (starts[:, None] + step).reshape(-1)
    whole = bool(valid.all())
    return Padded(rows=len(rows), q_len=q_len, kv_len=kv_len,
                  q_index=None if all_tokens and whole else q_index.to(dev),
                  slots=table.reshape(-1), q_pos=(ps[:, None] + step).to(dev),
                  seq_lens=(ns + ps).to(dev), valid=None if whole else valid.to(dev),
                  out_index=None if whole else q_index[valid].to(dev))


@dataclass(eq=False)
class AttentionPlan:
    """What every layer's attention needs from one ForwardBatch, computed once per forward.

    * decodes: all one-token requests, one call: the C kernel over pool slots (no gather), or
      a padded gather + SDPA where the kernel is unavailable.
    * fresh: a single request with no cached prefix: its own new K/V, `is_causal`, no gather.
    * extends: all other multi-token requests in one padded call (gather + SDPA), unless padding
      would cost more than PAD_FACTOR times the real work; then the batch's own groups (few calls).
    * prefixed: when those are one request after a cached prefix, layers without a sliding window run
      `attend_prefixed` (prefix keys and own keys in two flash calls) instead of its padded call.
    * tiled (build's `tiles`: the int8 model with AMX attention, no sliding window): every prompt chunk
      (the batch's extends and its `prompt_rows`, one-token chunks included), long or short, cached prefix or
      not, in its own pool_attention.amx_attention call, the decodes as above. One kernel for every prompt
      token, so a token's attention does not depend on how its prompt was chunked or cached (the decode
      kernel and the tiles differ by ~1e-5; mixing them flipped greedy tokens).
    """

    num_tokens: int
    decodes: Optional[Padded] = None
    decode_idx: Optional[torch.Tensor] = None   # [Rd] flat token of each decode; None: all tokens
    fresh: Optional[tuple[int, int]] = None     # (start, length) of a lone uncached extend
    extends: list[Padded] = field(default_factory=list)
    prefixed: Optional[tuple[int, int, int]] = None   # (start, length, prefix) of a lone extend after a prefix
    tiled: list[tuple[int, int, torch.Tensor]] = field(default_factory=list)   # (start, length, sequence slots)

    @classmethod
    def build(cls, batch: ForwardBatch, row_kernel: bool = False, tiles: bool = False) -> "AttentionPlan":
        """`row_kernel`: the C decode kernel can run this model's attention (CPU, its shapes); then
        short extends (at most ROW_KERNEL_MAX_QUERIES new tokens, a cached prefix or company in the
        batch) join the decodes, one kernel row per query token, reading their keys from the pool
        in place: a chunk of a long prompt then costs its own queries, not a gather of its whole
        prefix in every layer (what kept a decoding stream waiting behind a long prefill)."""
        plan = cls(num_tokens=batch.num_tokens)
        rows = batch.extend_rows
        if tiles and (rows or batch.prompt_rows):
            plan.tiled = [(batch.extend_starts[r], batch.extend_lens[r], batch.seq_slots[r])
                          for r in sorted(set(rows) | batch.prompt_rows)]
            decodes = [r for r in batch.decode_rows if r not in batch.prompt_rows]
            if decodes:
                plan.decodes = (_query_rows(batch, decodes) if row_kernel else _padded(batch, decodes, all_tokens=False))
                plan.decode_idx = plan.decodes.q_index
            return plan
        if row_kernel:
            lone_fresh = len(rows) == 1 and batch.prefix_lens[rows[0]] == 0 and not batch.decode_rows
            short = [] if lone_fresh else [r for r in rows if batch.extend_lens[r] <= ROW_KERNEL_MAX_QUERIES]
            if short:
                as_rows = set(short)
                rows = [r for r in rows if r not in as_rows]
                plan.decodes = _query_rows(batch, sorted(batch.decode_rows + short))
                plan.decode_idx = plan.decodes.q_index
                if plan.decode_idx is None:
                    return plan
        if batch.decode_rows and plan.decodes is None:
            pure = len(batch.decode_rows) == batch.num_requests
            plan.decodes = _padded(batch, batch.decode_rows, all_tokens=pure)
            plan.decode_idx = None if pure else plan.decodes.q_index
        if not rows:
            return plan
        if len(rows) == 1 and batch.prefix_lens[rows[0]] == 0:
            r = rows[0]
            plan.fresh = (batch.extend_starts[r], batch.extend_lens[r])
            return plan
        real = sum(batch.extend_lens[r] * batch.seq_slots[r].numel() for r in rows)
        q_max = max(batch.extend_lens[r] for r in rows)
        l_max = max(batch.seq_slots[r].numel() for r in rows)
        if len(rows) * q_max * l_max <= PAD_FACTOR * real:
            plan.extends = [_padded(batch, rows, all_tokens=not batch.decode_rows and plan.decodes is None)]
            if len(rows) == 1:
                r = rows[0]
                plan.prefixed = (batch.extend_starts[r], batch.extend_lens[r], batch.prefix_lens[r])
        else:
            groups = [g.rows for g in batch.extend_groups] + [[r] for r in batch.extend_singles]
            groups = [[r for r in g if r in rows] for g in groups]
            plan.extends = [_padded(batch, g, all_tokens=False) for g in groups if g]
        return plan


# Extends of at most this many new tokens run through the C decode kernel, one row per query token (see
# AttentionPlan.build); longer ones gather their keys once per layer and run SDPA, whose GEMMs win there.
ROW_KERNEL_MAX_QUERIES = 32


def _query_rows(batch: ForwardBatch, rows: list[int]) -> Padded:
    """One decode-kernel row per new token of `rows` (decodes and short extends): token i of request r
    reads keys 0 .. prefix_lens[r] + i of r's sequence (causal), from r's slot row."""
    dev = batch.device
    lens = [batch.extend_lens[r] for r in rows]
    kv_len = max(batch.seq_slots[r].numel() for r in rows)
    table = torch.zeros((sum(lens), kv_len), dtype=torch.int64, device=dev)
    seq_lens, q_index, at = [], [], 0
    for r, n in zip(rows, lens):
        s = batch.seq_slots[r]
        table[at:at + n, :s.numel()] = s
        p, start = batch.prefix_lens[r], batch.extend_starts[r]
        seq_lens.extend(range(p + 1, p + n + 1))
        q_index.extend(range(start, start + n))
        at += n
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    in_order = q_index == list(range(batch.num_tokens))
    return Padded(rows=at, q_len=1, kv_len=kv_len,
                  q_index=None if in_order else torch.tensor(q_index, dtype=torch.int64, device=dev),
                  slots=table.reshape(-1), q_pos=(seq - 1)[:, None].to(dev), seq_lens=seq.to(dev),
                  valid=None, out_index=None,
                  segments=torch.tensor([0, *itertools.accumulate(lens)]) if max(lens) > 1 else None)


def fresh_causal_mask(n: int, window: Optional[int], device: torch.device) -> Optional[torch.Tensor]:
    """Bool [n, n] causal+window mask of an uncached extend, or None when `is_causal` is exact."""
    if window is None or window >= n:
        return None
    q = torch.arange(n, device=device)[:, None]
    k = torch.arange(n, device=device)[None, :]
    return (k <= q) & (k > q - window)


def _gather(p: Padded, buf: torch.Tensor, name: str) -> torch.Tensor:
    """Rows of one pool layer at p.slots, into a buffer reused by every layer."""
    out = p.buffer(name, (p.slots.numel(),) + tuple(buf.shape[1:]), buf.dtype)
    return torch.index_select(buf, 0, p.slots, out=out)


def attend_padded(p: Padded, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                  window: Optional[int], scale: float) -> torch.Tensor:
    """Attention of the padded requests `p` over their pool slots: gather + one SDPA call.

    q: [rows * q_len, H, D] (already indexed by p.q_index); k_buf/v_buf: one layer of the pool,
    [slots, KVH, D]. Returns [rows * q_len, H, D] (padded queries included).
    """
    heads, d = q.shape[1], q.shape[2]
    kvh = k_buf.shape[1]
    k = _gather(p, k_buf, "k").view(p.rows, p.kv_len, kvh, d).transpose(1, 2)
    v = _gather(p, v_buf, "v").view(p.rows, p.kv_len, kvh, d).transpose(1, 2)
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    qq = q.view(p.rows, p.q_len, heads, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(qq, k, v, attn_mask=p.mask(window, q.dtype), scale=scale,
                                       enable_gqa=heads != kvh)          # [rows, H, q_len, D]
    return o.transpose(1, 2).reshape(p.rows * p.q_len, heads, d)


def attend_prefixed(p: Padded, prefix: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_buf: torch.Tensor, v_buf: torch.Tensor, scale: float) -> torch.Tensor:
    """One request's n new tokens ([n, H, D] queries, their own K/V [n, KVH, D]) after `prefix` cached tokens
    (p: its padded plan, one row), no sliding window: the prefix's keys, gathered from the pool, unmasked, and
    the new tokens' own keys, causal (a square: `is_causal` is exact), in two CPU flash-attention calls merged
    by their log-sum-exp. One masked call over [n, prefix + n] computed every masked score too (a long
    prompt's second chunk: half its keys). Returns [n, H, D] in q's dtype (the merge runs in fp32: the
    log-sum-exps are fp32 whatever the inputs, and a bf16 model's next projection needs bf16 back)."""
    kvh, d = k_buf.shape[1], k_buf.shape[2]
    slots = p.slots[:prefix]
    kp = torch.index_select(k_buf, 0, slots, out=p.buffer("k", (prefix, kvh, d), k_buf.dtype))
    vp = torch.index_select(v_buf, 0, slots, out=p.buffer("v", (prefix, kvh, d), v_buf.dtype))
    if kp.dtype != q.dtype:
        kp, vp = kp.to(q.dtype), vp.to(q.dtype)
    qq = q.transpose(0, 1)[None]                                          # [1, H, n, D]
    o1, l1 = FLASH_CPU(qq, kp.transpose(0, 1)[None], vp.transpose(0, 1)[None], 0.0, False, scale=scale)
    o2, l2 = FLASH_CPU(qq, k.transpose(0, 1)[None], v.transpose(0, 1)[None], 0.0, True, scale=scale)
    top = torch.maximum(l1, l2)
    w1, w2 = (l1 - top).exp_(), (l2 - top).exp_()                         # [1, H, n]
    o = (o1 * w1[..., None]).add_(o2 * w2[..., None]).div_((w1 + w2)[..., None])
    return o[0].transpose(0, 1).to(q.dtype)


FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu   # (out, logsumexp); GQA by head count


# Decode attention splits each request's keys into about this many chunks per thread (flash-decoding), so even
# one request keeps every thread busy; chunks hold 32..512 keys.
ITEMS_PER_THREAD = 8


def decode_chunks(seq_lens: torch.Tensor, threads: int) -> tuple[torch.Tensor, int]:
    """(keys per chunk of each row, chunks of the longest row) of the C decode attention. A row's chunk size
    comes from its own length (and the thread count) alone: the chunks set the order of the fp32 sums, so a
    size taken from the batch (its longest row, its row count) made a request's tokens depend on who it was
    batched with, and cache on / cache off, which batch requests differently, could pick different tokens."""
    per_row = ITEMS_PER_THREAD * threads
    chunk = (-(-seq_lens // per_row)).clamp(min=32)
    chunk = ((chunk + 31) // 32 * 32).clamp(max=native_kernels.MAX_CHUNK)
    return chunk.contiguous(), int((-(-seq_lens // chunk)).max())


def decode_launch(p: Padded, heads: int, kv_heads: int,
                  head_dim: int) -> tuple[int, Optional[torch.Tensor], int, torch.Tensor]:
    """(keys per chunk, keys per chunk of each row or None, chunks per row, scratch) of the C decode attention
    over `p`, made once per forward and shared by every layer (and by decode_layers.c, which must split the
    keys the same way for the same bits). Runs of an extend's rows (`p.segments`) split every SEG_CHUNK keys;
    decodes, beside them or not, by `decode_chunks`."""
    if "chunks" not in p.cache:
        row_chunks, nchunks = decode_chunks(p.seq_lens, torch.get_num_threads())
        if p.segments is not None:   # runs of rows: SEG_CHUNK; one-row runs (decodes) their own chunks
            seg = native_kernels.SEG_CHUNK
            p.cache["chunks"] = (seg, row_chunks, max(nchunks, -(-p.kv_len // seg)))
        else:
            p.cache["chunks"] = (0, row_chunks, nchunks)
    chunk, row_chunks, nchunks = p.cache["chunks"]
    need = p.rows * kv_heads * nchunks * (heads // kv_heads) * (head_dim + 2)
    return chunk, row_chunks, nchunks, p.buffer("scratch", (need,), torch.float32)


def attend_decodes(p: Padded, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                   window: Optional[int], scale: float) -> torch.Tensor:
    """One query per request ([Rd, H, D], rows may be strided) over its slots -> [Rd, H, D].

    With the C kernel: read K/V rows straight from the pool by slot (no gathered copy).
    Without: gather + SDPA (fp32) or gather + two batched matmuls (bf16, where CPU SDPA is slow).
    """
    rd, heads, d = q.shape
    kvh = k_buf.shape[1]
    if native_kernels.attention_fits(q.device, heads, kvh, d):
        chunk, row_chunks, nchunks, scratch = decode_launch(p, heads, kvh, d)
        out = torch.empty((rd, heads, d), dtype=q.dtype)
        return native_kernels.decode_attention(q, k_buf, v_buf, p.slots.view(rd, p.kv_len), p.first_key(window),
                                               p.seq_lens, scale, chunk, nchunks, scratch, out, p.segments,
                                               row_chunks)
    if q.dtype == torch.float32:
        return attend_padded(p, q, k_buf, v_buf, window, scale)
    g = heads // kvh
    k = _gather(p, k_buf, "k").view(rd, p.kv_len, kvh, d).to(q.dtype)
    v = _gather(p, v_buf, "v").view(rd, p.kv_len, kvh, d).to(q.dtype)
    mask = p.mask(window, torch.float32)
    s = torch.matmul(q.reshape(rd, kvh, g, d), k.permute(0, 2, 3, 1)).float() * scale   # [Rd, KVH, G, L]
    if mask is not None:
        s = s + mask                                                           # [Rd, 1, 1, L]
    probs = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.matmul(probs, v.transpose(1, 2)).reshape(rd, heads, d)
