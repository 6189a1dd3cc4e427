"""A tiny random Llama saved as a real checkpoint folder (SmolLM2's tokenizer, so text and chat work):
`python -m core.server --model FOLDER` loads it in about a second, for tests that need a server of
their own process (SIGTERM) or several models on disk (rebuilds)."""
from __future__ import annotations

import pathlib
import shutil

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from core.engine.model.loader import resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def make_tiny_checkpoint(folder: pathlib.Path, seed: int = 0, context: int = 4096, hidden: int = 64) -> pathlib.Path:
    """`hidden` 64: 13 MB of weights; 512: about 110 MB (to see a model's memory come and go)."""
    folder.mkdir(parents=True, exist_ok=True)
    default = resolve_model("default")
    for name in TOKENIZER_FILES:
        if (default / name).is_file():
            shutil.copy(default / name, folder / name)
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=49152, max_position_embeddings=context,
                      tie_word_embeddings=True, eos_token_id=None)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    return folder
