"""The Live page in AppTest on the real model, one per test module (its engine is shared across modules: see
radixui/connect/resources.py)."""
from __future__ import annotations

import pathlib

import pytest
from streamlit.testing.v1 import AppTest

APP = str(pathlib.Path(__file__).resolve().parents[3] / "app.py")


@pytest.fixture(scope="module")
def app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    return at
