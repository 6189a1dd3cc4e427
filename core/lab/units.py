"""Model-aware units: a pool is sized in bytes of GPU memory, the cache counts tokens.

A model's Hugging Face `config.json` fixes the KV bytes of one token:
- multi-head / grouped-query attention (Llama, Qwen, SmolLM): K and V per layer,
  2 x num_hidden_layers x num_key_value_heads x head_dim x dtype bytes
  (head_dim = hidden_size / num_attention_heads when the config has none);
- multi-head latent attention (DeepSeek-V2/V3, `kv_lora_rank` in the config): one compressed
  latent plus the decoupled RoPE key per layer, as SGLang's MLATokenToKVPool and vLLM store it,
  (kv_lora_rank + qk_rope_head_dim) x num_hidden_layers x dtype bytes;
- an int8 KV cache also keeps one fp32 scale beside each stored row of head_dim values (per layer, KV head,
  K or V), as this engine's int8 pool does (core/cache/kv_pool.py): 4 B a row more (about 6 % at head_dim 64).

The KV heads are read in SGLang's order: 1 with `multi_query` (except a new-architecture Falcon), else Falcon's
`n_head_kv` / `num_kv_heads`, `num_key_value_heads`, ChatGLM's `multi_query_group_num`. Hybrid models count
only their attention layers (`layer_types`, `full_attention_interval`, Jamba's `attn_layer_period`); a layer type
whose cache is unknown is an error, and sliding-window layers count as full (an upper bound, said in the note).
A float32 config is served in 16 bits, as SGLang's dtype "auto" does (bfloat16 for Gemma, float16 otherwise).

Capacities then read as `80GiB` / `80GB` (bytes -> whole tokens, rounded down) besides tokens
(`3M` = 3,000,000 tokens, `512k` = 512,000 tokens, `1G` = 10^9 tokens) and pages (`6000p`).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Optional, Union

CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"
GIB = 1 << 30
GB = 10 ** 9

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
               "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "int8": 1}
# bytes kept beside each stored row (one layer, one KV head, K or V): int8 rows carry their fp32 scale (this
# engine's pool, LMDeploy's int8 KV); fp8 (SGLang's fp8_e4m3 / e5m2) scales per tensor, nothing per row
ROW_SCALE_BYTES = {"int8": 4}
_BYTE_UNITS = {"b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": GB, "tb": 10 ** 12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": GIB, "tib": 1 << 40}


@dataclass(frozen=True)
class ModelKV:
    """What one token of KV cache costs for a model."""

    name: str
    num_layers: int
    kv_heads: int            # MLA: 1 (one latent per token)
    head_dim: int            # MLA: kv_lora_rank + qk_rope_head_dim
    dtype: str
    dtype_bytes: int
    mla: bool = False
    row_scale_bytes: int = 0   # beside each row of head_dim values (ROW_SCALE_BYTES)
    note: str = ""             # what the figure assumed that the config left open (hybrid layers, float32)

    @property
    def bytes_per_token(self) -> int:
        rows = 1 if self.mla else 2 * self.kv_heads
        return self.num_layers * rows * (self.head_dim * self.dtype_bytes + self.row_scale_bytes)

    def tokens(self, num_bytes: float) -> int:
        """Whole tokens that fit in `num_bytes`."""
        return int(num_bytes // self.bytes_per_token)

    def gib(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / GIB

    def describe(self) -> str:
        shape = (f"MLA latent {self.head_dim} x {self.num_layers} layers" if self.mla else
                 f"2 x {self.num_layers} layers x {self.kv_heads} kv heads x {self.head_dim}")
        scale = f", + {self.row_scale_bytes} B scale a row" if self.row_scale_bytes else ""
        note = f" ({self.note})" if self.note else ""
        return (f"{self.name}: {self.bytes_per_token:,} KV bytes per token ({shape} x {self.dtype_bytes} B "
                f"{self.dtype}{scale}); 1 GiB = {self.tokens(GIB):,} tokens{note}")

    def to_dict(self) -> dict:
        return {"name": self.name, "num_layers": self.num_layers, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "dtype": self.dtype, "dtype_bytes": self.dtype_bytes, "mla": self.mla,
                "row_scale_bytes": self.row_scale_bytes, "bytes_per_token": self.bytes_per_token, "note": self.note}


def shipped_models() -> dict[str, Path]:
    """The configs shipped in core/lab/model_configs, by file stem."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.json"))}


