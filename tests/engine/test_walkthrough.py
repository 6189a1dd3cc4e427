"""The article's walkthrough, to the slot (the article: seed/radixattention-blog.txt in the shared material).

Word-level tokens, a pool of 11 slots, clock = request index. Every request generates one
token and finishes, so only its prompt is cached. Each request follows the engine's flow:
match_prefix -> inc_lock_ref(last_node) -> alloc (on None: evict(need - available), alloc)
-> insert(prompt, prefix + new) -> free value[len(prefix):returned] -> dec_lock_ref.
"""
from __future__ import annotations

import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.invariants import check_cache_invariants
from core.observe.snapshot import snapshot_cache

PROMPTS = [
    "Why my code throws errors",
    "Why GPU memory runs out",
    "Why my code is slow",
    "Why my code won't compile",
]
VOCAB: dict[str, int] = {}
for _p in PROMPTS:
    for _w in _p.split():
        VOCAB.setdefault(_w, len(VOCAB) + 1)
WORDS = {i: w for w, i in VOCAB.items()}


def tokens(text: str) -> list[int]:
    return [VOCAB[w] for w in text.split()]


def text(token_ids) -> str:
    return " ".join(WORDS[int(t)] for t in token_ids)


class Walkthrough:
    def __init__(self) -> None:
        self.t = 0
        self.alloc = SlotAllocator(11)
        self.cache = RadixCache(self.alloc, clock=lambda: self.t)

    def run(self, t: int, prompt: str) -> dict:
        """One request at time t; returns what each step of the flow saw."""
        self.t = t
        cache, alloc = self.cache, self.alloc
        seq0 = cache.events.last_seq
        key = RadixKey(tokens(prompt))
        m = cache.match_prefix(key)
        cache.inc_lock_ref(m.last_node)
        out = {"hit": m.indices.tolist(), "last_node": m.last_node, "first_alloc": None, "evicted": None}
        need = len(key) - m.indices.numel()
        new = alloc.alloc(need)
        if new is None:
            out["first_alloc"] = "None"
            out["order_before_evict"] = [text(n.key.token_ids) for n in cache.eviction_order()]
            out["evicted"] = cache.evict(need - alloc.available())
            out["free_after_evict"] = alloc.free_pages.tolist()
            new = alloc.alloc(need)
        out["alloc"] = new.tolist()
        value = torch.cat([m.indices, new])
        returned = cache.insert(key, value)
        out["returned"] = returned
        alloc.free(value[m.indices.numel():returned])
        cache.dec_lock_ref(m.last_node)
        check_cache_invariants(cache, held_slots=torch.empty(0, dtype=torch.int64))
        out["events"] = cache.events.since(seq0)
        out["free_pages"] = alloc.free_pages.tolist()
        return out

    def tree(self) -> dict[str, tuple]:
        """edge text -> (parent edge text, slots, last_access_time, lock_ref)."""
        out = {}
        for n in self.cache.nodes():
            if n is self.cache.root_node:
                continue
            parent = None if n.parent is self.cache.root_node else text(n.parent.key.token_ids)
            out[text(n.key.token_ids)] = (parent, n.value.tolist(), n.last_access_time, n.lock_ref)
        return out

    def evictable(self) -> dict[str, int]:
        return {text(n.key.token_ids): n.last_access_time for n in self.cache.evictable_leaves}


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def test_walkthrough_to_the_slot():
    w = Walkthrough()
    cache, alloc = w.cache, w.alloc
    assert alloc.free_pages.tolist() == list(range(1, 12))

    # ---- time 0: empty tree, nothing hit, alloc(5) gives 1..5, one node ------------------------
    r = w.run(0, PROMPTS[0])
    assert r["hit"] == [] and r["last_node"] is cache.root_node
    assert r["alloc"] == [1, 2, 3, 4, 5] and r["first_alloc"] is None
    assert r["returned"] == 0
    assert w.tree() == {"Why my code throws errors": (None, [1, 2, 3, 4, 5], 0, 0)}
    assert r["free_pages"] == [6, 7, 8, 9, 10, 11]
    assert w.evictable() == {"Why my code throws errors": 0}
    # locking the root is a no-op and emits nothing
    assert kinds(r["events"]) == ["match", "alloc", "insert"]
    match, alloc_ev, ins = r["events"]
    assert (match.tokens_asked, match.tokens_hit, match.path, match.time) == (5, 0, (), 0)
    assert alloc_ev.slots == (1, 2, 3, 4, 5)
    assert (ins.node, ins.parent, ins.slots, ins.token_ids) == (1, 0, (1, 2, 3, 4, 5), tuple(tokens(PROMPTS[0])))
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (5, 0, 5)

    # ---- time 1: "Why" splits off with [1]; [6,7,8,9] for "GPU memory runs out" -------------
    r = w.run(1, PROMPTS[1])
    assert r["hit"] == [1]
    assert text(r["last_node"].key.token_ids) == "Why"
    assert r["alloc"] == [6, 7, 8, 9] and r["returned"] == 1
    assert w.tree() == {
        "Why": (None, [1], 1, 0),
        "my code throws errors": ("Why", [2, 3, 4, 5], 1, 0),
        "GPU memory runs out": ("Why", [6, 7, 8, 9], 1, 0),
    }
    assert r["free_pages"] == [10, 11]
    assert w.evictable() == {"my code throws errors": 1, "GPU memory runs out": 1}  # both leaves at time 1
    assert kinds(r["events"]) == ["split", "match", "lock", "alloc", "insert", "unlock"]
    split, match, lock, alloc_ev, ins, unlock = r["events"]
    assert (split.node, split.new_parent, split.position, split.time) == (1, 2, 1, 1)
    assert (match.tokens_hit, match.path) == (1, (2,))
    assert (lock.node, lock.path) == (2, (2,)) and (unlock.node, unlock.path) == (2, (2,))
    assert alloc_ev.slots == (6, 7, 8, 9)
    assert (ins.node, ins.parent, ins.slots) == (3, 2, (6, 7, 8, 9))

    # ---- time 2: "my code" splits off with [2,3]; [10,11] for "is slow"; pool full -----------
    r = w.run(2, PROMPTS[2])
    assert r["hit"] == [1, 2, 3]
    assert text(r["last_node"].key.token_ids) == "my code"
    assert r["alloc"] == [10, 11] and r["returned"] == 3
    assert w.tree() == {
        "Why": (None, [1], 2, 0),
        "my code": ("Why", [2, 3], 2, 0),
        "throws errors": ("my code", [4, 5], 2, 0),
        "is slow": ("my code", [10, 11], 2, 0),
        "GPU memory runs out": ("Why", [6, 7, 8, 9], 1, 0),
    }
    assert r["free_pages"] == [] and alloc.available() == 0
    # the three evictable leaves (red in the article) at times 2, 2, 1
    assert w.evictable() == {"throws errors": 2, "is slow": 2, "GPU memory runs out": 1}
    assert sorted(w.evictable().values(), reverse=True) == [2, 2, 1]
    assert text(cache.eviction_order(1)[0].key.token_ids) == "GPU memory runs out"
    assert kinds(r["events"]) == ["split", "match", "lock", "alloc", "insert", "unlock"]
    split, match, lock, alloc_ev, ins, unlock = r["events"]
    assert (split.node, split.new_parent, split.position) == (1, 4, 2)
    assert (match.tokens_hit, match.path) == (3, (2, 4))
    assert alloc_ev.slots == (10, 11)
    assert (ins.node, ins.parent, ins.slots) == (5, 4, (10, 11))

    # ---- time 3: match [1,2,3] with no split, lock, evict [6,7,8,9], alloc [6,7] -------------
    r = w.run(3, PROMPTS[3])
    assert r["hit"] == [1, 2, 3]
    assert text(r["last_node"].key.token_ids) == "my code"
    assert r["first_alloc"] == "None"
    # with the matched path locked, the heap's top is the time-1 leaf
    assert r["order_before_evict"][0] == "GPU memory runs out"
    assert set(r["order_before_evict"]) == {"GPU memory runs out", "throws errors", "is slow"}
    assert r["evicted"] == 4  # a whole leaf: four slots though two were needed
    assert r["free_after_evict"] == [6, 7, 8, 9]
    assert r["alloc"] == [6, 7]
    assert r["free_pages"] == [8, 9]
    assert r["returned"] == 3
    assert w.tree() == {
        "Why": (None, [1], 3, 0),
        "my code": ("Why", [2, 3], 3, 0),
        "throws errors": ("my code", [4, 5], 2, 0),
        "is slow": ("my code", [10, 11], 2, 0),
        "won't compile": ("my code", [6, 7], 3, 0),
    }
    assert kinds(r["events"]) == ["match", "lock", "evict", "free", "alloc", "insert", "unlock"]
    match, lock, evict, free, alloc_ev, ins, unlock = r["events"]
    assert (match.tokens_asked, match.tokens_hit, match.path) == (5, 3, (2, 4))
    assert (lock.node, lock.path) == (4, (2, 4))
    assert (evict.node, evict.parent, evict.slots, evict.last_access_time, evict.policy_key) == \
        (3, 2, (6, 7, 8, 9), 1, (1.0,))
    assert evict.token_ids == tuple(tokens("GPU memory runs out"))
    assert free.slots == (6, 7, 8, 9)
    assert alloc_ev.slots == (6, 7)
    assert (ins.node, ins.parent, ins.slots, ins.token_ids) == (6, 4, (6, 7), tuple(tokens("won't compile")))
    assert all(e.time == 3 for e in r["events"])
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (9, 0, 9)


