"""RunnerCache (core/server/model_store.py): a rebuild reuses the loaded model unless a setting that shapes the
model itself changes; kv_cache_dtype is one of them (the native model writes its pool's dtype)."""
from __future__ import annotations

import torch

from core.engine.config import EngineConfig
from core.engine.sampling import SamplingParams
from core.server.model_store import RunnerCache
from tests.server.tiny_checkpoint import make_tiny_checkpoint


def test_a_rebuild_to_another_kv_cache_dtype_reloads_and_a_pool_change_does_not(tmp_path):
    folder = str(make_tiny_checkpoint(tmp_path / "tiny"))
    cache = RunnerCache("cpu")
    base = EngineConfig(model=folder, dtype="int8", pool_slots=64, device="cpu")
    first = cache(base)
    assert first.pool.k_buffer.dtype == torch.float32 and first.runner.native is not None
    resized = cache(base.replace(pool_slots=128))
    assert resized.runner is first.runner
    half = cache(base.replace(kv_cache_dtype="bf16"))
    assert half.runner is not first.runner
    assert half.pool.k_buffer.dtype == half.pool.v_buffer.dtype == torch.bfloat16
    assert (first.config.kv_cache_dtype, half.config.kv_cache_dtype) == ("fp32", "bf16")   # what runs
    out = half.generate([[5, 17, 33, 2]], SamplingParams(max_new_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and torch.isfinite(half.pool.k_buffer.float()).all()
