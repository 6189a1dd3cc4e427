"""Per-request sampling: greedy, temperature, top-k, top-p, seeds, stop strings.

Parameters are validated at submit time and the engine runs a frozen copy of what it validated,
so a bad value (NaN, None, a string, a mutation after submit) is the submitter's error, never a
failure inside the engine loop that other requests would feel.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

# As SGLang: a temperature this small is greedy (dividing logits by 1e-40 would overflow to inf).
SAMPLING_EPS = 1e-6
MAX_STOP_STRINGS = 64


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0        # 0 = greedy
    top_k: int = 0                  # 0 = no top-k cut
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: Sequence[str] = field(default_factory=tuple)
    ignore_eos: bool = False
    priority: int = 0               # used by the "priority" eviction policy

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"these SamplingParams belong to a submitted request and are frozen; "
                                 f"build new SamplingParams for the next request instead of setting {name}")
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        """Raise ValueError naming the field and what to change; normalises `stop` to a tuple."""
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not _is_real(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy) and finite, got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2 ** 63):
            raise ValueError(f"seed must be None or an integer in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not _is_int(self.priority) or abs(self.priority) >= 2 ** 62:
            raise ValueError(f"priority must be an integer (higher = kept longer by the 'priority' "
                             f"eviction policy), got {self.priority!r}")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is None or isinstance(stop, (bytes, bytearray)) or not isinstance(stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
        if any(not isinstance(s, str) or not s for s in stop) or len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop must be a list of at most {MAX_STOP_STRINGS} non-empty strings, got {stop!r}")
        if not self.__dict__.get("_frozen"):
            self.stop = tuple(stop)

    def frozen(self) -> "SamplingParams":
        """A validated, normalised copy that refuses mutation: what a request actually runs with."""
        self.validate()
        copy = SamplingParams(max_new_tokens=int(self.max_new_tokens), temperature=float(self.temperature),
                              top_k=int(self.top_k), top_p=float(self.top_p),
                              seed=None if self.seed is None else int(self.seed), stop=tuple(self.stop),
                              ignore_eos=bool(self.ignore_eos), priority=int(self.priority))
        object.__setattr__(copy, "_frozen", True)
        return copy

    def __copy__(self) -> "SamplingParams":
        return dataclasses.replace(self)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    def make_generator(self, device: torch.device) -> Optional[torch.Generator]:
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        if self.seed is not None:
            g.manual_seed(int(self.seed))
        else:
            g.seed()
        return g


def sample_row(row: torch.Tensor, p: SamplingParams, g: Optional[torch.Generator]) -> int:
    """One non-greedy token from one row of logits: temperature, then top-k, then top-p."""
    row = row.float() / float(p.temperature)
    if p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = cum - sorted_p > p.top_p   # keep the smallest set whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("the model produced non-finite logits for this request; it cannot be sampled")
    return int(torch.multinomial(probs, 1, generator=g).item())


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[Optional[torch.Generator]]) -> list[int]:
    """One token per row of `logits` [R, vocab]; greedy rows share one vectorised argmax."""
    out = logits.argmax(dim=-1).tolist()
    for r, (p, g) in enumerate(zip(params, generators)):
        if not p.greedy:
            out[r] = sample_row(logits[r], p, g)
    return out


def sample_isolated(logits: torch.Tensor, rows: list[int], owners: list) -> tuple[list, list]:
    """`sample` for the requests `owners` (each with .params and .generator) at `rows` of `logits`:
    ([(owner, token)], [(owner, exception)]). One bad row fails only its owner."""
    if not rows:
        return [], []
    index = torch.tensor(rows, device=logits.device)
    try:
        toks = sample(logits[index], [o.params for o in owners], [o.generator for o in owners])
        return list(zip(owners, toks)), []
    except Exception:
        pass
    got, failed = [], []
    for r, o in zip(rows, owners):  # find the culprit(s): one row at a time
        try:
            got.append((o, sample(logits[r:r + 1], [o.params], [o.generator])[0]))
        except Exception as exc:
            failed.append((o, exc))
    return got, failed
