"""The registry: every policy by name. It imports every policy module; no policy imports it back.

`POLICIES[name]` is a key function over a node: the policy's own for SGLang's key policies, and for
a stateful policy a stand-in (its LRU tie-break) that tools keying a *snapshot* node can call; the
live cache always uses the policy object `make_policy` returns.
"""
from __future__ import annotations

from typing import Optional

from core.cache.eviction.base import (
    KEY_DESCRIPTIONS,
    KEY_POLICIES,
    EvictionPolicy,
    KeyPolicy,
    PolicyCache,
    PolicyKey,
    lru_key,
)
from core.cache.eviction.classic import ARC, GDSF, S3FIFO, LeCaR
from core.cache.eviction.learned import LRB, LRBARC
from core.cache.eviction.lhd import LHD
from core.cache.eviction.recall import Recall, RecallValue

STATEFUL: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (GDSF, ARC, S3FIFO, LeCaR, LHD, Recall, RecallValue, LRB, LRBARC)}
POLICIES: dict[str, PolicyKey] = {**KEY_POLICIES, **{name: lru_key for name in STATEFUL}}
DESCRIPTIONS: dict[str, str] = {**KEY_DESCRIPTIONS, **{name: cls.description for name, cls in STATEFUL.items()}}


def get_policy(name: str) -> PolicyKey:
    """The key function of a policy (for stateful ones the stand-in); ValueError on unknown names."""
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown eviction policy {name!r}; choose one of: {', '.join(POLICIES)}") from None


def make_policy(name: str, cache: Optional[PolicyCache] = None) -> EvictionPolicy:
    """A fresh policy object for one cache (stateful policies keep per-cache state)."""
    fn = get_policy(name)
    pol = STATEFUL[name]() if name in STATEFUL else KeyPolicy(name, fn)
    if cache is not None:
        pol.attach(cache)
    return pol


def is_stateful(name: str) -> bool:
    return name in STATEFUL
