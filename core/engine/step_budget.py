"""How many prefill tokens a step may carry while other requests decode: the fairness knob.

A step runs every running decode (one token each) and some prefill tokens. Without a cap a long
prompt's chunk (thousands of tokens) makes that step, and so every decoding stream's next token,
wait seconds. So while anything decodes, the prefill tokens of a step are capped such that the step
takes about `ratio` times a decode-only step: the prefill advances every step (never starved) and a
stream's inter-token latency stays within `ratio` of its solo value.

What a prefill token costs is not one number: its projections cost the same everywhere, but its
attention grows with the keys before it, and deep into a long prompt the chunk's keys come from
memory once per step whatever its size. So the cap is a feedback loop on the engine's own steps,
not a cost model: after each mixed step the next cap is what would have made that step hit its
target at that step's cost per token (growing at most 2x a step, so one cheap step cannot let a
huge chunk through). A decode-only step's cost is measured per batch (the number of requests decoding):
the lower quartile of that batch's last DECODE_WINDOW decode-only steps, or of the nearest batch measured.
- Per batch: a 16-request decode step costs several times a 1-request one. One window for every batch (the
  rule before) set a busy server's base from whichever batches had decoded alone lately, and a base below the
  step's own decodes read as a dear prefill token: caps too small, TTFT up.
- The lower quartile of 64, not the median of 16 (the rule before): steps the machine slowed for a moment must
  not raise every later cap (during a long prefill no decode-only step comes to correct it), and such moments
  come in bursts. A client on the same machine building a 6,000-token request (the `openai` client: ~85 ms of
  CPU) and the server admitting it slowed the ~15 decode steps before the prompt's first chunk to 14-31 ms
  against 9; the median of the last 16 took 17 ms, so every mixed step of that prefill aimed at 2.5 x 17 ms and
  the stream's p99 went to 3.8x its solo value. The quartile of 64 ignores a burst of up to 48 such steps; a
  lasting change at one batch shows within 48 steps (a cheaper one within 16).
With nothing decoding, the step takes the whole budget.

Where even the smallest mixed step costs several times `ratio` decode steps (FLOOR_FACTOR), the ratio is lost
whatever the chunk: a step that carries prefill at all has a fixed cost a decode step has not (on CUDA its kernels
are launched one by one where a decode step replays a graph). Holding the chunk at the floor there only starved
the prompt (seen on an H200: a 6,000-token prompt beside a stream took 35 s at 2 tokens a step, each step ~45 ms
against a 2.5 ms decode step). So there the floor step's cost (the median of the last FLOOR_STEPS) is the base,
and a chunk may add (ratio - 1) decode steps on top of it: the same extra wait the ratio allows, for a real chunk.
On a CPU the floor stays within FLOOR_FACTOR (measured 1.4x the target early in a 6,000-token prompt, ~2.5x deep
into it) and the ratio rules: taking the floor as the base there raised the stream's p99 from 2.5x to 3.4x solo.
Where decode steps replay CUDA graphs the excess is that structural eager-vs-graph cost, and it shrinks relative to
the target as the batch grows (eager / graph: 5.8x at batch 1, 5.0x at batch 8 on the H200), so the engine passes
`floor_factor` 1 there: any floor above the target is the base.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

MIN_PREFILL_TOKENS = 2        # a floor: the oldest prefill and a waiting request each advance by a token a step
FIRST_MIXED_TOKENS = 16       # the cap of the first mixed step, before any has been measured
MAX_GROWTH = 2.0              # the cap grows at most this much from one mixed step to the next
DECODE_WINDOW = 64            # decode-only steps (of one batch) whose lower quartile is its decode step's cost
FLOOR_STEPS = 3               # mixed steps at the floor whose median is the cheapest a mixed step is now
FLOOR_FACTOR = 4.0            # a floor this many times the target: the ratio is given up for real chunks


@dataclass
class StepBudget:
    max_tokens: int           # EngineConfig.max_prefill_tokens: the budget of a step without decodes
    ratio: float              # EngineConfig.mixed_step_ratio: a mixed step's target, in decode steps; 0 = off
    decode_s: float = 0.0     # seconds of a decode-only step at the last batch measured (a seed until then; see above)
    mixed_tokens: Optional[float] = None   # the current cap of a mixed step (None: none measured yet)
    # rows a step of n rows costs as much as (ModelRunner.rows_computed): a capped step is filled to them
    rows_computed: Callable[[int], int] = field(default=lambda rows: rows, repr=False)
    floor_factor: float = FLOOR_FACTOR   # a floor this many times the target becomes the base (1: any floor above it)
    _decodes: dict = field(default_factory=dict, repr=False)   # batch -> its last DECODE_WINDOW decode-only steps
    _floors: deque = field(default_factory=lambda: deque(maxlen=FLOOR_STEPS), repr=False)

    def tokens(self, decoding: int) -> int:
        """The prefill tokens the next step may carry, with `decoding` requests decoding in it."""
        if decoding == 0 or self.ratio <= 0 or self.decode_s <= 0:
            return self.max_tokens
        cap = FIRST_MIXED_TOKENS if self.mixed_tokens is None else int(self.mixed_tokens + 1e-9)
        cap = max(MIN_PREFILL_TOKENS, min(self.max_tokens, cap))
        # the rows the kernels compute anyway (the int8 FMA kernel's blocks of 4): a cheaper chunk, not more budget
        return min(self.max_tokens, max(cap, self.rows_computed(decoding + cap) - decoding))

    def observe(self, seconds: float, prefill_tokens: int, decodes: int) -> None:
        """A finished step: its wall time, the prefill tokens it computed and the decodes it sampled."""
        if seconds <= 0:
            return
        if prefill_tokens == 0:
            if decodes:
                self._decodes.setdefault(decodes, deque(maxlen=DECODE_WINDOW)).append(seconds)
                self.decode_s = self.decode_cost(decodes)
                self._floors.clear()   # between prompts: the next long prompt measures its own floor
            return
        decode_s = self.decode_cost(decodes) if decodes else 0.0
        if decode_s <= 0 or self.ratio <= 0:
            return
        if prefill_tokens <= 2 * MIN_PREFILL_TOKENS:   # at the floor (a filled floor step carries a token or two more)
            self._floors.append(seconds)
        elif (self.floor_s() or 0.0) > seconds:        # a bigger chunk cost less: the floor was overestimated
            self._floors.extend([seconds] * FLOOR_STEPS)   # (maxlen FLOOR_STEPS: replaces them all)
        floor = self.floor_s()
        base = decode_s
        if floor is not None and floor >= self.floor_factor * self.ratio * decode_s:   # see the docstring
            base = floor
        per_token = max(seconds - base, 1e-6) / prefill_tokens
        fits = (self.ratio - 1.0) * decode_s / per_token
        grown = MAX_GROWTH * max(prefill_tokens, MIN_PREFILL_TOKENS)
        self.mixed_tokens = max(float(MIN_PREFILL_TOKENS), min(fits, grown, float(self.max_tokens)))

    def decode_cost(self, batch: int) -> float:
        """Seconds of a decode-only step with `batch` requests decoding: the lower quartile of that batch's window, or
        of the nearest batch measured (the larger on a tie); `decode_s` before any is measured."""
        if not self._decodes:
            return self.decode_s
        window = self._decodes.get(batch) or self._decodes[min(self._decodes, key=lambda b: (abs(b - batch), -b))]
        return sorted(window)[len(window) // 4]

    def floor_s(self) -> Optional[float]:
        """Seconds of a mixed step at the floor (the median of the last FLOOR_STEPS), None until measured."""
        return statistics.median(self._floors) if len(self._floors) == FLOOR_STEPS else None
