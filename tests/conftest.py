"""Shared fixtures: the default model is loaded once per test session (it is the slow part)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_runner():
    import os

    from core.model import ModelRunner

    return ModelRunner("default", device=os.environ.get("RADIX_TEST_DEVICE", "cpu"))  # scripts/gpu_check.sh
