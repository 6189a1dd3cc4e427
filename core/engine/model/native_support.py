"""Which Hugging Face models the native Llama-family path (native_llama.NativeLlama) runs, and how each of their
layers attends (full or a sliding window): the checks the runner routes a model by."""
from __future__ import annotations

from typing import Optional

import torch

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq does not depend on the sequence length


def unsupported_reason(hf_model: torch.nn.Module) -> Optional[str]:
    """Why NativeLlama cannot run this model (route it to the Hugging Face path), or None."""
    cfg = hf_model.config.get_text_config()
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):    # transformers' swish is nn.SiLU
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", None)
    if rotary is None or not isinstance(rope_type, str) or rope_type not in _STATIC_ROPE:
        return f"rope type {rope_type!r} (supported: {', '.join(_STATIC_ROPE)})"
    if getattr(cfg, "head_dim", None) not in (None, hf_model.model.layers[0].self_attn.head_dim):
        return "head_dim mismatch"
    return None


def layer_windows(cfg) -> list[Optional[int]]:
    """Sliding window of each layer (None: full attention), as the Hugging Face attention modules
    get it: Mistral passes config.sliding_window to every layer; Qwen2/Qwen3 only to layers whose
    layer_types entry is "sliding_attention"; Llama has none."""
    n = cfg.num_hidden_layers
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if cfg.model_type == "llama" or window is None:
        return [None] * n
    if cfg.model_type == "mistral" and types is None:
        return [window] * n
    types = types or ["full_attention"] * n
    return [window if t == "sliding_attention" else None for t in types]
