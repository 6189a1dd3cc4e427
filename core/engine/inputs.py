"""What the engine accepts: prompts, request options and engine settings, checked before anything runs.

Every check raises ValueError with what to change (the server maps it to HTTP 400), so a bad
value never reaches the scheduler, where it would fail mid-step and strand other requests.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from core.engine.sampling import ParamError, SamplingParams

Prompt = Union[str, Sequence[int], Sequence[dict]]
MAX_PROMPT_CHARS = 20_000_000    # refuse before the tokenizer spends minutes on it
MAX_EXTRA_KEY_CHARS = 1024       # a namespace (cache_salt) as the engine takes it, a server's key prefix included
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")   # OpenAI's chat roles


def join_text_parts(texts: list[str]) -> str:
    """A message's text parts as one content string, joined with a space as SGLang joins them for chat templates
    that read content as a string (joined with nothing, "Hello" and "world" reached the model as "Helloworld")."""
    return " ".join(texts)


def check_device(device: Any) -> str:
    """'auto', 'cpu', 'cuda', 'cuda:N', 'mps': refused up front when this machine does not have it."""
    if not isinstance(device, str):
        raise ValueError(f"device must be a string such as 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "auto":
        return device
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"unknown device {device!r} ({exc}); pass auto, cpu or cuda") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available on this machine; "
                             f"pass --device cpu (or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r} is not available on this machine; pass --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {device!r} is not supported; pass auto, cpu or cuda")
    return device


def load_model(model: object, device: str, impl: str = "auto", numerics: str = "auto", kv_cache_dtype: str = "auto",
               cuda_graph: bool = True):
    """Load a model by name or path; every way that can fail becomes one ValueError naming the cause."""
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"model must be 'default', a local model path or a ModelRunner, got "
                         f"{type(model).__name__}")
    check_device(device)
    try:
        from core.engine.model.runner import ModelRunner

        return ModelRunner(os.fspath(model), device=device, impl=impl, numerics=numerics, kv_cache_dtype=kv_cache_dtype,
                           cuda_graph=cuda_graph)
    except ValueError:
        raise
    except (torch.OutOfMemoryError, MemoryError) as exc:
        raise ValueError(f"not enough memory to load model {model!r} on {device} ({exc}); "
                         f"use a smaller model or another device") from None
    except Exception as exc:  # broken config.json, missing weights, unreadable files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot load model {model!r}: {type(exc).__name__}: {reason[:300]}; "
                         f"pass 'default' or a complete Hugging Face checkpoint folder") from None


def available_memory(device: torch.device) -> int:
    """Bytes that a new allocation on `device` can still get."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil
    return int(psutil.virtual_memory().available)


