"""The Capacity lab's "through the real model" check: does the replay's prediction hold on the engine?

A small synthetic workload's prompts (token ids folded into the model's vocabulary: id % vocab_size)
go through two `core.engine.engine.Engine`s with the same pool, eviction policy and page size, one with the
radix cache and one with `disable_radix_cache=True`. The requests run one at a time, in arrival
order, alternating between the two engines, so that:
  - the order is the replay's (no overlap: each request finishes before the next arrives);
  - a request runs alone, so its time to first token is its prefill time;
  - both engines see the same machine load, request by request.
Every request generates `max_new_tokens` tokens greedily (EOS ignored), so the outputs must match.

The prediction is a cache-only replay of exactly what the engines receive: the folded prompts, each
followed by `max_new_tokens` fresh output tokens (the model's own answers, not the workload's, go
into the cache). The replay matches as the engine does: never a prompt's last token (whose logits the
engine needs), so a prompt cached whole hits one token less (a whole page less at pages of P when its
length is a multiple of P): page_trace.matchable_pages.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from core.engine.engine import Engine
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from core.lab.optimal import capacity_pages
from core.lab.replay import ReplayResult, replay
from core.lab.workloads import TraceRequest, Workload

MAX_REQUESTS = 48
MAX_PROMPT_TOKENS = 256
MAX_NEW_TOKENS = 16
MAX_POOL_SLOTS = 65_536

Progress = Callable[[int, int, str], None]


def check_model_run(workload: Workload, pool_slots: Optional[int] = None, page_size: int = 1,
                    max_new_tokens: int = 4) -> None:
    """ValueError with what to change when the workload (or, when given, the pool) does not suit a model run."""
    if workload.is_block_trace or any(r.hash_ids is not None for r in workload.requests):
        raise ValueError("a block trace (Mooncake) has no token ids to feed a model; the model run is for small "
                         "synthetic workloads")
    if len(workload) > MAX_REQUESTS:
        raise ValueError(f"the workload has {len(workload)} requests; the model run takes at most {MAX_REQUESTS} "
                         f"(it runs each one twice on the CPU): make the workload smaller (fewer requests in its "
                         f"parameters, or a shorter trace)")
    longest = max(r.prompt_len for r in workload.requests)
    if longest > MAX_PROMPT_TOKENS:
        raise ValueError(f"the longest prompt has {longest:,} tokens; the model run takes prompts of at most "
                         f"{MAX_PROMPT_TOKENS} tokens. Shorten the prompts in the workload's parameters")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"new tokens per request must be between 1 and {MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    if pool_slots is None:
        return
    pages = capacity_pages(pool_slots, page_size)
    slots = pages * page_size
    if slots > MAX_POOL_SLOTS:
        raise ValueError(f"a pool of {slots:,} slots is more than the model run allocates ({MAX_POOL_SLOTS:,}); "
                         f"pick a smaller capacity")
    need = longest + max_new_tokens - 1
    if -(-need // page_size) * page_size > slots:
        raise ValueError(f"a pool of {slots:,} slots cannot hold the longest prompt ({longest} tokens) plus "
                         f"{max_new_tokens} new tokens; pick a larger capacity")


def fold_prompts(workload: Workload, vocab_size: int) -> list[list[int]]:
    """Each prompt's token ids as ids of the model's vocabulary (id % vocab_size)."""
    return [[int(t) % vocab_size for t in r.prompt_ids()] for r in workload.requests]


def engine_workload(workload: Workload, prompts: list[list[int]], max_new_tokens: int) -> Workload:
    """What the engines receive, as a workload: the folded prompts, `max_new_tokens` fresh outputs each."""
    reqs = [TraceRequest(p, max_new_tokens, r.timestamp, extra_key=r.extra_key) for p, r in zip(prompts, workload.requests)]
    return Workload(f"{workload.name} (folded)", reqs, dict(workload.params))


@dataclass
class EngineRun:
    """One engine's measurements over the whole workload."""

    label: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_seconds: float = 0.0        # sum of the requests' times to first token
    total_seconds: float = 0.0          # sum of the requests' times from submit to finish
    evicted_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class ModelRunReport:
    workload: str
    requests: int
    pool_slots: int
    page_size: int
    policy: str
    max_new_tokens: int
    vocab_size: int
    on: EngineRun
    off: EngineRun
    predicted: ReplayResult
    seconds: float

    @property
    def mismatches(self) -> list[int]:
        """Indices of the requests whose greedy outputs differ between cache on and off."""
        return [i for i, (a, b) in enumerate(zip(self.on.outputs, self.off.outputs)) if a != b]

    @property
    def outputs_equal(self) -> bool:
        return len(self.on.outputs) == len(self.off.outputs) and not self.mismatches

    @property
    def prefill_saved(self) -> float:
        return self.off.prefill_seconds - self.on.prefill_seconds

    @property
    def total_saved(self) -> float:
        return self.off.total_seconds - self.on.total_seconds

    @staticmethod
    def _frac(saved: float, base: float) -> float:
        return saved / base if base > 0 else 0.0

    @property
    def prefill_saved_fraction(self) -> float:
        return self._frac(self.prefill_saved, self.off.prefill_seconds)

    @property
    def total_saved_fraction(self) -> float:
        return self._frac(self.total_saved, self.off.total_seconds)

    def table(self):
        """pandas DataFrame: cache on / cache off / replay, side by side."""
        import pandas as pd
        p = self.predicted
        rows = [
            {"run": "engine, radix cache on", "hit_rate": self.on.hit_rate, "cached_tokens": self.on.cached_tokens,
             "prompt_tokens": self.on.prompt_tokens, "prefill_s": self.on.prefill_seconds,
             "total_s": self.on.total_seconds, "evicted_tokens": self.on.evicted_tokens},
            {"run": "engine, cache off", "hit_rate": self.off.hit_rate, "cached_tokens": self.off.cached_tokens,
             "prompt_tokens": self.off.prompt_tokens, "prefill_s": self.off.prefill_seconds,
             "total_s": self.off.total_seconds, "evicted_tokens": self.off.evicted_tokens},
            {"run": "replay (predicted)", "hit_rate": p.hit_rate, "cached_tokens": p.hit_tokens,
             "prompt_tokens": p.prompt_tokens, "prefill_s": float("nan"), "total_s": float("nan"),
             "evicted_tokens": p.evicted_tokens},
        ]
        return pd.DataFrame(rows)


