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

from typing import Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from core.cache.kv_pool import KVPool
from core.engine.model.forward_batch import ForwardBatch, SharedDecodes

ATTN_IMPLEMENTATION = "radix_pool"
__all__ = ["ATTN_IMPLEMENTATION", "ForwardBatch", "radix_pool_attention"]


# keyword arguments of a model's attention call that change the result and that this hook does not apply
UNAPPLIED_KWARGS = {"softcap": "attention logit softcapping (Gemma 2's attn_logit_softcapping)",
                    "s_aux": "attention sinks (GPT-OSS's sinks)"}


def hf_unsupported_reason(hf_model: torch.nn.Module) -> Optional[str]:
    """Why the radix_pool hook cannot run this model exactly (so it is refused), or None.

    - longrope picks its short or long factors from the largest position in the whole forward; a forward
      here is a batch of requests and prompt chunks, so a request's RoPE would depend on its batch-mates
      and on the chunk size (its tokens then differ from the model's, and cache on from cache off);
    - softcapping and sinks arrive as keyword arguments this hook does not apply."""
    cfg = hf_model.config.get_text_config()
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        return UNAPPLIED_KWARGS["softcap"] + " is not applied by the radix_pool attention"
    for name, module in hf_model.named_modules():
        if getattr(module, "rope_type", None) == "longrope":
            return ("rope type 'longrope' picks its frequencies from the largest position of a whole forward, and "
                    "this engine's forwards batch requests and chunk prompts, so a request's tokens would depend on "
                    "its batch")
        if isinstance(getattr(module, "sinks", None), torch.Tensor):
            return UNAPPLIED_KWARGS["s_aux"] + f" ({name}.sinks) are not applied by the radix_pool attention"
    return None


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
    for name, what in UNAPPLIED_KWARGS.items():
        if kwargs.get(name) is not None:   # a model the load-time check (hf_unsupported_reason) did not know
            raise ValueError(f"this model asks its attention for {what}, which the radix_pool attention does not "
                             f"apply; its tokens would not be the model's")
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

    if not batch.decode_rows:
        return out, None
    if batch.shared_decodes is None or sliding_window is not None:
        _padded_decodes(query, k_buf, v_buf, batch.decode_token_idx, batch.decode_flat_slots,
                        batch.decode_mask(sliding_window, dtype), scaling, gqa, out)
        return out, None
    idx, flat, lens = batch.plain_decodes
    if lens.numel():
        _padded_decodes(query, k_buf, v_buf, idx, flat, batch.plain_mask(dtype), scaling, gqa, out)
    _shared_prefix_decodes(query, k_buf, v_buf, batch.shared_decodes, batch.shared_masks(dtype),
                           scaling if scaling is not None else head_dim ** -0.5, out)
    return out, None


def _padded_decodes(query: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, idx: torch.Tensor,
                    flat_slots: torch.Tensor, mask: torch.Tensor, scaling: Optional[float], gqa: bool,
                    out: torch.Tensor) -> None:
    """Decodes at flat token `idx`, each over its own padded row of slots: one SDPA call."""
    rd, kv_heads, head_dim = idx.numel(), k_buf.shape[1], k_buf.shape[2]
    l_max = flat_slots.numel() // rd
    q = query[0, :, idx].transpose(0, 1)[:, :, None, :]  # [Rd, H, 1, D]
    k = k_buf.index_select(0, flat_slots).to(query.dtype).view(rd, l_max, kv_heads, head_dim)
    v = v_buf.index_select(0, flat_slots).to(query.dtype).view(rd, l_max, kv_heads, head_dim)
    o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       scale=scaling, enable_gqa=gqa)
    out[0].index_copy_(0, idx, o[:, :, 0, :])


def _shared_prefix_decodes(query: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, sd: SharedDecodes,
                           masks: tuple[torch.Tensor, torch.Tensor], scale: float, out: torch.Tensor) -> None:
    """Attention of SharedDecodes: prefix scores as one GEMM per group and KV head, suffix scores per
    request, then one softmax over both and the matching weighted sums of V."""
    num_heads, dtype = query.shape[1], query.dtype
    kvh, d = k_buf.shape[1], k_buf.shape[2]
    g, m, p, s = sd.num_groups, sd.members, sd.prefix_len, sd.suffix_len
    rep = num_heads // kvh
    # query head h reads KV head h // rep (transformers' repeat_kv); [G, KVH, M, rep, D]
    q = query[0].index_select(1, sd.q_index).view(kvh, rep, g, m, d).permute(2, 0, 3, 1, 4)
    kp = k_buf.index_select(0, sd.prefix_slots).to(dtype).view(g, p, kvh, d).permute(0, 2, 3, 1)  # [G, KVH, D, P]
    vp = v_buf.index_select(0, sd.prefix_slots).to(dtype).view(g, p, kvh, d).transpose(1, 2)       # [G, KVH, P, D]
    ks = k_buf.index_select(0, sd.suffix_slots).to(dtype).view(g, m, s, kvh, d)
    vs = v_buf.index_select(0, sd.suffix_slots).to(dtype).view(g, m, s, kvh, d)
    prefix_mask, suffix_mask = masks
    scores_p = torch.matmul(q.reshape(g, kvh, m * rep, d), kp).view(g, kvh, m, rep, p)
    scores_s = torch.einsum("nkmrd,nmskd->nkmrs", q, ks)
    scores = torch.cat([scores_p.mul_(scale).add_(prefix_mask), scores_s.mul_(scale).add_(suffix_mask)], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    o = torch.matmul(probs[..., :p].reshape(g, kvh, m * rep, p), vp).view(g, kvh, m, rep, d)
    o += torch.einsum("nkmrs,nmskd->nkmrd", probs[..., p:], vs)
    o = o.permute(0, 2, 1, 3, 4).reshape(g * m, num_heads, d)  # head index = kv_head * rep + r
    out[0].index_copy_(0, sd.out_index, o[sd.valid])


AttentionInterface.register(ATTN_IMPLEMENTATION, radix_pool_attention)
