"""Where a model comes from: "default", a GGUF file or a local checkpoint folder -> a folder
`from_pretrained` loads fast. A GGUF is de-quantized into safetensors once (doing it on every start
costs ~20 s), in $RADIX_MODEL_CACHE or ~/.cache/radixattention/models. Nothing is downloaded.
"""
from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile
import time

import torch

# re-exported: callers import these from the loader
from core.engine.model.model_files import DEFAULT_GGUF, default_gguf, locate, model_cache_root  # noqa: F401


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
    """"default" | path to a .gguf file | local HF checkpoint folder -> a loadable folder (converting a GGUF once)."""
    target, gguf = locate(model)
    if gguf is not None:
        _convert_gguf(gguf, target)
    return target
