"""Shared fixtures: the default model is loaded once per test session (it is the slow part)."""
from __future__ import annotations

import pytest
import torch

# One torch thread in the test process: its models are tiny or small, and on a shared 2-core box intra-op
# threads only contend. Measured on 4 model test files (61 tests, load 9-11): 108 s and 306 s with torch's
# default, 59 s and 39 s with one thread. Servers the tests start as subprocesses choose their own.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_runner():
    from core import env
    from core.engine.model.runner import ModelRunner

    # fp32: the numerics whose greedy tokens equal HF generate's, which many tests compare with
    return ModelRunner("default", device=env.test_device(), numerics="fp32")  # scripts/gpu_check.sh


@pytest.fixture(scope="module")
def walk():
    """(cache, tokenizer, steps) of the article's walkthrough: time 0..3 on a pool of 11 slots."""
    from tests.article_cache import article_walkthrough

    return article_walkthrough()