def pool_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, slots: int) -> int:
    """K and V buffers of a pool of `slots` slots (the engine's per-slot arrays ride on the CPU); an int8 pool's fp32
    scale per (layer, slot, head) row included (KVPool.nbytes)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    scales = 4 if dtype is torch.int8 else 0
    return 2 * num_layers * slots * num_kv_heads * (head_dim * itemsize + scales)


def make_pool(runner, pool_slots: int, page_size: int):
    """The KV pool, refused with a clear error (not an out-of-memory crash) when it cannot fit."""
    check_pool_fits(runner, pool_slots, page_size)
    try:
        return runner.make_pool(pool_slots, page_size)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        raise ValueError(f"could not allocate a pool of {pool_slots:,} slots on {runner.device} "
                         f"({type(exc).__name__}); lower pool_slots") from None


def check_pool_fits(runner, pool_slots: int, page_size: int) -> None:
    size = pool_slots + page_size
    need = pool_bytes(runner.num_layers, runner.num_kv_heads, runner.head_dim, runner.dtype, size)
    host = size * (8 + 4 * runner.num_layers + 16)   # slot tokens, K norms, allocator
    have = available_memory(runner.device)
    if runner.device.type != "cuda":
        need += host
    if need > 0.9 * have:
        raise ValueError(f"a pool of {pool_slots:,} slots needs {need / 2**30:.2f} GiB on {runner.device}, "
                         f"but only {have / 2**30:.2f} GiB is free; lower pool_slots (--pool-slots)")


def check_extra_key(extra_key: Any, max_chars: int = MAX_EXTRA_KEY_CHARS) -> Optional[str]:
    """A namespace is a name: each of a request's tree nodes and events holds it, so its length is bounded."""
    if extra_key is not None and not isinstance(extra_key, str):
        raise ValueError(f"extra_key must be None or a string (a namespace such as a tenant or adapter "
                         f"name), got {type(extra_key).__name__} {extra_key!r}")
    if extra_key is not None and len(extra_key) > max_chars:
        raise ValueError(f"extra_key is a name of at most {max_chars:,} characters, got {len(extra_key):,}; "
                         f"send a short tenant or adapter name (or a hash of a longer one)")
    return extra_key


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """ParamError unless every logit_bias token is in the vocabulary (SamplingParams checks only that keys are
    token ids >= 0: the vocabulary is the model's)."""
    bad = [t for t in (params.logit_bias or {}) if int(t) >= vocab_size]
    if bad:
        raise ParamError("logit_bias", f"logit_bias names token {bad[0]}, outside the vocabulary "
                                       f"(0..{vocab_size - 1})")


def check_rid(rid: Any) -> Optional[str]:
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise ValueError(f"rid must be None or a non-empty string, got {rid!r}")
    return rid


def tokenize(tokenizer, vocab_size: int, prompt: Prompt, add_special_tokens: bool = True) -> tuple[list[int], str]:
    """Raw text (with the special tokens its tokenizer adds: a BOS for Llama 3 or Mistral, none for SmolLM2, as
    SGLang, vLLM and HF `tokenizer(text)` read text; none with add_special_tokens=False), token ids, or chat
    messages (the chat template)."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise ValueError("a prompt is text, not bytes: decode it first (e.g. data.decode('utf-8'))")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("empty prompt: type some text")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt of {len(prompt):,} characters is too long; shorten it")
        if tokenizer is None:
            raise ValueError("this engine's model has no tokenizer; submit token ids")
        _check_unicode(prompt)
        ids = list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        if not ids:
            raise ValueError(f"the prompt {prompt[:40]!r} tokenizes to no tokens (its tokenizer drops it); send text "
                             f"it keeps, or token ids")
        return ids, prompt
    if isinstance(prompt, dict) or not isinstance(prompt, (list, tuple, np.ndarray)):
        raise ValueError(f"a prompt is a string, a list of token ids, or a list of chat messages "
                         f"{{'role','content'}}, got {type(prompt).__name__}")
    prompt = list(prompt)
    if not prompt:
        raise ValueError("empty prompt: pass at least one token or chat message")
    if all(isinstance(m, dict) for m in prompt):
        return _chat(tokenizer, prompt)
    if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
        text = tokenizer.decode(prompt) if tokenizer else ""
        return [int(t) for t in prompt], text
    raise ValueError("a prompt is a string, a list of token ids, or a list of chat messages {'role','content'}")


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"prompt is not valid Unicode text ({exc.reason} at character {exc.start}); "
                         f"decode your input with errors='replace'") from None


def _chat(tokenizer, messages: list[dict]) -> tuple[list[int], str]:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template; submit raw text instead")
    for m in messages:
        if "role" not in m or "content" not in m:
            raise ValueError("chat messages need 'role' and 'content' keys")
        if not isinstance(m["role"], str) or not isinstance(m["content"], str):
            raise ValueError("a chat message's 'role' and 'content' must be strings")
        _check_unicode(m["content"])
    ids = chat_ids(tokenizer, messages)
    return ids, tokenizer.decode(ids)


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """The token ids of chat messages through the tokenizer's chat template (which transformers returns as a list
    or, in some versions, as a BatchEncoding)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]
