"""Tiny randomly initialised causal LMs (no files, no downloads) for fast engine tests."""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from core import env
from core.engine.model.runner import ModelRunner

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=512)
CONFIGS = {
    "llama": lambda: LlamaConfig(**TINY),
    "qwen2": lambda: Qwen2Config(**TINY),
    "qwen3": lambda: Qwen3Config(**TINY, head_dim=16),
    "mistral": lambda: MistralConfig(**TINY, sliding_window=8),
}


def tiny_pair(family: str, seed: int = 0) -> tuple[torch.nn.Module, ModelRunner]:
    """(stock eager reference model, ModelRunner over an identical copy)."""
    torch.manual_seed(seed)
    cfg = CONFIGS[family]()
    cfg.eos_token_id = None  # random weights: never stop early, so lengths are exact
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.generation_config.eos_token_id = None
    ref.generation_config.pad_token_id = 0
    # scripts/gpu_check.sh sets RADIX_TEST_DEVICE=cuda; the reference model stays on the CPU
    return ref, ModelRunner.from_hf(copy.deepcopy(ref), device=env.test_device(), numerics="fp32")


@torch.no_grad()
def reference_greedy(ref: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()
