"""Per-request sampling: greedy, temperature, top-k, top-p, seeds, stop strings.

Parameters are validated at submit time so a bad value is the submitter's error, never a
failure inside the engine loop that other requests would feel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch


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

    def validate(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def make_generator(self, device: torch.device) -> Optional[torch.Generator]:
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        if self.seed is not None:
            g.manual_seed(int(self.seed))
        else:
            g.seed()
        return g


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[Optional[torch.Generator]]) -> list[int]:
    """One token per row of `logits` [R, vocab]; greedy rows share one vectorised argmax."""
    out = logits.argmax(dim=-1).tolist()
    for r, (p, g) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        row = logits[r].float() / float(p.temperature)
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
        out[r] = int(torch.multinomial(probs, 1, generator=g).item())
    return out
