"""The article's walkthrough on the real engine: a pool of 11 slots, four prompts, one token each.

Each request is submitted and run in its own scheduler step, so the logical clock reads the
article's "time 0..3". The result is a list of frozen states (snapshot + that step's events)
that a viewer can step through back and forth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from core.cache.events import Event
from core.engine.engine import Engine
from core.engine.model.runner import ModelRunner
from core.engine.request import Completion
from core.engine.sampling import SamplingParams
from core.observe.snapshot import EngineSnapshot

ARTICLE_PROMPTS = ("Why my code throws errors", "Why GPU memory runs out", "Why my code is slow",
                   "Why my code won't compile")
ARTICLE_POOL_SLOTS = 11


@dataclass(frozen=True)
class WalkthroughStep:
    time: Optional[int]              # None for the empty start
    prompt: Optional[str]
    tokens: tuple[str, ...]          # the prompt's tokens as text pieces
    snapshot: EngineSnapshot
    events: tuple[Event, ...]        # what this step did, in order
    completion: Optional[Completion]


def run_walkthrough(runner: ModelRunner, prompts: tuple[str, ...] = ARTICLE_PROMPTS,
                    pool_slots: int = ARTICLE_POOL_SLOTS, eviction_policy: str = "lru") -> list[WalkthroughStep]:
    engine = Engine(runner, pool_slots=pool_slots, eviction_policy=eviction_policy)
    steps = [WalkthroughStep(None, None, (), engine.snapshot(), (), None)]
    for t, prompt in enumerate(prompts):
        seq = engine.cache.events.last_seq
        ids = engine.tokenize(prompt)[0]
        handle = engine.submit(prompt, SamplingParams(max_new_tokens=1))
        engine.step()
        engine.check_invariants()
        steps.append(WalkthroughStep(t, prompt, tuple(engine.token_piece(i) for i in ids), engine.snapshot(),
                                     tuple(engine.events_since(seq)), handle.result(0)))
    return steps
