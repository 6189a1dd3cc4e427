"""Fixtures of the capacity-lab tests: the Mooncake synthetic trace (read once) and small workloads."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.lab.traces import MOONCAKE_SYNTHETIC

MOONCAKE = Path(MOONCAKE_SYNTHETIC)


@pytest.fixture(scope="session")
def mooncake_path() -> Path:
    if not MOONCAKE.exists():
        pytest.fail(f"the Mooncake trace is missing at {MOONCAKE} (it ships with the project: data/mooncake/README.md)")
    return MOONCAKE


@pytest.fixture(scope="session")
def mooncake(mooncake_path):
    from core.lab.traces import load_mooncake
    return load_mooncake(mooncake_path)
