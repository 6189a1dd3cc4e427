"""The README stands alone in a bare clone: it points at nothing outside the repository, and every command it
names exists (`make` targets in the Makefile, `python -m` modules in the checkout)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CODE = "\n".join(re.findall(r"```(?:bash|python)?\n(.*?)```", README, re.S))


def test_it_points_at_nothing_outside_the_repository():
    assert "../" not in README
    assert "https://lmsys.org/blog/2024-01-17-sglang/" in README     # where the article it follows is published


def test_every_make_target_it_names_is_in_the_makefile():
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"(?:^|\s|`)make (\w[\w-]*)", README))
    assert named and named <= targets, named - targets


def test_every_project_module_its_commands_run_exists():
    modules = set(re.findall(r"python -m ((?:core|radixui)[\w.]*)", CODE))
    assert "core.engine.model.model_files" in modules                   # the tokenizer folder for GuideLLM
    missing = {m for m in modules if importlib.util.find_spec(m) is None}
    assert not missing, missing


def test_the_offline_benchmark_recipes_take_the_tokenizer_from_the_converted_folder():
    assert "TOK=$(.venv/bin/python -m core.engine.model.model_files default)" in CODE
    assert CODE.count("$TOK") == 2                                      # bench_serving's and GuideLLM's