def _engine(runner: ModelRunner, pool_slots: int, page_size: int, policy: str, disable: bool) -> Engine:
    return Engine(runner, pool_slots=pool_slots, page_size=page_size, eviction_policy=policy,
                  schedule_policy="fcfs", max_running_requests=1, max_prefill_tokens=max(1024, MAX_PROMPT_TOKENS),
                  disable_radix_cache=disable, event_capacity=1000)


def _evicted(engine: Engine) -> int:
    return int(getattr(engine.cache, "evicted_tokens", 0) or 0)


def run_through_model(runner: ModelRunner, workload: Workload, capacity_tokens: int, policy: str = "lru",
                      page_size: int = 1, max_new_tokens: int = 4,
                      progress: Optional[Progress] = None) -> ModelRunReport:
    """Run `workload` through the engine with the radix cache on and off; see the module docstring."""
    check_model_run(workload, capacity_tokens, page_size, max_new_tokens)
    t0 = time.perf_counter()
    slots = capacity_pages(capacity_tokens, page_size) * page_size
    prompts = fold_prompts(workload, runner.vocab_size)
    predicted = replay(engine_workload(workload, prompts, max_new_tokens), slots, policy, page_size)
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    on = _engine(runner, slots, page_size, policy, disable=False)
    off = _engine(runner, slots, page_size, policy, disable=True)
    # warm-up outside the measurement (first forward passes allocate), then a clean slate
    warm = _engine(runner, max(16, page_size), page_size, policy, disable=True)
    warm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, ignore_eos=True))
    runs = {"on": EngineRun("radix cache on"), "off": EngineRun("cache off")}
    total = 2 * len(prompts)
    done = 0
    for i, prompt in enumerate(prompts):
        pair = (("on", on), ("off", off))
        for key, engine in (pair if i % 2 == 0 else pair[::-1]):   # alternate who goes first
            c = engine.generate([prompt], params)[0]
            if c.error:
                raise ValueError(f"request {i} failed in the engine ({runs[key].label}): {c.error}")
            run = runs[key]
            run.prompt_tokens += c.prompt_tokens
            run.cached_tokens += c.cached_tokens
            run.prefill_seconds += c.ttft or 0.0
            run.total_seconds += c.total_time
            run.outputs.append(list(c.token_ids))
            done += 1
            if progress is not None:
                progress(done, total, f"request {i + 1}/{len(prompts)}, {run.label}")
    for key, engine in (("on", on), ("off", off)):
        runs[key].evicted_tokens = _evicted(engine)
        engine.check_invariants()
    return ModelRunReport(workload=workload.name, requests=len(prompts), pool_slots=slots, page_size=page_size,
                          policy=policy, max_new_tokens=max_new_tokens, vocab_size=runner.vocab_size,
                          on=runs["on"], off=runs["off"], predicted=predicted, seconds=time.perf_counter() - t0)
