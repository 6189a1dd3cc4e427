"""The replay against an independent reference written here from its spec, counting exactly the same things.

The reference is a plain-Python radix tree over lists (page-granular compare, LRU leaf eviction with the
older node first on ties, parents joining once childless, locks on running paths) and a free-slot *count*
in place of the allocator; it replays the engine's flow as the replay's docstring states it:

  arrive: match the whole prompt pages -> lock -> take ceil(prompt + output - 1) - hit slots, evicting
  (need - free) when short; still short: unlock, reject (no hits) -> count the hit -> insert the prompt
  pages (cache_unfinished_req), lock that path instead -> (no overlap: finish at once)
  finish: insert the whole pages of prompt + output - 1 (even when that adds nothing: the insert stamps the
  path, as SGLang's cache_finished_req does), give back duplicates and the partial page, unlock.

The clock ticks once per event (arrival or finish). Hits, evicted nodes, evicted tokens and rejections
must equal the replay's exactly, for every page size, with and without overlap.
"""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.lab.page_trace import Overlap
from core.lab.replay import replay
from core.lab.workloads import TraceRequest, Workload


class _Node:
    def __init__(self, nid: int, key: list, parent, t: int) -> None:
        self.id, self.key, self.parent, self.t = nid, key, parent, t
        self.children: dict = {}
        self.lock = 0


