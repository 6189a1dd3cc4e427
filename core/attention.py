"""The attention hook: write each layer's new K/V into the pool, then attend over pool slots.

Transformers calls a registered attention function in every layer with the new tokens'
query/key/value (after RoPE). Registering one named "radix_pool" and loading the model with
`attn_implementation="radix_pool"` is the whole integration: the model code stays stock.
Because "radix_pool" has no entry in transformers' mask registry
(`ALL_MASK_ATTENTION_FUNCTIONS`), `create_causal_mask` exits early and returns the
`attention_mask` it was given (None here), so no O(T x T) mask is ever built; causality and the
sliding window are applied here, per request.

The batch and the pool travel as extra keyword arguments of `model(...)`
(`radix_batch=`, `radix_pool=`): the causal-LM forward, the base model, every decoder layer
and every attention module pass `**kwargs` down unchanged to this function.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from core.memory import KVPool

ATTN_IMPLEMENTATION = "radix_pool"

TokenIds = Union[torch.Tensor, Sequence[int]]
Slots = Union[torch.Tensor, Sequence[int]]


def _long(x: Union[torch.Tensor, Sequence[int]], device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=torch.int64).reshape(-1)
    return torch.as_tensor(list(x), dtype=torch.int64, device=device).reshape(-1)


def _additive(ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool "may attend" -> 0 / -inf in the query's dtype. SDPA would convert a bool mask like
    this in every call; doing it once per batch saves that work in every layer."""
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, float("-inf"))


@dataclass(eq=False)
class ExtendGroup:
    """Extends attended together: queries padded to `q_len`, keys to `kv_len`."""

    rows: list[int]
    q_len: int
    kv_len: int
    q_index: torch.Tensor        # [B * q_len] flat token index of each padded query (pads repeat the last)
    kv_slots: torch.Tensor       # [B * kv_len] pool slot of each padded key (pads read slot 0, masked)
    q_pos: torch.Tensor          # [B, q_len] position of each padded query
    seq_lens: torch.Tensor       # [B] keys of each request
    valid: torch.Tensor          # [T_group] which of the B * q_len padded queries are real
    out_index: torch.Tensor      # [T_group] flat token index of each real query


# A group may cost at most this many times the attention work of its members run alone.
GROUP_PAD_FACTOR = 2.0


