"""Engine.generate: submit a list of prompts and wait for all of them, all or nothing.

Why apart: it is a client of the engine's public calls (submit, step, abort, running), not engine state;
without a background loop it steps the engine itself."""
from __future__ import annotations

import time
from typing import Optional, Protocol, Sequence

from core.engine.inputs import Prompt
from core.engine.request import Completion, RequestHandle
from core.engine.sampling import SamplingParams


class Steppable(Protocol):
    """The engine's calls generate uses (engine.py's Engine)."""
    running: bool

    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> RequestHandle: ...

    def step(self) -> bool: ...

    def abort(self, rid: str) -> bool: ...


def generate(engine: Steppable, prompts: Sequence[Prompt], params: Optional[SamplingParams] = None,
             timeout: Optional[float] = None) -> list[Completion]:
    """Submit all, wait for all. All or nothing: a bad prompt, a timeout or an interrupt aborts
    the ones already queued, so nothing is left running without a handle."""
    if isinstance(prompts, (str, bytes, dict)):
        raise ValueError("generate takes a list of prompts; wrap a single prompt in a list")
    deadline = None if timeout is None else time.perf_counter() + timeout
    handles: list[RequestHandle] = []
    try:
        for p in prompts:
            handles.append(engine.submit(p, params))
        while not engine.running and not all(h.done() for h in handles):
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"generate did not finish within {timeout} s; the requests were aborted")
            if not engine.step() and not all(h.done() for h in handles):
                raise RuntimeError("engine is idle but requests are unfinished")
        return [h.result(None if deadline is None else max(0.0, deadline - time.perf_counter()))
                for h in handles]
    except BaseException:
        for h in handles:
            engine.abort(h.rid)
        raise
