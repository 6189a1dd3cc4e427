"""The article's walkthrough on the real cache (pool of 11 slots, word tokens, one request per time
step), recording each step's snapshot and events; shared by the radixui tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.invariants import check_cache_invariants
from core.observe.snapshot import PoolView, slot_states, snapshot_cache

PROMPTS = ("Why my code throws errors", "Why GPU memory runs out", "Why my code is slow",
           "Why my code won't compile")


class WordTokenizer:
    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab) + 1) for w in text.split()]

    def token_text(self, ids) -> str:
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv.get(int(i), f"<{int(i)}>") for i in ids)


@dataclass
class Step:
    time: int
    snapshot: object
    events: list
    pool: PoolView


def run_request(cache: RadixCache, ids: list[int]) -> None:
    """The request flow: match -> lock -> alloc (evict if None) -> insert -> free duplicates -> unlock."""
    alloc = cache.allocator
    key = RadixKey(ids)
    m = cache.match_prefix(key)
    cache.inc_lock_ref(m.last_node)
    need = len(ids) - m.indices.numel()
    slots = alloc.alloc(need) if need else torch.empty(0, dtype=torch.int64)
    if slots is None:
        cache.evict(need - alloc.available())
        slots = alloc.alloc(need)
    value = torch.cat([m.indices, slots])
    n = cache.insert(key, value)
    if n > m.indices.numel():
        alloc.free(value[m.indices.numel():n])
    cache.dec_lock_ref(m.last_node)


def pool_view(cache: RadixCache, written: np.ndarray, slot_tokens: np.ndarray,
              num_layers: int = 3) -> PoolView:
    snap = snapshot_cache(cache)
    states = slot_states(snap, written, np.empty(0, dtype=np.int64))
    size = snap.num_slots + snap.page_size
    k = np.zeros((num_layers, size), dtype=np.float32)
    for layer in range(num_layers):  # known numbers: written slots hold 10*layer + slot
        k[layer, written.astype(bool)] = 10 * layer + np.flatnonzero(written)
    return PoolView(num_layers=num_layers, num_slots=snap.num_slots, page_size=snap.page_size,
                    states=states, slot_tokens=slot_tokens.copy(), k_norms=k)


def article_walkthrough(steps: int = 4):
    """Returns (cache, tokenizer, [Step for time 0..steps-1])."""
    tok = WordTokenizer()
    alloc = SlotAllocator(11)
    cache = RadixCache(alloc)
    written = np.zeros(12, dtype=bool)
    slot_tokens = np.full(12, -1, dtype=np.int64)
    out = []
    for t, prompt in enumerate(PROMPTS[:steps]):
        cache.logical_clock.t = t
        seq = cache.events.last_seq
        ids = tok.encode(prompt)
        run_request(cache, ids)
        evs = cache.events.since(seq)
        for e in evs:
            if e.kind == "insert":
                written[list(e.slots)] = True
                slot_tokens[list(e.slots)] = e.token_ids
        check_cache_invariants(cache)
        out.append(Step(t, snapshot_cache(cache), evs, pool_view(cache, written, slot_tokens)))
    return cache, tok, out
