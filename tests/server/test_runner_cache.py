"""RunnerCache (core/server/model_store.py): a rebuild reuses the loaded model unless a setting that shapes the
model itself changes; kv_cache_dtype is one of them (the native model writes its pool's dtype)."""
from __future__ import annotations

import argparse

import pytest
import torch

from core.engine import config as engine_config
from core.engine.config import EngineConfig
from core.engine.sampling import SamplingParams
from core.server.model_store import RunnerCache
from tests.server.tiny_checkpoint import make_tiny_checkpoint


def test_a_rebuild_to_another_kv_cache_dtype_reloads_and_a_pool_change_does_not(tmp_path):
    folder = str(make_tiny_checkpoint(tmp_path / "tiny"))
    cache = RunnerCache()
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


def test_disable_cuda_graph_is_a_model_setting_and_the_cli_flag_sets_it(tmp_path):
    """CUDA graphs are captured by the loaded runner, so turning them off loads another runner; on a CPU neither
    runner replays graphs. `--disable-cuda-graph` is SGLang's flag name."""
    folder = str(make_tiny_checkpoint(tmp_path / "tiny"))
    cache = RunnerCache()
    base = EngineConfig(model=folder, pool_slots=64, device="cpu")
    first = cache(base)
    eager = cache(base.replace(disable_cuda_graph=True))
    assert eager.runner is not first.runner
    assert (first.runner.cuda_graph, eager.runner.cuda_graph) == (False, False)   # no CUDA here
    assert cache(base.replace(disable_cuda_graph=True, pool_slots=128)).runner is eager.runner
    parser = argparse.ArgumentParser()
    engine_config.add_flags(parser)
    args = parser.parse_args(["--disable-cuda-graph"])
    assert engine_config.from_args(args).disable_cuda_graph is True
    assert EngineConfig(disable_cuda_graph=True).to_args() == ["--disable-cuda-graph"]


def test_the_device_is_the_configs_and_one_this_machine_lacks_is_refused_keeping_the_model(tmp_path):
    """The device was the server's --device whatever a rebuild asked: {"device": "bogus"} answered 200 and the
    config said "bogus" while the model ran on the CPU. Now the config's device is the one loaded or refused."""
    folder = str(make_tiny_checkpoint(tmp_path / "tiny"))
    cache = RunnerCache()
    base = EngineConfig(model=folder, pool_slots=64, device="cpu")
    first = cache(base)
    assert cache.key[1] == "cpu" and first.runner.device.type == "cpu" and first.pool.k_buffer.device.type == "cpu"
    for device in ("bogus", "cuda:7", "meta"):
        with pytest.raises(ValueError, match="device"):
            cache(base.replace(device=device))
        assert cache.runner is first.runner and cache.key[1] == "cpu"
    assert cache(base.replace(pool_slots=128)).runner is first.runner