def test_walkthrough_time3_lock_holds_the_matched_path_during_eviction():
    """Between lock and unlock at time 3 the matched path [1],[2,3] is protected and not in the heap."""
    w = Walkthrough()
    for t in range(3):
        w.run(t, PROMPTS[t])
    w.t = 3
    cache = w.cache
    m = cache.match_prefix(RadixKey(tokens(PROMPTS[3])))
    cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 3 and cache.evictable_size() == 8
    assert w.tree()["Why"][3] == 1 and w.tree()["my code"][3] == 1
    # evicting everything evictable still leaves the locked prefix
    assert cache.evict(100) == 8
    assert w.tree() == {"Why": (None, [1], 3, 1), "my code": ("Why", [2, 3], 3, 1)}
    assert w.alloc.free_pages.tolist() == [6, 7, 8, 9, 4, 5, 10, 11]
    cache.dec_lock_ref(m.last_node)
    check_cache_invariants(cache, held_slots=torch.empty(0, dtype=torch.int64))
    assert w.evictable() == {"my code": 3}


def test_walkthrough_snapshot_at_time_2():
    w = Walkthrough()
    for t in range(3):
        w.run(t, PROMPTS[t])
    snap = snapshot_cache(w.cache)
    assert snap.free_pages == () and snap.total_size == 11 and snap.time == 2
    leaves = {text(n.token_ids): n.last_access_time for n in snap.nodes if n.evictable}
    assert leaves == {"throws errors": 2, "is slow": 2, "GPU memory runs out": 1}
    assert text(snap.node(snap.eviction_order[0]).token_ids) == "GPU memory runs out"
    by_text = {text(n.token_ids): n.slots for n in snap.nodes if n.id != snap.root_id}
    assert by_text == {"Why": (1,), "my code": (2, 3), "throws errors": (4, 5), "is slow": (10, 11),
                       "GPU memory runs out": (6, 7, 8, 9)}
    assert snap.seq == w.cache.events.last_seq
