"""Tests of the C kernels run wherever they may: skipped only when RADIX_NATIVE_KERNELS=0 asks for the torch
fallbacks. A build that fails (no gcc, no Python.h, a compile error) fails the test with the reason, instead of
skipping a check CI would then never make."""
from __future__ import annotations

import pytest

from core import env
from core.engine.model import native_kernels


def require_kernels() -> None:
    if not env.native_kernels():
        pytest.skip("RADIX_NATIVE_KERNELS=0: the torch fallbacks are what runs")
    assert native_kernels.available(), f"the native kernels did not build: {native_kernels.error()}"
