"""CUDA graphs of the native decode step (core/engine/model/native_cuda.py) through the Engine.

On a CUDA device (scripts/gpu_check.sh sets RADIX_TEST_DEVICE=cuda) pure decode steps replay captured graphs: a
batch of 3 replays the graph of 4 (one padding row on slot 0), and a sequence growing past 256 keys moves to the
512-slot graph mid-stream. Greedy tokens must equal the eager engine's and HF generate's. On a CPU the same runs
prove the flag is a no-op there (no graph, same tokens).
"""
from __future__ import annotations

import copy
import random

import pytest
import torch

from core import env
from core.engine.engine import Engine
from core.engine.model.native_cuda import CudaGraphDecoder
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from core.engine.step_budget import FLOOR_FACTOR
from tests.tiny_models import CONFIGS, reference_greedy
from tests.engine.model.test_native_llama import make_ref

NEW = 24


def _prompts(seed: int) -> list[list[int]]:
    """A shared 40-token system prompt and three questions, the last one 230 tokens long so that its
    decode crosses from the 256-key graph to the 512-key one (230 + 40 + NEW > 256)."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 128) for _ in range(40)]
    return [system + [rng.randrange(1, 128) for _ in range(n)] for n in (5, 11, 200)]


def _engine_tokens(runner: ModelRunner, prompts: list[list[int]]) -> list[list[int]]:
    engine = Engine(runner, pool_slots=1024, max_prefill_tokens=64)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=NEW)) for p in prompts]
    while engine.has_work():
        engine.step()
    engine.check_invariants()
    return [h.result(0).token_ids for h in handles]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_decode_with_cuda_graphs_equals_eager_engine_and_generate(family):
    ref = make_ref(family)
    device = env.test_device()
    graphs = ModelRunner.from_hf(copy.deepcopy(ref), device=device, impl="native", numerics="fp32")
    eager = ModelRunner.from_hf(copy.deepcopy(ref), device=device, impl="native", numerics="fp32", cuda_graph=False)
    prompts = _prompts(seed=3)
    got = _engine_tokens(graphs, prompts)
    assert got == _engine_tokens(eager, prompts)
    assert got == [reference_greedy(ref, p, NEW) for p in prompts]
    assert not eager.cuda_graph
    decoder = graphs.native.graph_decoder
    floor_factors = (Engine(graphs, pool_slots=64).step_budget.floor_factor,
                     Engine(eager, pool_slots=64).step_budget.floor_factor)
    if torch.device(device).type == "cuda":
        assert graphs.cuda_graph
        assert floor_factors == (1.0, FLOOR_FACTOR)   # mixed steps beside graph decodes: see step_budget.py
        # batch 3 ran in the graph of 4 (one padding row); the long prompt's decode crossed 256 keys
        assert any(b == 4 for b, _ in decoder.graphs) and any(c == 512 for _, c in decoder.graphs)
        # another engine on the same model (a server rebuild): its pool's graphs replace the old pool's
        assert _engine_tokens(graphs, prompts[:1]) == got[:1]
        assert graphs.native.graph_decoder is not decoder and graphs.native.graph_decoder.pool is not decoder.pool
    else:
        assert not graphs.cuda_graph and decoder is None
        assert floor_factors == (FLOOR_FACTOR, FLOOR_FACTOR)


def test_cuda_graph_decoder_refuses_a_cpu_pool():
    ref = make_ref("llama")
    runner = ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="native", numerics="fp32")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA pool"):
        CudaGraphDecoder(runner.native, runner.make_pool(64))
