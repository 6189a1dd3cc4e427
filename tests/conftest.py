"""Shared fixtures: the default model is loaded once per test session (it is the slow part)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_runner():
    from core import env
    from core.engine.model.runner import ModelRunner

    return ModelRunner("default", device=env.test_device())  # scripts/gpu_check.sh


@pytest.fixture(scope="module")
def walk():
    """(cache, tokenizer, steps) of the article's walkthrough: time 0..3 on a pool of 11 slots."""
    from tests.article_cache import article_walkthrough

    return article_walkthrough()
