"""Model-aware units: KV bytes per token from published configs (MHA/GQA and MLA), capacities in GiB/GB,
token counts spelled out, capacities beyond what a workload can fill replayed at what it can (one path: the
replay's), bad input named."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from core.cache.eviction.registry import POLICIES
from core.cache.kv_pool import KVPool
from core.lab.optimal import Bounds
from core.lab.replay import pool_pages_needed, replay
from core.lab.sweep import parse_capacities
from core.lab.units import (MAX_CAPACITY_TOKENS, 
    GIB,
    add_bytes_columns,
    fmt_capacity,
    fmt_tokens,
    load_model_config,
    model_kv,
    parse_capacity,
    shipped_models,
)
from core.lab.workloads import TraceRequest, Workload, multi_turn_chat

# 2 x layers x kv heads x head dim x 2 bytes (bf16); DeepSeek-V3: (512 + 64) x 61 layers x 2 bytes
EXPECTED = {"SmolLM2-135M": 2 * 30 * 3 * 64 * 2, "Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,
            "Llama-3.1-70B": 2 * 80 * 8 * 128 * 2, "Qwen2.5-7B": 2 * 28 * 4 * 128 * 2,
            "DeepSeek-V3": (512 + 64) * 61 * 2}


def test_shipped_configs_give_the_published_kv_bytes_per_token():
    assert set(shipped_models()) == set(EXPECTED)
    for name, want in EXPECTED.items():
        kv = load_model_config(name)
        assert kv.bytes_per_token == want, name
        assert kv.tokens(GIB) == GIB // want
    assert EXPECTED["Llama-3.1-8B"] == 131_072 and EXPECTED["DeepSeek-V3"] == 70_272
    assert load_model_config("DeepSeek-V3").mla and not load_model_config("Llama-3.1-70B").mla


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "llama-3.1-8b", "  LLAMA-3.1-8B "])
def test_names_are_matched_loosely(name):
    assert load_model_config(name).name == "Llama-3.1-8B"


def test_kv_dtype_override():
    assert load_model_config("llama-3.1-8b", "fp8").bytes_per_token == 65_536
    assert load_model_config("deepseek-v3", "fp8_e4m3").bytes_per_token == 576 * 61
    assert load_model_config("qwen2.5-7b", "float32").bytes_per_token == 2 * 28 * 4 * 128 * 4
    with pytest.raises(ValueError, match="unknown KV dtype 'fp7'; choose one of: .*fp8"):
        load_model_config("qwen2.5-7b", "fp7")


def test_int8_kv_counts_the_scale_each_row_keeps_as_the_engines_pool_does():
    assert load_model_config("llama-3.1-8b", "int8").bytes_per_token == 32 * 2 * 8 * (128 + 4)
    assert load_model_config("deepseek-v3", "int8").bytes_per_token == 61 * (576 + 4)
    assert load_model_config("llama-3.1-8b", "fp8").row_scale_bytes == 0
    cfg = {"num_hidden_layers": 3, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    kv = model_kv(cfg, "tiny", "int8")
    pool = KVPool(3, 100, 3, 64, dtype=torch.int8)
    assert kv.bytes_per_token * (100 + 1) == pool.nbytes()     # slot 0, the padding slot, is counted by the pool
    assert "+ 4 B scale a row" in kv.describe() and kv.to_dict()["row_scale_bytes"] == 4


def test_a_config_json_path_or_its_folder(tmp_path):
    cfg = {"_name_or_path": "org/Tiny", "num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512,
           "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for where in (tmp_path, tmp_path / "config.json"):
        kv = load_model_config(str(where))
        assert (kv.name, kv.kv_heads, kv.head_dim, kv.bytes_per_token) == ("Tiny", 8, 64, 2 * 4 * 8 * 64 * 2)
    nested = {"model_type": "llava", "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "head_dim": 32}}
    assert model_kv(nested).bytes_per_token == 2 * 2 * 2 * 32 * 2   # bf16 when the config says nothing


@pytest.mark.parametrize("cfg, message", [
    ({"num_attention_heads": 8, "hidden_size": 512}, "num_hidden_layers must be a positive integer, got None"),
    ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 512}, "not a multiple of num_attention_heads"),
    ({"num_hidden_layers": 2, "kv_lora_rank": 512}, "qk_rope_head_dim must be a positive integer"),
    ({"num_hidden_layers": True, "num_attention_heads": 1, "hidden_size": 2}, "num_hidden_layers must be"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_configs_name_the_field(cfg, message):
    with pytest.raises(ValueError, match=message):
        model_kv(cfg, "m")


def test_unknown_name_and_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match="no model config 'gpt-5'.*shipped names: DeepSeek-V3, Llama-3.1-70B"):
        load_model_config("gpt-5")
    bad = tmp_path / "config.json"
    bad.write_bytes(b"\xff{nope")
    with pytest.raises(ValueError, match="cannot read model config"):
        load_model_config(str(bad))


def test_capacities_in_bytes_become_whole_tokens_and_pages():
    kv = load_model_config("llama-3.1-8b")
    assert parse_capacity("80GiB", 1, kv) == 80 * GIB // 131_072 == 655_360
    assert parse_capacity("40GB", 512, kv) == (40 * 10 ** 9 // 131_072) // 512 * 512 == 305_152
    assert parse_capacity("1.5 TiB", 1, kv) == int(1.5 * (1 << 40)) // 131_072
    assert parse_capacity("3M", 512, kv) == 3_000_000 and parse_capacity("6000p", 512, kv) == 3_072_000
    assert parse_capacity("3g", 1) == 3 * 10 ** 9          # token counts keep their meaning
    # the list is the pools that exist: whole pages (3M tokens are 5,859 pages of 512 and a part page)
    assert parse_capacities("80GiB, 3M, 6000p", 512, kv) == [655_360, 3_000_000 // 512 * 512, 3_072_000] \
        == [1280 * 512, 5859 * 512, 6000 * 512]
    with pytest.raises(ValueError, match="is in bytes: give a model"):
        parse_capacity("80GiB", 1)
    with pytest.raises(ValueError, match="holds 3,276 tokens of Llama-3.1-70B, below one page of 4096"):
        parse_capacity("1GiB", 4096, load_model_config("llama-3.1-70b"))
    with pytest.raises(ValueError, match="cannot read capacity"):
        parse_capacity("80 bananas", 1, kv)


@pytest.mark.parametrize("text", ["100000G", "1e200GiB", "99999999999999999999999999999", 2**41, "1e400", 10**400])
def test_capacities_past_any_pool_are_refused_before_bytes_overflow(text):
    """100000G tokens of Llama-3.1-8B printed capacity_gib -4972837934 (int64 bytes wrapped)."""
    kv = load_model_config("llama-3.1-8b")
    with pytest.raises(ValueError, match="more than any pool holds"):
        parse_capacity(text, 16, kv)
    assert parse_capacity(MAX_CAPACITY_TOKENS, 16, kv) == MAX_CAPACITY_TOKENS
    with pytest.raises(ValueError, match="cannot read capacity"):
        parse_capacity("1e300GiB", 16, kv)


def test_token_counts_are_spelled_out():
    assert fmt_tokens(3_072_000) == "3.07M tokens (3,072,000)"
    assert fmt_tokens(2048) == "2,048 tokens"
    assert fmt_tokens(10 ** 9) == "1G tokens (1,000,000,000)"
    kv = load_model_config("llama-3.1-8b")
    assert fmt_capacity(3_072_000, 512, kv) == "3.07M tokens (3,072,000) = 6,000 pages of 512 = 375.00 GiB of Llama-3.1-8B KV"


def test_capacities_beyond_what_the_workload_fills_replay_there_and_lose_nothing():
    w = multi_turn_chat(num_sessions=3, turns=3, system_prompt_len=16, user_len=4, output_len=6, seed=1)
    b = Bounds(w, 4)
    need = pool_pages_needed(w, 4, distinct=b.distinct_pages)
    assert parse_capacities([64, 80 * 10 ** 9], 4) == [64, 80 * 10 ** 9]       # the asked sizes stay as asked
    huge = replay(w, 80 * 10 ** 9, "lru", 4)
    assert (huge.capacity_pages, huge.pool_pages) == (2 * 10 ** 10, need)
    assert (huge.hit_tokens, huge.evictions) == (b.infinite().hit_tokens, 0)
    # Why not "every distinct page plus one tail page": a request whose output is already cached allocates its
    # slots before its insert finds them there. A then B then A again (same fixed output), then B extended: 12
    # distinct tokens; at 13 slots the second A (1 hit: never its last prompt token; 6 slots, 2 free) must evict
    # 4 tokens: lru takes A's own tail (inserted again at once), mru takes B's leaf, so B extended hits 0 of 4.
    # The replay's own bound (tree + what running requests hold) keeps every policy at the infinite rate.
    a, o, bb = [1, 2], [5, 6, 7, 8, 9, 10], [20, 21, 22, 23]
    dup = Workload("dup", [TraceRequest(a, output=o), TraceRequest(bb, output=[30]), TraceRequest(a, output=o),
                           TraceRequest(bb + [24], output=[31])])
    bd = Bounds(dup, 1)
    assert bd.distinct_pages == 12 and bd.infinite().hit_tokens == 1 + 4
    assert replay(dup, 13, "mru", 1).hit_tokens == 1 and replay(dup, 13, "mru", 1).evictions == 1
    for pol in POLICIES:
        page, token = replay(dup, 10 ** 6, pol, 1, level="page"), replay(dup, 10 ** 6, pol, 1, level="token")
        assert (page.pool_pages, page.hit_tokens, page.evictions) == (12 + 7, 5, 0), pol   # + A's 7 held
        assert (token.pool_pages, token.hit_tokens, token.evictions) == (pool_pages_needed(dup, 1), 5, 0), pol


def test_tables_gain_bytes_columns():
    df = pd.DataFrame({"policy": ["lru"], "capacity_tokens": [8192], "hit_rate": [0.5]})
    out = add_bytes_columns(df, load_model_config("llama-3.1-8b"))
    assert list(out.columns) == ["policy", "capacity_tokens", "capacity_bytes", "capacity_gib", "hit_rate"]
    assert out.capacity_bytes[0] == 8192 * 131_072 and out.capacity_gib[0] == 1.0
    assert add_bytes_columns(df, None) is df


def test_a_config_whose_name_is_not_a_string_is_named_after_its_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": 5, "num_hidden_layers": 1,
                                                    "num_attention_heads": 1, "hidden_size": 64}))
    kv = load_model_config(str(folder))
    assert kv.name == "my-model" and kv.num_layers == 1


def test_capacities_round_down_exactly_and_read_exponents_and_say_what_is_wrong():
    """Tokens rounded half up (2.7 -> 3) while bytes and pages round down; 1e3 was refused while 1e3GiB was
    read (and 1E3GiB refused); 4Gb (gigabits) was read as gigabytes; "1,000" said only "'000' holds no tokens"."""
    from core.lab.units import parse_capacity
    assert [parse_capacity(t) for t in ("2.7", "4.35k", "1e3", "1E3", "0.5M")] == [2, 4350, 1000, 1000, 500_000]
    assert parse_capacity("1.5p", 4) == 6
    with pytest.raises(ValueError, match="holds no tokens"):
        parse_capacity("0.6")
    with pytest.raises(ValueError, match="write 1000, not 1,000"):
        parse_capacity("000")
    with pytest.raises(ValueError, match="'Gb' is bits; write bytes: GB .* or GiB"):
        parse_capacity("4Gb")
    with pytest.raises(ValueError, match="is in bytes: give a model"):
        parse_capacity("1E3GiB")
