"""ModelRunner: load a Hugging Face causal LM with the radix_pool attention and run ForwardBatches.

The model code stays stock transformers; only the attention function is ours (hf_attention.py).
Where the checkpoint comes from (a name, a GGUF, a folder) is loader.py's business.
"""
from __future__ import annotations

from typing import Optional

import torch

from core.cache.kv_pool import KVPool
from core.engine.model.hf_attention import ATTN_IMPLEMENTATION, ForwardBatch
from core.engine.model.loader import resolve_model

TESTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_supported(model_class: type) -> None:
    """Our attention plugs in through transformers' AttentionInterface; families that bypass it cannot work."""
    if not getattr(model_class, "_supports_attention_backend", False):
        raise ValueError(
            f"{model_class.__name__} does not support custom attention backends in transformers, so the "
            f"radix_pool KV cache cannot drive it; use a model of a tested family: {', '.join(TESTED_FAMILIES)}")


class ModelRunner:
    """One causal LM on one device; runs a ForwardBatch against a KVPool, returns last-token logits."""

    def __init__(self, model: str = "default", device: str = "auto", dtype: Optional[torch.dtype] = None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        path = resolve_model(model)
        dev = _pick_device(device)
        dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        config = AutoConfig.from_pretrained(path)
        if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
            raise ValueError(f"{path} holds a {config.model_type!r} model, which is not a causal LM; "
                             f"use a model of a tested family: {', '.join(TESTED_FAMILIES)}")
        check_supported(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)])
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        self._setup(hf_model.to(dev), AutoTokenizer.from_pretrained(path), dev)

    @classmethod
    def from_hf(cls, hf_model: torch.nn.Module, tokenizer=None, device: str = "auto") -> "ModelRunner":
        """Wrap an already built model (tests use tiny `from_config` ones). Switches its attention in place."""
        check_supported(type(hf_model))
        runner = cls.__new__(cls)
        hf_model.set_attn_implementation(ATTN_IMPLEMENTATION)
        dev = _pick_device(device)
        runner._setup(hf_model.to(dev), tokenizer, dev)
        return runner

    def _setup(self, hf_model: torch.nn.Module, tokenizer, device: torch.device) -> None:
        self.model = hf_model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = next(hf_model.parameters()).dtype
        cfg = hf_model.config.get_text_config()
        self.num_layers: int = cfg.num_hidden_layers
        self.num_heads: int = cfg.num_attention_heads
        self.num_kv_heads: int = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size: int = cfg.vocab_size
        types = getattr(cfg, "layer_types", None)
        sliding = getattr(cfg, "sliding_window", None)
        if types is not None and "sliding_attention" not in types:
            sliding = None  # qwen2/qwen3 keep a sliding_window value even when no layer uses it
        self.sliding_window: Optional[int] = sliding
        self.max_context_len: int = int(getattr(cfg, "max_position_embeddings", 2048))
        self.eos_token_ids: set[int] = self._eos_ids(hf_model, tokenizer)

    @staticmethod
    def _eos_ids(hf_model: torch.nn.Module, tokenizer) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(hf_model, "generation_config", None), hf_model.config):
            eos = getattr(source, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
        return ids

    def make_pool(self, num_slots: int, page_size: int = 1) -> KVPool:
        """A KV pool shaped for this model, on its device, in its dtype."""
        return KVPool(self.num_layers, num_slots, self.num_kv_heads, self.head_dim,
                      dtype=self.dtype, device=self.device, page_size=page_size)

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Run the new tokens of `batch`, writing their K/V into `pool`; [R, vocab] float32 logits."""
        with torch.inference_mode():
            out = self.model(input_ids=batch.input_ids[None], position_ids=batch.positions[None],
                             use_cache=False, radix_batch=batch, radix_pool=pool,
                             logits_to_keep=batch.logits_indices)
        return out.logits[0].float()
