"""Shared fixtures: the default model is loaded once per test session (it is the slow part)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_runner():
    from core.model import ModelRunner

    return ModelRunner("default", device="cpu")
