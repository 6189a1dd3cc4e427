"""How many prefill tokens a step may carry while other requests decode: the fairness knob.

A step runs every running decode (one token each) and some prefill tokens. Without a cap a long
prompt's chunk (thousands of tokens) makes that step, and so every decoding stream's next token,
wait seconds. So while anything decodes, the prefill tokens of a step are capped such that the step
takes about `ratio` times a decode-only step: the prefill advances every step (never starved) and a
stream's inter-token latency stays within `ratio` of its solo value. The costs are measured online,
from the engine's own steps (an exponential average): what a decode-only step costs at the current
batch, and what one prefill token costs. With nothing decoding, the step takes the whole budget.
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_PREFILL_TOKENS = 16       # a floor: a prefill always advances, even when decode steps are very cheap
EMA = 0.2                     # weight of the newest measurement


@dataclass
class StepBudget:
    max_tokens: int           # EngineConfig.max_prefill_tokens: the budget of a step without decodes
    ratio: float              # EngineConfig.mixed_step_ratio: a mixed step's target, in decode steps; 0 = off
    decode_s: float = 0.0     # measured: seconds of a decode-only step (per step, at its batch)
    token_s: float = 0.0      # measured: seconds per prefill token, beyond the decode part of its step

    def tokens(self, decoding: int) -> int:
        """The prefill tokens the next step may carry, with `decoding` requests decoding in it."""
        if decoding == 0 or self.ratio <= 0 or self.decode_s <= 0 or self.token_s <= 0:
            return self.max_tokens
        allowed = int((self.ratio - 1.0) * self.decode_s / self.token_s)
        return max(MIN_PREFILL_TOKENS, min(self.max_tokens, allowed))

    def observe(self, seconds: float, prefill_tokens: int, decodes: int) -> None:
        """A finished step: its wall time, the prefill tokens it computed and the decodes it sampled."""
        if seconds <= 0:
            return
        if prefill_tokens == 0:
            if decodes:
                self.decode_s = _ema(self.decode_s, seconds)
            return
        extra = seconds - (self.decode_s if decodes else 0.0)
        if extra > 0:
            self.token_s = _ema(self.token_s, extra / prefill_tokens)


def _ema(old: float, new: float) -> float:
    return new if old <= 0 else (1 - EMA) * old + EMA * new
