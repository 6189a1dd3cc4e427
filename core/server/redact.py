"""What a caller without the admin key sees of the engine: its shape, not its text.

Token ids are text too (any copy of the model's tokenizer decodes them), so a redacted snapshot
keeps every count, size, slot state and timing but carries no prompt or output text, no token id
(each becomes 0, so lengths stay right) and no namespace name; cache events lose theirs the same way.
The heatmap's K norms go too: layer 0's K is the token's embedding through fixed weights, and RoPE
keeps its norm, so a table made from the public weights reads a slot's token back from its norm.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from core.observe.snapshot import EngineSnapshot, frozen_array

HIDDEN = "(hidden: needs the admin key)"


def _zeros(ids) -> tuple[int, ...]:
    return (0,) * len(ids)


def snapshot(snap: EngineSnapshot) -> EngineSnapshot:
    cache = snap.cache
    nodes = tuple(dataclasses.replace(n, token_ids=_zeros(n.token_ids),
                                      extra_key=None if n.extra_key is None else HIDDEN) for n in cache.nodes)
    requests = tuple(dataclasses.replace(r, prompt_text="", output_text="",
                                         error=None if r.error is None else HIDDEN) for r in snap.requests)
    slot_tokens = np.where(snap.pool.slot_tokens >= 0, 0, -1).astype(snap.pool.slot_tokens.dtype)
    pool = dataclasses.replace(snap.pool, slot_tokens=frozen_array(slot_tokens), k_norms=None)
    return dataclasses.replace(snap, cache=dataclasses.replace(cache, nodes=nodes), pool=pool,
                               requests=requests, token_text={}, redacted=True)


def event(d: dict[str, Any]) -> dict[str, Any]:
    """An event as `wire.event_to_dict` made it, without token ids or namespace."""
    if "token_ids" in d:
        d["token_ids"] = list(_zeros(d["token_ids"]))
    if d.get("extra_key") is not None:
        d["extra_key"] = HIDDEN
    return d