@dataclass(eq=False)
class ForwardBatch:
    """The new tokens of several requests, flattened into one sequence of batch size 1.

    Request r owns tokens `extend_starts[r] : extend_starts[r] + extend_lens[r]` of the flat
    tensors. Its sequence is `seq_slots[r]` (prefix slots, then its new slots), and token j of
    that sequence sits at position j, so a new token i has position `prefix_lens[r] + i`.
    A decode is simply a request with `extend_len == 1`.
    """

    input_ids: torch.Tensor          # [T] int64
    positions: torch.Tensor          # [T] int64
    out_slots: torch.Tensor          # [T] int64, pool slot of each new token's K/V
    seq_slots: list[torch.Tensor]    # per request, [prefix_len + extend_len] int64
    extend_lens: list[int]           # per request new-token count
    logits_indices: torch.Tensor     # [R] index of each request's last new token in the flat tensors
    prefix_lens: list[int] = field(default_factory=list)
    extend_starts: list[int] = field(default_factory=list)
    # Requests with one new token are attended together in one padded SDPA call.
    decode_rows: list[int] = field(default_factory=list)
    decode_token_idx: Optional[torch.Tensor] = None    # [Rd] flat token index of each decode
    decode_slot_table: Optional[torch.Tensor] = None   # [Rd, Lmax] slots, padded with slot 0
    decode_seq_lens: Optional[torch.Tensor] = None     # [Rd]
    decode_flat_slots: Optional[torch.Tensor] = None   # [Rd * Lmax] the table, flat, for index_select
    extend_rows: list[int] = field(default_factory=list)
    # Extends with a cached prefix (or several fresh ones) are attended in padded groups, one SDPA
    # call per group: many small calls are slow on CPU, and very slow when its threads are contended.
    extend_groups: list[ExtendGroup] = field(default_factory=list)
    extend_singles: list[int] = field(default_factory=list)  # rows attended alone (a long fresh prefill)
    # Masks depend on the batch and the layer's window only: built once, reused by every layer.
    _masks: dict = field(default_factory=dict, repr=False)

    @property
    def num_requests(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @classmethod
    def build(cls, requests: Sequence[tuple[TokenIds, Slots, Slots]],
              device: Union[str, torch.device] = "cpu") -> "ForwardBatch":
        """Build from `(new_token_ids, prefix_slots, new_slots)` per request.

        `prefix_slots` hold the K/V already in the pool (may be empty); `new_slots` receive
        the K/V of `new_token_ids` (same length, at least 1). Put the batch on the pool's device.
        """
        if not requests:
            raise ValueError("a ForwardBatch needs at least one request")
        device = torch.device(device)
        ids, outs, seqs, ext, pre, starts, positions = [], [], [], [], [], [], []
        start = 0
        for r, (tokens, prefix, new) in enumerate(requests):
            tokens, prefix, new = _long(tokens, device), _long(prefix, device), _long(new, device)
            if tokens.numel() == 0:
                raise ValueError(f"request {r} has no new tokens; every request in a batch computes at least one")
            if tokens.numel() != new.numel():
                raise ValueError(f"request {r} has {tokens.numel()} new tokens but {new.numel()} new slots; "
                                 f"allocate one slot per new token")
            n, p = int(tokens.numel()), int(prefix.numel())
            ids.append(tokens)
            outs.append(new)
            seqs.append(torch.cat([prefix, new]))
            ext.append(n)
            pre.append(p)
            starts.append(start)
            positions.append((p, n))
            start += n
        pos = torch.cat([torch.arange(p, p + n, dtype=torch.int64) for p, n in positions]).to(device)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, ext)], dtype=torch.int64, device=device)
        batch = cls(input_ids=torch.cat(ids), positions=pos, out_slots=torch.cat(outs), seq_slots=seqs,
                    extend_lens=ext, logits_indices=last, prefix_lens=pre, extend_starts=starts)
        batch._index_decodes()
        return batch

    def _index_decodes(self) -> None:
        """Split requests into decodes (one padded call) and extends (padded groups, or alone)."""
        self.decode_rows = [r for r, n in enumerate(self.extend_lens) if n == 1]
        self.extend_rows = [r for r, n in enumerate(self.extend_lens) if n != 1]
        self._group_extends()
        if not self.decode_rows:
            return
        lens = [self.seq_slots[r].numel() for r in self.decode_rows]
        table = torch.zeros((len(lens), max(lens)), dtype=torch.int64, device=self.device)
        for i, r in enumerate(self.decode_rows):
            table[i, : lens[i]] = self.seq_slots[r]
        self.decode_slot_table = table
        self.decode_flat_slots = table.reshape(-1)
        self.decode_seq_lens = torch.tensor(lens, dtype=torch.int64, device=self.device)
        self.decode_token_idx = torch.tensor([self.extend_starts[r] for r in self.decode_rows],
                                             dtype=torch.int64, device=self.device)

    def _group_extends(self) -> None:
        """Pack extends into padded groups whose padding at most doubles their attention work."""
        rows = sorted(self.extend_rows, key=lambda r: (self.extend_lens[r], self.seq_slots[r].numel()))
        groups: list[list[int]] = []
        real = q_max = l_max = 0
        for r in rows:
            n, L = self.extend_lens[r], self.seq_slots[r].numel()
            if groups and (len(groups[-1]) + 1) * max(q_max, n) * max(l_max, L) \
                    <= GROUP_PAD_FACTOR * (real + n * L):
                groups[-1].append(r)
                real, q_max, l_max = real + n * L, max(q_max, n), max(l_max, L)
            else:
                groups.append([r])
                real, q_max, l_max = n * L, n, L
        for g in groups:
            if len(g) == 1:
                self.extend_singles.append(g[0])
            else:
                self.extend_groups.append(self._make_group(g))

    def _make_group(self, rows: list[int]) -> ExtendGroup:
        dev = self.device
        ns = torch.tensor([self.extend_lens[r] for r in rows], dtype=torch.int64)
        ps = torch.tensor([self.prefix_lens[r] for r in rows], dtype=torch.int64)
        starts = torch.tensor([self.extend_starts[r] for r in rows], dtype=torch.int64)
        q_len, kv_len = int(ns.max()), int((ns + ps).max())
        i = torch.arange(q_len)[None, :]
        step = torch.minimum(i, ns[:, None] - 1)           # pads repeat the request's last query
        table = torch.zeros((len(rows), kv_len), dtype=torch.int64, device=dev)
        for b, r in enumerate(rows):
            table[b, : self.seq_slots[r].numel()] = self.seq_slots[r]
        valid = (i < ns[:, None]).reshape(-1)
        q_index = (starts[:, None] + step).reshape(-1)
        return ExtendGroup(rows=rows, q_len=q_len, kv_len=kv_len, q_index=q_index.to(dev),
                           kv_slots=table.reshape(-1), q_pos=(ps[:, None] + step).to(dev),
                           seq_lens=(ns + ps).to(dev), valid=valid.to(dev), out_index=q_index[valid].to(dev))

    def group_mask(self, g: int, window: Optional[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[B, 1, q_len, kv_len] additive mask of extend group g: causal, window, padding."""
        key = ("group", g, window, dtype)
        if key not in self._masks:
            grp = self.extend_groups[g]
            k_pos = torch.arange(grp.kv_len, device=self.device)[None, None, :]
            q_pos = grp.q_pos[:, :, None]
            ok = k_pos <= q_pos   # q_pos < seq_len, so this also masks the padded keys
            if window is not None:
                ok &= k_pos > q_pos - window
            self._masks[key] = _additive(ok, dtype)[:, None]
        return self._masks[key]

    def decode_mask(self, window: Optional[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[Rd, 1, 1, Lmax] additive mask (0 or -inf): real keys of each decode, inside the window."""
        key = ("decode", window, dtype)
        if key not in self._masks:
            cols = torch.arange(self.decode_slot_table.shape[1], device=self.device)[None, :]
            lens = self.decode_seq_lens[:, None]
            mask = cols < lens
            if window is not None:
                mask &= cols > (lens - 1) - window
            self._masks[key] = _additive(mask, dtype)[:, None, None, :]
        return self._masks[key]

    def extend_mask(self, r: int, window: Optional[int]) -> Optional[torch.Tensor]:
        """[q, L] bool causal(+window) mask of request r, or None when plain `is_causal` is exact."""
        p, n = self.prefix_lens[r], self.extend_lens[r]
        if window is not None and window >= p + n:
            window = None
        if p == 0 and window is None:
            return None
        key = (r, window)
        if key not in self._masks:
            q_pos = torch.arange(p, p + n, device=self.device)[:, None]
            k_pos = torch.arange(p + n, device=self.device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= k_pos > q_pos - window
            self._masks[key] = mask
        return self._masks[key]


def radix_pool_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                         scaling: Optional[float] = None, dropout: float = 0.0,
                         sliding_window: Optional[int] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, KVH, T, D] -> ([1, T, H, D], None), as transformers expects."""
    batch: Optional[ForwardBatch] = kwargs.get("radix_batch")
    pool: Optional[KVPool] = kwargs.get("radix_pool")
    if batch is None or pool is None:
        raise ValueError("the radix_pool attention needs model(..., radix_batch=ForwardBatch, radix_pool=KVPool); "
                         "run the model through ModelRunner.forward")
    if query.shape[0] != 1 or query.shape[2] != batch.num_tokens:
        raise ValueError(f"radix_pool attention expects batch size 1 with {batch.num_tokens} flattened tokens, "
                         f"got query of shape {tuple(query.shape)}")
    layer = module.layer_idx
    pool.set_kv(layer, batch.out_slots, key[0].transpose(0, 1), value[0].transpose(0, 1))
    k_buf, v_buf = pool.k_buffer[layer], pool.v_buffer[layer]
    num_heads, head_dim, dtype = query.shape[1], query.shape[3], query.dtype
    gqa = num_heads != key.shape[1]
    out = query.new_empty((1, batch.num_tokens, num_heads, head_dim))

    for r in batch.extend_singles:
        s, n = batch.extend_starts[r], batch.extend_lens[r]
        if batch.prefix_lens[r] == 0:  # nothing cached: the keys are exactly the ones just computed
            k, v = key[:, :, s:s + n], value[:, :, s:s + n]
        else:
            slots = batch.seq_slots[r]
            k = k_buf.index_select(0, slots).to(dtype).transpose(0, 1)[None]  # [1, KVH, L, D]
            v = v_buf.index_select(0, slots).to(dtype).transpose(0, 1)[None]
        mask = batch.extend_mask(r, sliding_window)
        o = F.scaled_dot_product_attention(query[:, :, s:s + n], k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=scaling, enable_gqa=gqa)
        out[0, s:s + n] = o[0].transpose(0, 1)

    kv_heads = key.shape[1]
    for g, grp in enumerate(batch.extend_groups):
        b = len(grp.rows)
        q = query[0].index_select(1, grp.q_index).view(num_heads, b, grp.q_len, head_dim).transpose(0, 1)
        k = k_buf.index_select(0, grp.kv_slots).to(dtype).view(b, grp.kv_len, kv_heads, head_dim).transpose(1, 2)
        v = v_buf.index_select(0, grp.kv_slots).to(dtype).view(b, grp.kv_len, kv_heads, head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.group_mask(g, sliding_window, dtype),
                                           scale=scaling, enable_gqa=gqa)  # [B, H, q_len, D]
        o = o.transpose(1, 2).reshape(b * grp.q_len, num_heads, head_dim)
        out[0].index_copy_(0, grp.out_index, o[grp.valid])

    if batch.decode_rows:
        idx = batch.decode_token_idx
        rd, l_max = batch.decode_slot_table.shape
        q = query[0, :, idx].transpose(0, 1)[:, :, None, :]  # [Rd, H, 1, D]
        k = k_buf.index_select(0, batch.decode_flat_slots).to(dtype).view(rd, l_max, kv_heads, head_dim)
        v = v_buf.index_select(0, batch.decode_flat_slots).to(dtype).view(rd, l_max, kv_heads, head_dim)
        o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=batch.decode_mask(sliding_window, dtype),
                                           scale=scaling, enable_gqa=gqa)
        out[0].index_copy_(0, idx, o[:, :, 0, :])
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, radix_pool_attention)
