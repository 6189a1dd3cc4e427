"""The engine's snapshot: cache, pool, requests and metrics as one immutable EngineSnapshot."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from core import snapshot as snap
from core.request import Request

if TYPE_CHECKING:
    from core.engine import Engine

EVICTED_TEXT_EVENTS = 2000   # evicted tokens named in token_text: those of the last N events


def build(engine: "Engine", table: list[Request], inbox: int) -> snap.EngineSnapshot:
    """Call with the engine lock held; `table` and `inbox` were read under the table lock."""
    cache_view = engine.cache.snapshot()
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
                               token_text={t: engine.token_piece(t) for t in sorted(toks)})


def request_view(r: Request) -> snap.RequestView:
    c = r.completion()
    return snap.RequestView(rid=r.rid, state=r.state, prompt_tokens=len(r.prompt_ids),
                            cached_tokens=r.cached_tokens or 0, output_tokens=len(r.output_ids),
                            prompt_text=r.prompt_text, output_text=r.output_text,
                            finish_reason=r.finish_reason, ttft=c.ttft,
                            total_time=c.total_time if r.done.is_set() else None, error=r.error)


def request_tokens(engine, rid: str) -> Optional[dict]:
    """{"prompt_ids", "output_ids"} of a request still in the engine's table (the last finished ones
    stay), or None: a viewer walks the tree with them to show the path the request matched."""
    with engine._table_lock:
        req = engine._requests.get(rid)
        if req is None:
            return None
        return {"prompt_ids": [int(t) for t in req.prompt_ids], "output_ids": [int(t) for t in req.output_ids]}


def token_bytes(engine, token_ids: Sequence[int]) -> list[bytes]:
    """Each token's raw bytes, so a viewer decodes whole runs (byte-level BPE splits characters)."""
    from core.token_bytes import token_bytes as of_tokenizer
    if engine.tokenizer is None:
        return [str(int(t)).encode() for t in token_ids]
    return of_tokenizer(engine.tokenizer, token_ids)


def token_piece(engine, tok: int) -> str:
    """A token decoded alone, once per distinct token (the snapshot's token_text)."""
    if tok not in engine._pieces:
        engine._pieces[tok] = engine.tokenizer.decode([tok]) if engine.tokenizer is not None else str(tok)
    return engine._pieces[tok]
