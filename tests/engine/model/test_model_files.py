"""`python -m core.engine.model.model_files`: the converted folder's path (GuideLLM's and bench_serving's
tokenizer, in the README), or a one-line reason and a non-zero exit."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from core.engine.model.model_files import DEFAULT_GGUF, locate

ROOT = pathlib.Path(__file__).resolve().parents[3]


def run(cache: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RADIX_MODEL_CACHE=str(cache))
    env.pop("RADIX_MODEL", None)
    return subprocess.run([sys.executable, "-m", "core.engine.model.model_files", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_it_prints_the_converted_default_folder_when_it_exists(tmp_path):
    folder = tmp_path / DEFAULT_GGUF.removesuffix(".gguf")
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    got = run(tmp_path, "default")
    assert (got.returncode, got.stdout, got.stderr) == (0, f"{folder}\n", "")


def test_before_the_first_start_it_says_how_to_convert_and_exits_1(tmp_path):
    got = run(tmp_path)
    assert got.returncode == 1 and got.stdout == ""
    assert got.stderr.startswith(f"error: {DEFAULT_GGUF} is not converted yet")
    assert "start the server once" in got.stderr and len(got.stderr.splitlines()) == 1


def test_a_path_that_is_no_model_exits_2_naming_it(tmp_path):
    got = run(tmp_path, str(tmp_path / "nothing"))
    assert got.returncode == 2 and "cannot load model" in got.stderr and str(tmp_path / "nothing") in got.stderr


def test_a_gguf_file_converts_into_the_cache_under_its_own_name(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIX_MODEL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "Other.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    assert locate(str(gguf)) == (tmp_path / "cache" / "Other.Q8_0", gguf)


def test_the_tokenizer_folder_is_the_converted_folder_once_it_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIX_MODEL_CACHE", str(tmp_path))
    from core.engine.model.model_files import tokenizer_folder
    assert tokenizer_folder("default") == "default"              # not converted yet: the router gets the name
    assert tokenizer_folder("no/such/model") == "no/such/model"
    folder = tmp_path / DEFAULT_GGUF.removesuffix(".gguf")
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert tokenizer_folder("default") == str(folder)
