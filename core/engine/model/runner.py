"""ModelRunner: load a Hugging Face causal LM with the radix_pool attention and run ForwardBatches.

The model code stays stock transformers; only the attention function is ours (hf_attention.py).
Where the checkpoint comes from (a name, a GGUF, a folder) is loader.py's business.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch

from core.cache.kv_pool import KVPool
from core.engine.config import DTYPES, KV_CACHE_DTYPES, MODEL_IMPLS   # the choices, kept with the settings
from core.engine.model.hf_attention import ATTN_IMPLEMENTATION, ForwardBatch, hf_unsupported_reason
from core.engine.model.loader import resolve_model
from core.engine.model.native_int8 import A16_ROW_BLOCK, GEMV_BLOCK_ROWS, GEMV_ROW_MAX, gemv_blocks
from core.engine.model.native_linear import many_rows

TESTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}


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


# "auto" on a CPU, chosen by measurement (benchmarks/README.md, "Numerics"): weight-only int8 decodes several
# times faster than fp32 (the weights are read once per step, a quarter of the bytes) and keeps cache on ==
# cache off; fp32 is the mode whose greedy tokens equal Hugging Face generate's, one flag away (--dtype fp32).
CPU_NATIVE_NUMERICS = "int8"
KV_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int8: "int8"}
# "auto" KV pool: the activations' dtype. bf16 K/V with int8 numerics (half the bytes a decode step reads at long
# context) was measured as the default and not taken: rounding to bf16 turns the ~1e-7 differences between a token
# computed in a prefill chunk and in a decode step (the int8 kernels' sum orders) into whole bf16 steps. With every
# prompt chunk on the tiles it held 50 / 50 on the agreement prompts, but 296 / 300 cache on == off on 150 mixed
# prompts over two turns, where fp32 K/V held 300 / 300 (benchmarks/README.md, "Numerics"); it stays one flag away
# (--kv-cache-dtype bf16). Without AMX (AVX-512, or AVX2 with w8a16_gemm) a bf16 pool runs with one order of sums
# and is cache-exact by construction (NativeLlama.one_order), but its decode rows then run fma_attention's slower
# arithmetic, so there too it is not the default.


def pick_kv_cache_dtype(kv_cache_dtype: str, numerics: str, impl: str) -> Optional[str]:
    """The native path's KV pool dtype (None: the activations' dtype); the HF path keeps its model's dtype."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; choose one of: {', '.join(KV_CACHE_DTYPES)}")
    if impl == "hf":
        if kv_cache_dtype not in ("auto", "bf16" if numerics == "bf16" else "fp32"):
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} differs from the model's numerics ({numerics}): "
                             f"only the native path stores K/V in another dtype; use model_impl 'native' or 'auto', "
                             f"or kv_cache_dtype 'auto'")
        return None
    return None if kv_cache_dtype == "auto" else kv_cache_dtype


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")   # any one will do


def pick_impl(impl: str, hf_model: torch.nn.Module) -> str:
    """"auto": the native Llama path where it supports the model, else the stock transformers one."""
    from core.engine.model.native_support import unsupported_reason

    if impl not in MODEL_IMPLS:
        raise ValueError(f"unknown model_impl {impl!r}; choose one of: {', '.join(MODEL_IMPLS)}")
    if impl == "hf":
        return "hf"
    reason = unsupported_reason(hf_model)
    if reason is None:
        return "native"
    if impl == "native":
        raise ValueError(f"the native model path cannot run this model ({reason}); use model_impl 'hf' or 'auto'")
    # said once, where the model loads: a user expecting the native path's speed (or int8) learns why not
    print(f"model path: hf (the native path cannot run this model: {reason})", file=sys.stderr, flush=True)
    return "hf"


def pick_numerics(numerics: str, impl: str, device: torch.device) -> str:
    """The numerics a runner uses: "auto" is bf16 on CUDA, and on a CPU fp32 for the HF path and the
    measured default for the native one; int8 (weight-only) exists on the native path only."""
    if numerics not in DTYPES:
        raise ValueError(f"unknown dtype {numerics!r}; choose one of: {', '.join(DTYPES)}")
    if numerics == "auto":
        return "bf16" if device.type == "cuda" else (CPU_NATIVE_NUMERICS if impl == "native" else "fp32")
    if numerics == "int8" and impl == "hf":
        raise ValueError("dtype 'int8' (weight-only) runs on the native model path only; use model_impl "
                         "'native' or 'auto', or dtype fp32 / bf16")
    return numerics


