"""KV bytes per token of configs that name their KV layout their own way, worked out by hand from the published
configs: Falcon's KV heads (they had been read as full multi-head attention, up to 71x too large), hybrid models'
attention layers (4-8x too large), and float32 configs, which servers run in 16 bits (2x)."""
from __future__ import annotations

import pytest

from core.lab.units import model_kv

LLAMA_LIKE = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, torch_dtype="bfloat16")


def test_falcon_kv_heads_come_from_num_kv_heads_or_multi_query():
    falcon7 = dict(model_type="falcon", num_hidden_layers=32, hidden_size=4544, num_attention_heads=71,
                   multi_query=True, new_decoder_architecture=False, torch_dtype="bfloat16")
    assert model_kv(falcon7).bytes_per_token == 2 * 32 * 1 * 64 * 2 == 8192
    # as transformers' FalconConfig saves it: num_kv_heads copied from num_attention_heads beside multi_query
    assert model_kv(dict(falcon7, num_kv_heads=71)).bytes_per_token == 8192
    falcon40 = dict(model_type="falcon", num_hidden_layers=60, hidden_size=8192, num_attention_heads=128,
                    num_kv_heads=8, multi_query=True, new_decoder_architecture=True, torch_dtype="bfloat16")
    assert model_kv(falcon40).bytes_per_token == 2 * 60 * 8 * 64 * 2 == 122880
    assert model_kv(LLAMA_LIKE).bytes_per_token == 2 * 32 * 32 * 128 * 2      # no KV-head field: one per head


def test_hybrid_models_count_only_their_attention_layers():
    qwen3_next = dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
                      head_dim=256, torch_dtype="bfloat16", full_attention_interval=4,
                      layer_types=["linear_attention"] * 3 * 12 + ["full_attention"] * 12)
    kv = model_kv(qwen3_next)
    assert kv.bytes_per_token == 2 * 12 * 2 * 256 * 2 == 24576
    assert "12 of 48 layers keep KV" in kv.describe()
    without_types = {k: v for k, v in qwen3_next.items() if k != "layer_types"}
    assert model_kv(without_types).bytes_per_token == 24576
    jamba = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                 attn_layer_period=8, attn_layer_offset=4, torch_dtype="bfloat16")
    assert model_kv(jamba).bytes_per_token == 2 * 4 * 8 * 128 * 2 == 16384


def test_sliding_window_layers_count_as_full_and_say_so():
    gemma3 = dict(num_hidden_layers=6, hidden_size=1152, num_attention_heads=4, num_key_value_heads=1,
                  head_dim=256, torch_dtype="bfloat16", layer_types=["sliding_attention"] * 5 + ["full_attention"])
    kv = model_kv(gemma3)
    assert kv.bytes_per_token == 2 * 6 * 1 * 256 * 2
    assert "5 sliding-window layers counted as full attention: an upper bound" in kv.describe()
    mistral = dict(LLAMA_LIKE, num_key_value_heads=8, sliding_window=4096)
    assert "32 sliding-window layers" in model_kv(mistral).describe()
    qwen = dict(LLAMA_LIKE, sliding_window=131072, use_sliding_window=False)
    assert model_kv(qwen).note == ""


def test_an_unknown_layer_type_or_no_attention_layer_is_an_error():
    with pytest.raises(ValueError, match="layer_types holds moe_router"):
        model_kv(dict(LLAMA_LIKE, num_hidden_layers=2, layer_types=["full_attention", "moe_router"]))
    with pytest.raises(ValueError, match="no layer of this config keeps a KV cache"):
        model_kv(dict(LLAMA_LIKE, num_hidden_layers=2, layer_types=["linear_attention"] * 2))


def test_a_float32_config_is_served_in_16_bits_unless_asked():
    gemma2 = dict(model_type="gemma2", num_hidden_layers=42, hidden_size=3584, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=256, torch_dtype="float32")
    kv = model_kv(gemma2)
    assert (kv.dtype, kv.bytes_per_token) == ("bfloat16", 2 * 42 * 8 * 256 * 2)
    assert "served as bfloat16" in kv.describe()
    assert model_kv(dict(LLAMA_LIKE, torch_dtype="float32")).dtype == "float16"
    assert model_kv(gemma2, kv_dtype="float32").bytes_per_token == 2 * 42 * 8 * 256 * 4