class RefReplay:
    """Counts of one replay, computed with lists and dicts only."""

    def __init__(self, capacity_tokens: int, ps: int) -> None:
        self.ps = ps
        self.free = capacity_tokens // ps * ps
        self.ids = itertools.count()
        self.root = _Node(next(self.ids), [], None, 0)
        self.hits = self.evictions = self.evicted = self.rejected = 0
        self.running: dict[int, tuple] = {}
        self.now = 0

    # ----- the tree ---------------------------------------------------------------------------------------
    def _ck(self, toks: list, ek):
        return (ek, tuple(toks[:self.ps]))

    def _walk(self, toks: list, ek) -> tuple[_Node, int]:
        node, pos = self.root, 0
        node.t = self.now
        while pos < len(toks):
            child = node.children.get(self._ck(toks[pos:], ek))
            if child is None:
                break
            child.t = self.now
            n = 0
            while n < len(child.key) and pos + n < len(toks) and child.key[n] == toks[pos + n]:
                n += 1
            n -= n % self.ps
            pos += n
            if n < len(child.key):   # split: the new node takes the matched pages and becomes the parent
                mid = _Node(next(self.ids), child.key[:n], node, self.now)
                mid.lock = child.lock
                node.children[self._ck(child.key, ek)] = mid
                child.key, child.parent = child.key[n:], mid
                mid.children[self._ck(child.key, ek)] = child
                return mid, pos
            node = child
        return node, pos

    def insert(self, toks: list, ek) -> int:
        node, pos = self._walk(toks, ek)
        if pos < len(toks):
            leaf = _Node(next(self.ids), toks[pos:], node, self.now)
            node.children[self._ck(leaf.key, ek)] = leaf
        return pos

    def lock(self, node: _Node, d: int) -> None:
        while node is not self.root:
            node.lock += d
            node = node.parent

    def evict(self, need: int) -> None:
        def all_nodes(n):
            for c in n.children.values():
                yield c
                yield from all_nodes(c)
        cand = {n for n in all_nodes(self.root) if not n.children and n.lock == 0}
        freed = 0
        while freed < need and cand:
            v = min(cand, key=lambda n: (n.t, n.id))
            cand.discard(v)
            del v.parent.children[next(k for k, c in v.parent.children.items() if c is v)]
            freed += len(v.key)
            self.evictions += 1
            p = v.parent
            if p is not self.root and not p.children and p.lock == 0:
                cand.add(p)
        self.free += freed
        self.evicted += freed

    # ----- the flow ---------------------------------------------------------------------------------------
    def arrive(self, r: TraceRequest, keep_running: bool) -> None:
        ps, ek = self.ps, r.extra_key
        seq = r.cached_ids().tolist()
        n_prompt = r.prompt_len - r.prompt_len % ps
        prompt = seq[:n_prompt] if n_prompt <= len(seq) else r.prompt_ids().tolist()[:n_prompt]
        node, hit = self._walk(prompt[:(r.prompt_len - 1) // ps * ps], ek)   # never the prompt's last token
        self.lock(node, 1)
        need = -(-r.cached_len // ps) * ps - hit
        if need > self.free:
            self.evict(need - self.free)
        if need > self.free:
            self.lock(node, -1)
            self.rejected += 1
            return
        self.free -= need
        self.hits += hit
        if n_prompt > hit:
            cached = self.insert(prompt, ek)
            self.free += cached - hit          # pages past the match already in the tree: their new copies go back
            node2, _ = self._walk(prompt, ek)
            self.lock(node2, 1)
            self.lock(node, -1)
            node = node2
        self.running[r.rid] = (node, need + hit - n_prompt)   # held slots beyond the prompt pages
        if not keep_running:
            self.finish(r)

    def finish(self, r: TraceRequest) -> None:
        if r.rid not in self.running:
            return
        node, held = self.running.pop(r.rid)
        ps, n_prompt = self.ps, r.prompt_len - r.prompt_len % self.ps
        n_cached = r.cached_len - r.cached_len % ps
        if n_cached > 0:
            cached = self.insert(r.cached_ids().tolist()[:n_cached], r.extra_key)
            held -= max(0, n_cached - max(cached, n_prompt))   # the tree keeps the new pages, the rest comes back
        self.free += held
        self.lock(node, -1)

    def run(self, w: Workload, overlap) -> tuple:
        if overlap is None:
            events = [(k, i) for i in range(len(w)) for k in ("arrive", "finish")]
        else:
            times = []
            for i, r in enumerate(w.requests):
                end = r.timestamp + overlap.duration_ms(r.prompt_len, r.output_len)
                times += [(r.timestamp, 1, i, "arrive"), (end, 0 if end > r.timestamp else 2, i, "finish")]
            events = [(k, i) for _, _, i, k in sorted(times)]
        for kind, i in events:
            self.now += 1
            r = w.requests[i]
            if kind == "arrive":
                self.arrive(r, overlap is not None)
            elif overlap is not None:
                self.finish(r)
        return self.hits, self.evictions, self.evicted, self.rejected


def counts(w: Workload, capacity: int, ps: int, overlap=None) -> tuple:
    r = replay(w, capacity, "lru", ps, overlap, check_invariants=True)
    return r.hit_tokens, r.evictions, r.evicted_tokens, r.rejected


@st.composite
def workloads(draw):
    """Prompts over a 3-token alphabet built on earlier prompts (so they share prefixes and split nodes),
    outputs either explicit (a later prompt may contain them) or fresh, some in a second namespace."""
    reqs, prompts = [], []
    for i in range(draw(st.integers(1, 9))):
        base = draw(st.sampled_from(prompts)) if prompts and draw(st.booleans()) else []
        cut = draw(st.integers(0, len(base)))
        prompt = base[:cut] + draw(st.lists(st.integers(0, 2), min_size=0 if cut else 1, max_size=10))
        prompts.append(prompt)
        if draw(st.booleans()):
            kw = {"output": draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))}
        else:
            kw = {"output_len": draw(st.integers(0, 6))}
        reqs.append(TraceRequest(prompt, timestamp=float(draw(st.integers(0, 30)) + 8 * i),
                            extra_key=draw(st.sampled_from([None, None, None, "t"])), **kw))
    return Workload("ref", reqs)


@settings(max_examples=120, deadline=None)
@given(workloads(), st.integers(1, 16), st.sampled_from([1, 2, 4]), st.booleans())
def test_replay_counts_equal_the_reference(w, pages, ps, overlap):
    ov = Overlap(ms_per_output_token=5.0) if overlap else None
    assert counts(w, pages * ps, ps, ov) == RefReplay(pages * ps, ps).run(w, ov)


def test_a_request_that_takes_no_time_frees_its_pages_after_its_own_arrival():
    """No output and no cost per prompt token: it finishes at its arrival time, after arriving. Sorted the
    other way it held its page forever, and the next request, in a pool sized to what the workload can
    fill, was rejected."""
    w = Workload("zero", [TraceRequest([0], output_len=0, timestamp=0.0), TraceRequest([1], output_len=0, timestamp=8.0)])
    ov = Overlap(ms_per_output_token=5.0)
    assert counts(w, 4, 2, ov) == RefReplay(4, 2).run(w, ov) == (0, 0, 0, 0)


def test_known_answer_shared_prompt_then_eviction():
    """A: 8 prompt + 2 output tokens (9 cached: [1..8] then [20], 12 slots). B shares A's first 4 tokens: hit 4,
    A's edge splits into [1..4] -> {[5..8] -> [20], [9,9]}; 11 slots used. C is new and needs 9 slots, so it
    evicts 8: [20] (oldest), then [5..8] and [9,9] (same time: the older node first), then [1..4]: 4 nodes,
    11 tokens (whole leaves: more than asked)."""
    a = TraceRequest([1, 2, 3, 4, 5, 6, 7, 8], output=[20, 21])
    b = TraceRequest([1, 2, 3, 4, 9, 9], output=[22])
    c = TraceRequest([7, 7, 7, 7, 7, 7, 7], output=[23, 24, 25])
    w = Workload("abc", [a, b, c])
    assert counts(w, 12, 1) == RefReplay(12, 1).run(w, None) == (4, 4, 11, 0)


def test_known_answer_pages_and_rejection():
    """Page size 4, 3 pages. A caches its 2 prompt pages. B hits page 1 (A's edge splits), needs 4 more pages
    (13 + 2 - 1 = 14 tokens, ceil 16, minus the hit), evicts A's unlocked page 2, is still short: rejected,
    no hits counted, its lock released. C then hits only page 1 (page 2 is gone) and fits."""
    a = TraceRequest(list(range(8)), output=[50])
    b = TraceRequest(list(range(4)) + [9] * 9, output=[51, 52])
    c = TraceRequest(list(range(8)) + [60], output=[53])
    w = Workload("pages", [a, b, c])
    assert counts(w, 12, 4) == RefReplay(12, 4).run(w, None) == (4, 1, 4, 1)


@pytest.mark.parametrize("ps", [1, 4])
def test_overlap_known_answer_running_prompt_hit_and_held_slots(ps):
    """A (0-100 ms) holds 12 of 20 slots; B arrives at 1 ms and hits A's 8-token prompt (inserted on arrival),
    taking 4 more; C at 2 ms needs 13 while both run: nothing is evictable, rejected. D, after both finish,
    finds A's prompt + output (12 tokens) cached, its whole prompt: it hits all but its last token (11), or at
    pages of 4 all but its last page (8): the engine computes a prompt's last token. No eviction."""
    a = TraceRequest(list(range(8)), output=[90, 91, 92, 93, 94], timestamp=0.0)
    b = TraceRequest(list(range(8)) + [7] * 4, output=[95], timestamp=1.0)
    c = TraceRequest([5] * 12, output=[96, 97], timestamp=2.0)
    d = TraceRequest(list(range(8)) + [90, 91, 92, 93], output=[98], timestamp=500.0)
    w = Workload("ov", [a, b, c, d])
    ov = Overlap(ms_per_output_token=20.0)
    got = counts(w, 20, ps, ov)
    assert got == RefReplay(20, ps).run(w, ov)
    assert got == (8 + (11 if ps == 1 else 8), 0, 0, 1)


@pytest.mark.parametrize("ps", [1, 2])
def test_only_prompt_tokens_count_as_hits(ps):
    """B repeats A's prompt and starts its answer as A did: the tree holds B's prompt *and* the first tokens
    of its answer, but only prompt tokens before the last are hits: 3, or at pages of 2 one page (the answer
    is generated, never prefilled, and the engine computes the prompt's last token for its logits)."""
    a = TraceRequest([1, 2, 3, 4], output=[5, 6, 7])
    b = TraceRequest([1, 2, 3, 4], output=[5, 6, 9])
    w = Workload("repeat", [a, b])
    assert counts(w, 32, ps) == RefReplay(32, ps).run(w, None) == (3 if ps == 1 else 2, 0, 0, 0)


def test_lru_evicts_by_the_clock_not_by_age():
    """The clock ticks per event: C re-hits A's prompt, so D's eviction takes B (least recently used), not A
    (created first), and E hits A again. C matches [1, 2, 3] (never its last token), which splits A's node; its
    1 new slot evicts the split-off [4], still at A's time, and its insert puts [4] back. 3 + 3 hits; D's 4
    slots evict B: 2 nodes, 5 tokens."""
    reqs = [TraceRequest([1, 2, 3, 4]), TraceRequest([5, 6, 7, 8]), TraceRequest([1, 2, 3, 4]), TraceRequest([9, 9, 9, 9]),
            TraceRequest([1, 2, 3, 4])]
    w = Workload("lru", reqs)
    assert counts(w, 8, 1) == RefReplay(8, 1).run(w, None) == (6, 2, 5, 0)