def _positive_int(cfg: dict, key: str, where: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def dtype_bytes(dtype: str) -> tuple[int, int]:
    """(bytes a value, bytes kept beside each stored row: ROW_SCALE_BYTES) of a KV dtype."""
    d = str(dtype).lower().removeprefix("torch.")
    if d not in DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; choose one of: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[d], ROW_SCALE_BYTES.get(d, 0)


def model_kv(cfg: dict, name: str = "model", kv_dtype: Optional[str] = None) -> ModelKV:
    """KV bytes per token from a config dict (see the module docstring); `kv_dtype` overrides the
    config's torch_dtype (e.g. "fp8" for an FP8 KV cache, SGLang's --kv-cache-dtype fp8_e4m3)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: a model config must be a JSON object")
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    layers = _positive_int(cfg, "num_hidden_layers", name)
    notes = []
    dtype = kv_dtype or _served_dtype(cfg, notes)
    nbytes, scale = dtype_bytes(dtype)
    if cfg.get("kv_lora_rank"):
        width = _positive_int(cfg, "kv_lora_rank", name) + _positive_int(cfg, "qk_rope_head_dim", name)
        return ModelKV(name, layers, 1, width, str(dtype), nbytes, mla=True, row_scale_bytes=scale,
                       note="; ".join(notes))
    layers = _kv_layers(cfg, layers, name, notes)
    heads = _positive_int(cfg, "num_attention_heads", name)
    kv_heads = _kv_heads(cfg, heads, name)
    if cfg.get("head_dim"):
        head_dim = _positive_int(cfg, "head_dim", name)
    else:
        hidden = _positive_int(cfg, "hidden_size", name)
        if hidden % heads:
            raise ValueError(f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                             f"add head_dim to the config")
        head_dim = hidden // heads
    return ModelKV(name, layers, kv_heads, head_dim, str(dtype), nbytes, row_scale_bytes=scale, note="; ".join(notes))


def _served_dtype(cfg: dict, notes: list[str]) -> str:
    """The KV dtype a server gives the config by default: its torch_dtype, float32 served in 16 bits."""
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if str(dtype).lower().removeprefix("torch.") in ("float32", "fp32", "float"):
        served = "bfloat16" if str(cfg.get("model_type", "")).startswith("gemma") else "float16"
        notes.append(f"the config says float32; served as {served}, as SGLang's dtype auto does: --kv-dtype "
                     f"float32 for 4 B")
        return served
    return dtype


FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")


def _kv_heads(cfg: dict, heads: int, name: str) -> int:
    """KV heads in SGLang's order (ModelConfig.get_total_num_kv_heads): 1 with multi_query (GPT-BigCode, Falcon-7B:
    transformers' FalconConfig writes num_kv_heads = num_attention_heads beside it), except a Falcon of the new
    decoder architecture; then n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num (ChatGLM)."""
    new_falcon = cfg.get("model_type") in FALCON_TYPES and cfg.get("new_decoder_architecture") is True
    if cfg.get("multi_query") is True and not new_falcon:
        return 1
    for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
        if cfg.get(key) is not None:
            return _positive_int(cfg, key, name)
    return heads


KV_LAYER_TYPES = {"full_attention", "sliding_attention", "attention", "chunked_attention"}
NO_KV_LAYER_TYPES = {"linear_attention", "mamba", "conv", "recurrent", "ssm", "mamba2"}


def _kv_layers(cfg: dict, layers: int, name: str, notes: list[str]) -> int:
    """The layers that keep a KV cache: all, or a hybrid model's attention layers."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        unknown = sorted({str(t) for t in types} - KV_LAYER_TYPES - NO_KV_LAYER_TYPES)
        if unknown:
            raise ValueError(f"{name}: layer_types holds {', '.join(unknown)}, and whether such a layer keeps a KV "
                             f"cache is not known here; edit layer_types to full_attention / linear_attention")
        kv = sum(1 for t in types if t in KV_LAYER_TYPES)
        sliding = sum(1 for t in types if t == "sliding_attention")
    elif isinstance(cfg.get("full_attention_interval"), int) and cfg["full_attention_interval"] > 0:
        kv, sliding = layers // cfg["full_attention_interval"], 0
    elif isinstance(cfg.get("attn_layer_period"), int) and cfg["attn_layer_period"] > 0:
        period, offset = cfg["attn_layer_period"], cfg.get("attn_layer_offset", 0)
        kv, sliding = sum(1 for i in range(layers) if i % period == offset), 0
    else:
        kv = layers
        sliding = layers if cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False else 0
    if kv < 1:
        raise ValueError(f"{name}: no layer of this config keeps a KV cache (no attention layer)")
    if kv < layers:
        notes.append(f"{kv} of {layers} layers keep KV: the others are not attention")
    if sliding:
        notes.append(f"{sliding} sliding-window layers counted as full attention: an upper bound")
    return kv


def load_model_config(path_or_name: Union[str, os.PathLike], kv_dtype: Optional[str] = None) -> ModelKV:
    """A config.json path, a folder holding one, or a shipped name (case-insensitive; "Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B" and "llama-3.1-8b" are the same)."""
    text = os.fspath(path_or_name).strip()
    p = Path(text).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read model config {text!r}: {e}") from None
        name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
        if not isinstance(name, str):    # a label only: a number or a list there names nothing
            name = None
        return model_kv(cfg, (name or p.parent.name or p.stem).split("/")[-1], kv_dtype)
    shipped = shipped_models()
    want = text.split("/")[-1].lower()
    for stem, path in shipped.items():
        if stem.lower() == want or stem.lower().removesuffix("-instruct") == want.removesuffix("-instruct"):
            return model_kv(json.loads(path.read_text(encoding="utf-8")), stem, kv_dtype)
    raise ValueError(f"no model config {text!r}: give a path to a config.json (or its folder) or one of the "
                     f"shipped names: {', '.join(shipped)}")


_CAP = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*")


def _byte_unit(unit: str) -> Optional[int]:
    """Bytes per unit for 'GiB', 'GB', 'B' ... (case-insensitive); None for token units (k, M, G) and pages."""
    if unit == "B" or (len(unit) > 1 and unit.lower() in _BYTE_UNITS):
        if unit.endswith("b"):
            raise ValueError(f"{unit!r} is bits; write bytes: {unit[:-1]}B (10^9) or {unit[:-1].upper()}iB (2^30)")
        return _BYTE_UNITS[unit.lower()]
    return None


def in_bytes(text: Union[str, int]) -> bool:
    """Whether a capacity is written in bytes ('80GiB', '40GB'), which only a model's KV size turns into tokens."""
    m = _CAP.fullmatch(text) if isinstance(text, str) else None
    return m is not None and _byte_unit(m.group(2)) is not None


MAX_CAPACITY_TOKENS = 2**40   # ~1.1e12 tokens (~140 PB of Llama-3.1-8B's K/V): past it bytes overflow int64


class CapacityNeedsModel(ValueError):
    """A capacity in bytes without a model to turn bytes into tokens (worded for the CLI: the page words its own)."""

    def __init__(self, text: Union[str, int]) -> None:
        self.text = text
        super().__init__(f"capacity {text!r} is in bytes: give a model (--model-config, e.g. llama-3.1-8b) so bytes "
                         f"can become tokens, or write tokens (3M) or pages (6000p)")


def parse_capacity(text: Union[str, int], page_size: int = 1, kv: Optional[ModelKV] = None) -> int:
    """Tokens from '80GiB' / '40GB' (needs `kv`), '3M' (3,000,000 tokens), '512k', '6000p' (pages) or 3072000."""
    tokens = _parse_capacity(text, page_size, kv)
    if tokens > MAX_CAPACITY_TOKENS:
        raise ValueError(f"capacity {text!r} is {Decimal(tokens):.3g} tokens, more than any pool holds (at most "
                         f"{MAX_CAPACITY_TOKENS:,}); give a smaller one")
    return tokens


def _parse_capacity(text: Union[str, int], page_size: int, kv: Optional[ModelKV]) -> int:
    if not in_bytes(text):
        return _parse_tokens(text, page_size)
    if kv is None:
        raise CapacityNeedsModel(text)
    m = _CAP.fullmatch(text)
    num, scale = float(m.group(1)), _byte_unit(m.group(2))
    if not math.isfinite(num * scale):
        raise ValueError(f"cannot read capacity {text!r}")
    whole = kv.tokens(num * scale)
    tokens = whole - whole % page_size
    if tokens < page_size:
        raise ValueError(f"capacity {text!r} holds {whole:,} tokens of "
                         f"{kv.name}, below one page of {page_size} tokens; give more")
    return tokens


def _parse_tokens(text: Union[str, int], page_size: int) -> int:
    """'3072000', '3M', '512k', '1.5G' (tokens) or '6000p' (pages) -> tokens."""
    if isinstance(text, bool):
        raise ValueError(f"capacity must be a number of tokens, got {text!r}")
    if isinstance(text, int):
        tokens = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgG]|p|pages?)?\s*", str(text))
        if not m:
            raise ValueError(f"cannot read capacity {text!r}: use tokens (3072000, 3M, 512k) or pages (6000p)")
        unit = m.group(2) or ""
        scale = {"": 1, "k": 1000, "m": 10 ** 6, "g": 10 ** 9}.get(unit.lower(), page_size)
        tokens = math.floor(Decimal(m.group(1)) * scale)   # down, as bytes and pages are (4.35k: 4,350, not 4,349)
    if tokens < 1:   # before the page is known (a block trace sets it) "below one page of 1 tokens" misled
        comma = re.fullmatch(r"\s*0\d\d\s*", str(text))     # "1,000" split at its comma
        hint = " (capacities are separated by commas: write 1000, not 1,000)" if comma else ""
        raise ValueError(f"capacity {text!r} holds no tokens: give a positive number of tokens (3072000, 3M) or "
                         f"pages (6000p){hint}")
    if tokens < page_size:
        raise ValueError(f"capacity of {tokens} tokens is below one page of {page_size} tokens; "
                         f"give at least {page_size}")
    return tokens


