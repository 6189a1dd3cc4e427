"""The engine's snapshot: cache, pool, requests and metrics as one immutable EngineSnapshot."""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache
from core.engine.engine_metrics import EngineMetrics
from core.engine.request import Request
from core.engine.scheduler import Scheduler
from core.observe import snapshot as snap
from core.observe.snapshot import snapshot_cache


class SnapshotSource(Protocol):
    """What a snapshot reads of the engine. The engine hands itself in; a protocol rather than the
    Engine class keeps the import one-way (engine.py imports this module)."""

    cache: RadixCache
    scheduler: Scheduler
    allocator: SlotAllocator
    runner: Any                 # .num_layers
    slot_tokens: np.ndarray     # last token written per slot (-1: never)
    k_norms: np.ndarray         # [layers, slots] the heatmap
    metrics: EngineMetrics
    step_count: int
    instance_id: str            # this engine, not another built since

    def token_piece(self, tok: int) -> str: ...

EVICTED_TEXT_EVENTS = 2000   # evicted tokens named in token_text: those of the last N events


def build(engine: SnapshotSource, table: list[Request], inbox: int, version: int = 0) -> snap.EngineSnapshot:
    """Call with the engine lock held; `table` and `inbox` were read under the table lock."""
    cache_view = snapshot_cache(engine.cache)
    held = engine.scheduler.held_slots().cpu().numpy()
    states = snap.slot_states(cache_view, engine.slot_tokens >= 0, held)
    alloc = engine.allocator
    pool = snap.PoolView(num_layers=engine.runner.num_layers, num_slots=alloc.num_slots,
                         page_size=alloc.page_size, states=snap.frozen_array(states),
                         slot_tokens=snap.frozen_array(engine.slot_tokens),
                         k_norms=snap.frozen_array(engine.k_norms))
    reqs = tuple(request_view(r) for r in table)
    counts = np.bincount(states, minlength=len(snap.SLOT_STATES))
    sched = engine.scheduler
    metrics = engine.metrics.as_dict(
        free_slots=alloc.available(), evictable_slots=int(counts[snap.EVICTABLE]),
        locked_slots=int(counts[snap.LOCKED] + counts[snap.IN_USE]), in_use_slots=int(counts[snap.IN_USE]),
        num_slots=alloc.num_slots, evicted_tokens=engine.cache.evicted_tokens,
        waiting=len(sched.waiting) + inbox, running=len(sched.running),
        retractions=sched.retractions, step=engine.step_count)
    metrics["held_back"] = sched.held_back
    toks = set()
    for n in cache_view.nodes:
        toks.update(n.token_ids)
    for ev in engine.cache.events.since(max(0, cache_view.seq - EVICTED_TEXT_EVENTS)):
        if ev.kind == "evict":   # evicted text stays nameable
            toks.update(ev.token_ids)
    toks.update(np.unique(engine.slot_tokens).tolist())
    toks.discard(-1)
    return snap.EngineSnapshot(seq=cache_view.seq, step=engine.step_count, cache=cache_view, pool=pool,
                               requests=reqs, metrics=metrics,
                               token_text={t: engine.token_piece(t) for t in sorted(toks)}, version=version,
                               engine_id=engine.instance_id)


def request_view(r: Request) -> snap.RequestView:
    c = r.completion()
    return snap.RequestView(rid=r.rid, state=r.state, prompt_tokens=len(r.prompt_ids),
                            cached_tokens=r.cached_tokens or 0, output_tokens=len(r.output_ids),
                            prompt_text=r.prompt_text, output_text=r.output_text,
                            finish_reason=r.finish_reason, ttft=c.ttft,
                            total_time=c.total_time if r.finish_time is not None else None, error=r.error)
