"""Issue 10, item 8: `python -m core` exits with one clear line and status 2 on every bad flag or
model path, and Ctrl-C prints what was generated so far and exits 130."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from core.__main__ import main
from core.engine.model.loader import resolve_model
from tests.interrupts import default_sigint
from tests.tiny_models import TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A complete checkpoint: a tiny random Llama over the default model's real tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(resolve_model("default"))
    torch.manual_seed(0)
    cfg = LlamaConfig(**{**TINY, "vocab_size": len(tok)})
    cfg.eos_token_id = None
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "nan"], "temperature must be >= 0"),
    (["--temperature", "1e400"], "temperature must be >= 0"),
    (["--max-new-tokens", "-1"], "max_new_tokens must be an integer >= 0"),
    (["--top-p", "0"], r"top_p must be in (0, 1]"),
    (["--pool-slots", "0"], "raise pool_slots"),
    (["--page-size", "0"], "page_size must be an integer >= 1"),
    (["--max-running-requests", "0"], "max_running_requests must be an integer >= 1"),
    (["--pool-slots", "10000000000000"], "lower pool_slots"),
    (["--seed", str(2 ** 64)], "seed must be None or a 64-bit integer"),
    (["--stop", ""], "stop must be"),
    (["--max-new-tokens", "x"], "invalid int value: 'x'"),
    (["--eviction-policy", "random"], "invalid choice: 'random'"),
    (["--priority", "high"], "invalid int value: 'high'"),
])
def test_bad_flags_exit_2_with_one_line(capsys, tiny_folder, flags, message):
    with pytest.raises(SystemExit) if "invalid" in message else _nothing():
        rc = main(["hello", "--model", str(tiny_folder), *flags])
        assert rc == 2
    assert message in _one_error_line(capsys)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_argparse_errors_also_exit_2():
    with pytest.raises(SystemExit) as info:
        main(["hello", "--max-new-tokens", "x"])
    assert info.value.code == 2


def test_cuda_on_a_cpu_box(capsys):
    if torch.cuda.is_available():
        assert main(["hello", "--device", "tpu9"]) == 2
        assert "unknown device" in _one_error_line(capsys)
    else:
        assert main(["hello", "--device", "cuda"]) == 2
        assert "CUDA is not available on this machine; pass --device cpu" in _one_error_line(capsys)


def test_broken_config_json(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    assert main(["hello", "--model", str(tmp_path), "--device", "cpu"]) == 2
    assert f"cannot load model {str(tmp_path)!r}" in _one_error_line(capsys)


def test_folder_without_weights(capsys, tmp_path, tiny_folder):
    (tmp_path / "config.json").write_text((tiny_folder / "config.json").read_text())
    assert main(["hello", "--model", str(tmp_path), "--device", "cpu"]) == 2
    assert f"cannot load model {str(tmp_path)!r}" in _one_error_line(capsys)


def test_no_such_model_path(capsys, tmp_path):
    assert main(["hello", "--model", str(tmp_path / "nope")]) == 2
    assert "neither 'default', nor a local Hugging Face checkpoint" in _one_error_line(capsys)


def test_bad_prompt_queues_nothing(capsys, tiny_folder):
    assert main(["hello", "", "--model", str(tiny_folder)]) == 2
    assert "empty prompt" in _one_error_line(capsys)


def test_priority_flag_runs(capsys, tiny_folder):
    assert main(["hello there", "--model", str(tiny_folder), "--priority", "3", "--eviction-policy", "priority",
                 "--max-new-tokens", "3"]) == 0
    assert "cache: hit rate" in capsys.readouterr().err


def test_ctrl_c_prints_the_text_so_far_and_exits_130(tiny_folder):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "core", "Tell me a long story", "--model", str(tiny_folder),
                             "--max-new-tokens", "480", "--pool-slots", "1024"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    try:
        first = proc.stdout.read(8)        # the stream has started
        assert first
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:   # say where it hung: SIGABRT makes faulthandler dump every stack
            proc.send_signal(signal.SIGABRT)
            _out, err = proc.communicate(timeout=30)
            pytest.fail(f"no exit 60 s after Ctrl-C; its stderr ends: {err.decode()[-4000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    err_lines = [l for l in err.decode().splitlines() if "Loading weights" not in l and l.strip()]
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert err_lines[-1].startswith("interrupted: printed the text generated so far")
    assert len(first + out) > 8


def test_readme_example_reports_a_nonzero_hit_rate(capsys, smollm2_runner):
    """README: python -m core "Why my code throws errors" "Why my code is slow" (fewer new tokens
    here to stay fast; the hits come from the prompts). The second prompt arrives a step after the
    first, as in the article, and finds "Why my code" cached."""
    assert main(["Why my code throws errors", "Why my code is slow", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "prompt 5 tokens, cached 3" in err
    assert "cache: hit rate 30.0%" in err
    # each answer under its request's id, as the stats name them: two answers printed run together read as one
    ids = re.findall(r"^\[(r\d+)\] prompt", err, re.M)
    assert [ln.split("]")[0] + "]" for ln in out.splitlines() if ln.startswith("[r")] == [f"[{i}]" for i in ids]


def test_a_folder_without_a_tokenizer_says_so(capsys, tmp_path, tiny_folder):
    """transformers' own message spans lines and names no file; the first line alone ("Couldn't instantiate
    the backend tokenizer from one of:") was all the CLI printed."""
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((tiny_folder / name).read_bytes())
    assert main(["hello", "--model", str(tmp_path), "--device", "cpu"]) == 2
    assert _one_error_line(capsys) == (f"error: {tmp_path} has no tokenizer (none of tokenizer.json, "
                                       f"tokenizer_config.json, tokenizer.model, vocab.json): copy the "
                                       f"checkpoint's tokenizer files into it")



def test_a_reader_that_leaves_the_pipe_ends_the_cli_quietly(tiny_folder):
    """`python -m core ... | head -c 1`: it printed "error: [Errno 32] Broken pipe" and exited 2 (bad input)."""
    proc = subprocess.Popen([sys.executable, "-m", "core", "hello", "--model", str(tiny_folder), "--max-new-tokens",
                             "400"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1)                 # the answer streams; then the reader leaves
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0 and "Broken pipe" not in err and "Traceback" not in err, err