def fmt_tokens(n: int) -> str:
    """3,072,000 -> '3.07M tokens (3,072,000)'; small counts plainly ('2,048 tokens')."""
    if n >= 10_000:
        for div, unit in ((10 ** 9, "G"), (10 ** 6, "M"), (10 ** 3, "k")):
            if n >= div:
                return f"{n / div:.3g}{unit} tokens ({n:,})"
    return f"{n:,} tokens"


def fmt_capacity(tokens: int, page_size: int = 1, kv: Optional[ModelKV] = None) -> str:
    """'3.07M tokens (3,072,000) = 6,000 pages of 512 = 375.0 GiB of Llama-3.1-8B KV'."""
    s = fmt_tokens(tokens)
    if page_size > 1:
        s += f" = {tokens // page_size:,} pages of {page_size}"
    if kv is not None:
        g = kv.gib(tokens)
        s += f" = {g:,.2f} GiB of {kv.name} KV" if g >= 1 else f" = {g:.3g} GiB of {kv.name} KV"
    return s


def add_bytes_columns(df, kv: Optional[ModelKV]):
    """The sweep table with capacity_bytes and capacity_gib next to capacity_tokens (a copy)."""
    if kv is None:
        return df
    out = df.copy()
    at = list(out.columns).index("capacity_tokens") + 1
    out.insert(at, "capacity_gib", out["capacity_tokens"] * kv.bytes_per_token / GIB)
    out.insert(at, "capacity_bytes", out["capacity_tokens"] * kv.bytes_per_token)
    return out


def plural(n: int, word: str) -> str:
    """'1 request', '2 requests', '1,024 pages'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"