def eos_token_ids(*configs, tokenizer=None) -> set[int]:
    """The tokens a model stops on: each config's eos_token_id (generation_config.json's and config.json's; an id
    or a list) and its tokenizer's EOS. Gemma's and Llama 3's end of turn is not the tokenizer's EOS."""
    ids: set[int] = set()
    for source in configs:
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class ModelRunner:
    """One causal LM on one device; runs a ForwardBatch against a KVPool, returns last-token logits.

    Two implementations behind one `forward`: the native Llama-family path (native_llama.py: fused
    projections, attention straight over the pool, C kernels on CPU) and the stock transformers model
    with our attention hook (hf_attention.py), for any other architecture. `impl` picks ("auto": native
    where it can), `numerics` the dtype (fp32, bf16, or weight-only int8 on the native path), `kv_cache_dtype`
    the native path's KV pool dtype (auto, fp32, bf16), `cuda_graph` whether the native path replays pure decode
    steps as captured CUDA graphs on a CUDA device (native_cuda.py; off: every kernel launched from Python)."""

    def __init__(self, model: str = "default", device: str = "auto", impl: str = "auto",
                 numerics: str = "auto", kv_cache_dtype: str = "auto", cuda_graph: bool = True) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        if impl not in MODEL_IMPLS:
            raise ValueError(f"unknown model_impl {impl!r}; choose one of: {', '.join(MODEL_IMPLS)}")
        path = resolve_model(model)
        dev = _pick_device(device)
        config = AutoConfig.from_pretrained(path)
        if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
            raise ValueError(f"{path} holds a {config.model_type!r} model, which is not a causal LM; "
                             f"use a model of a tested family: {', '.join(TESTED_FAMILIES)}")
        check_supported(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)])
        # the native path converts from the fp32 weights itself; the HF path loads in its numerics' dtype
        hf_dtype = torch.float32
        if impl == "hf":
            hf_dtype = TORCH_DTYPES[pick_numerics(numerics, "hf", dev)]
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=hf_dtype, attn_implementation=ATTN_IMPLEMENTATION)
        if os.path.isdir(path) and not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
            raise ValueError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): copy the "
                             f"checkpoint's tokenizer files into it")
        self._setup(hf_model.to(dev), AutoTokenizer.from_pretrained(path), dev, impl, numerics, kv_cache_dtype,
                    cuda_graph)

    @classmethod
    def from_hf(cls, hf_model: torch.nn.Module, tokenizer=None, device: str = "auto", impl: str = "auto",
                numerics: str = "auto", kv_cache_dtype: str = "auto", cuda_graph: bool = True) -> "ModelRunner":
        """Wrap an already built model (tests use tiny `from_config` ones). Switches its attention in place."""
        check_supported(type(hf_model))
        runner = cls.__new__(cls)
        hf_model.set_attn_implementation(ATTN_IMPLEMENTATION)
        dev = _pick_device(device)
        runner._setup(hf_model.to(dev), tokenizer, dev, impl, numerics, kv_cache_dtype, cuda_graph)
        return runner

    def _setup(self, hf_model: torch.nn.Module, tokenizer, device: torch.device, impl: str, numerics: str,
               kv_cache_dtype: str, cuda_graph: bool = True) -> None:
        self.impl = pick_impl(impl, hf_model)
        self.numerics = pick_numerics(numerics, self.impl, device)
        kv_dtype = pick_kv_cache_dtype(kv_cache_dtype, self.numerics, self.impl)
        self.tokenizer = tokenizer
        self.device = device
        self.native = None
        if self.impl == "native":
            from core.engine.model.native_llama import NativeLlama
            self.native = NativeLlama.from_hf(hf_model, dtype=self.numerics, kv_dtype=kv_dtype, cuda_graph=cuda_graph)
            self.dtype = self.native.kv_dtype   # the pool holds what the native model writes
            hf_model.to("meta")                 # its weights live on in the native model's own layout only
        else:
            reason = hf_unsupported_reason(hf_model)
            if reason is not None:
                raise ValueError(f"this model cannot run here: {reason}")
            hf_model = hf_model.to(TORCH_DTYPES[self.numerics])
            self.dtype = next(hf_model.parameters()).dtype
        self.kv_cache_dtype = KV_NAMES[self.dtype]   # the pool's dtype as the setting names it
        n = self.native   # int8 projections in 4-row blocks: their inputs hidden, heads x head_dim, intermediate
        self._a16_blocks = n is not None and n.a16   # w8a16_gemm: rows in pairs
        self._gemv_blocks = (n is not None and n.mode == "int8" and device.type == "cpu" and not n.a16
                             and all(gemv_blocks(k) for k in (n.hidden_size, n.num_heads * n.head_dim, n.intermediate)))
        self.model = hf_model.eval()
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
        self.eos_token_ids: set[int] = eos_token_ids(getattr(hf_model, "generation_config", None), hf_model.config,
                                                     tokenizer=tokenizer)

    @property
    def cuda_graph(self) -> bool:
        """Whether pure decode steps replay CUDA graphs here (asked for, native path, CUDA device)."""
        return self.native is not None and self.native.cuda_graph

    def rows_computed(self, rows: int) -> int:
        """The rows a step of `rows` rows costs about as much as: the int8 FMA kernel runs 3 or more rows in blocks of
        GEMV_BLOCK_ROWS, so a mixed step whose prefill the fairness cap holds to 2 tokens beside one decode (3 rows)
        may take 3 (4 rows) for the same projections (StepBudget fills the block; benchmarks/README.md "mixed steps").
        With a16 (w8a16_gemm) rows below many_rows() go in pairs: an odd count fills to the next even one."""
        top = many_rows(self._a16_blocks) - 1   # from there the projections leave the FMA kernel (or a16's pairs)
        if self._a16_blocks:
            return rows if rows >= top else min(-(-rows // A16_ROW_BLOCK) * A16_ROW_BLOCK, top)
        if not self._gemv_blocks:
            return rows
        if rows <= GEMV_ROW_MAX or rows >= top:
            return rows
        return min(-(-rows // GEMV_BLOCK_ROWS) * GEMV_BLOCK_ROWS, top)

    def make_pool(self, num_slots: int, page_size: int = 1) -> KVPool:
        """A KV pool shaped for this model, on its device, in its dtype."""
        return KVPool(self.num_layers, num_slots, self.num_kv_heads, self.head_dim,
                      dtype=self.dtype, device=self.device, page_size=page_size)

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Run the new tokens of `batch`, writing their K/V into `pool`; [R, vocab] float32 logits."""
        if self.native is not None:
            return self.native.forward(batch, pool)
        with torch.inference_mode():
            out = self.model(input_ids=batch.input_ids[None], position_ids=batch.positions[None],
                             use_cache=False, radix_batch=batch, radix_pool=pool,
                             logits_to_keep=batch.logits_indices)
        return out.logits[0].float()
