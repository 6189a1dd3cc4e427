"""What `make run` says while the server starts (core/server/launch.py's starting_message): the one-time model
conversion and its cost on a cold start only, nothing about it once the converted folder is cached."""
from __future__ import annotations

import pathlib

import pytest

from core.engine.model.model_files import DEFAULT_GGUF
from core.server.launch import COLD_START_SECONDS, starting_message

URL = "http://127.0.0.1:30000"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.setenv("RADIX_MODEL_CACHE", str(tmp_path / "models"))
    return tmp_path / "models"


def test_a_cold_start_says_it_converts_the_model_once_and_how_long_it_takes(cache):
    assert starting_message(URL, "default") == (
        f"engine server starting on {URL}: converting the model once, about {COLD_START_SECONDS} s "
        "(later starts skip this)...")


def test_a_warm_start_says_nothing_about_converting(cache):
    folder = cache / DEFAULT_GGUF.removesuffix(".gguf")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert starting_message(URL, "default") == f"engine server starting on {URL}..."


def test_a_local_checkpoint_folder_never_converts(cache, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert starting_message(URL, str(tmp_path / "ckpt")) == f"engine server starting on {URL}..."


def test_a_half_written_conversion_counts_as_cold(cache):
    (cache / DEFAULT_GGUF.removesuffix(".gguf")).mkdir(parents=True)   # no config.json: conversion not finished
    assert "converting the model once" in starting_message(URL, "default")
