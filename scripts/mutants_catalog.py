"""Hand-made mutants of the radix cache, the slot allocator, the policies and the capacity lab.

Each mutant is a bug someone could plausibly write: one or more exact (snippet -> replacement) edits in
one file and a one-line description. `scripts/mutants.py` applies each to a scratch copy of the repo and
runs the tests of its group; a mutant whose snippet no longer occurs (the file was rewritten) is
reported "not applicable", never "killed".
"""
from __future__ import annotations

from dataclasses import dataclass

# The suite each mutant runs against: the fast files of its area (the property test at 8 of its 21 policy x
# page-size cases, one per policy plus lru at a second page size, to keep a whole run near 15 minutes).
PROPERTIES = ("tests/test_radix_properties.py::test_random_request_flows[" + "] tests/test_radix_properties.py::"
              "test_random_request_flows[".join(["lru-1", "lru-4", "lfu-2", "fifo-4", "mru-1", "filo-2",
                                                 "priority-1", "slru-4"]) + "]").split()
CACHE_TESTS = ["tests/test_radix_cache.py", "tests/test_eviction.py", "tests/test_memory.py", *PROPERTIES]
LAB_TESTS = ["tests/lab/test_optimal.py", "tests/lab/test_replay.py"]
# Written to kill the survivors of the suite above; run only against a mutant that survived it, so one pass
# gives both figures (a mutant the older suite kills, the larger one kills too).
NEW_TESTS = {"cache": ["tests/test_radix_mutants.py"], "lab": ["tests/lab/test_replay_reference.py"]}


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    edits: tuple          # ((snippet, replacement), ...), each snippet must occur exactly once
    description: str

    @property
    def area(self) -> str:
        return "lab" if self.file.startswith("core/lab/") else "cache"

    @property
    def tests(self) -> list[str]:
        return LAB_TESTS if self.area == "lab" else CACHE_TESTS

    @property
    def new_tests(self) -> list[str]:
        return NEW_TESTS[self.area]


def M(name: str, file: str, description: str, *edits: tuple[str, str]) -> Mutant:
    return Mutant(name, file, tuple(edits), description)


RC, RN, MEM, K, EV = ("core/radix_cache.py", "core/radix_node.py", "core/memory.py", "core/slot_kernels.py",
                      "core/eviction.py")
REP, OPT = "core/lab/replay.py", "core/lab/optimal.py"

MUTANTS: list[Mutant] = [
    # ----- the prefix compare (radix_node.common_len) and keys ------------------------------------------------
    M("cmp-off-by-one", RN, "common prefix one token too long when the runs differ",
      ("m = first if differs[first] else n", "m = first + 1 if differs[first] else n")),
    M("node-tiebreak", RN, "heap tie-break takes the newest node first",
      ("return self.id < other.id", "return self.id > other.id")),
    # ----- match_prefix / _walk ------------------------------------------------------------------------------------
    M("match-page-off-by-one", RC, "match refuses a key of exactly one page",
      ("if self.disable or size < self.page_size:", "if self.disable or size <= self.page_size:")),
    M("match-no-align", RC, "match keeps an unaligned key's partial last page",
      ("            key = key[:self._aligned(size)]\n        now = self.clock()\n        path, pos",
       "            pass\n        now = self.clock()\n        path, pos")),
    M("match-no-hit-count", RC, "match does not count hits",
      ("n.hit_count += 1", "pass")),
    M("walk-no-stamp", RC, "match/insert do not update last_access_time of visited nodes",
      ("            child.last_access_time = now\n            n = common_len", "            n = common_len")),
    M("walk-no-root-stamp", RC, "the root's last_access_time is never updated",
      ("        node = self.root_node\n        node.last_access_time = now\n", "        node = self.root_node\n")),
    M("walk-split-returns-suffix", RC, "after a split the path ends at the suffix node",
      ("child = self._split_node(child, n, now)", "self._split_node(child, n, now)")),
    M("edge-key-no-namespace", RC, "children keys ignore extra_key (namespaces share nodes)",
      ("return first if extra_key is None else (extra_key, first)", "return first")),
    # ----- _split_node ---------------------------------------------------------------------------------------------
    M("split-no-lock", RC, "split forgets to copy lock_ref to the new parent",
      ("        new_node.lock_ref = child.lock_ref\n", "")),
    M("split-no-hits", RC, "split forgets to copy hit_count",
      ("        new_node.hit_count = child.hit_count\n", "")),
    M("split-no-creation", RC, "split stamps the new parent as created now",
      ("        new_node.creation_time = child.creation_time\n", "")),
    M("split-no-priority", RC, "split forgets the priority",
      ("now, child.priority)", "now)")),
    M("split-no-value-move", RC, "split keeps the whole value on the child",
      ("        child.value = child.value[split_len:]\n", "")),
    M("split-no-child-stamp", RC, "split does not stamp the child",
      ("        child.last_access_time = now\n        new_node.children", "        new_node.children")),
    # ----- insert ---------------------------------------------------------------------------------------------------
    M("insert-drops-tail", RC, "insert drops the last token of the new leaf",
      ("self._add_leaf(node, key[pos:], value[pos:], now, priority)",
       "self._add_leaf(node, key[pos:size - 1], value[pos:size - 1], now, priority)")),
    M("insert-priority-overwrite", RC, "insert overwrites the path's priority instead of raising it",
      ("n.priority = max(n.priority, priority)", "n.priority = priority")),
    M("insert-no-dtype", RC, "insert keeps a value tensor of another dtype as it is",
      ("if value.dtype is not torch.int64 or value.device != self.device:", "if False:")),
    M("leaf-parent-stays-evictable", RC, "the parent of a new leaf stays in evictable_leaves",
      ("        self.evictable_leaves.discard(parent)\n        self._update_leaf_status(new_node)",
       "        self._update_leaf_status(new_node)")),
    M("leaf-never-copies", RC, "a short tail is kept as a view of the caller's long tensor",
      ("if value.untyped_storage().nbytes() > 2 * value.numel() * value.element_size():", "if False:")),
    # ----- locks -----------------------------------------------------------------------------------------------------
    M("lock-not-propagated", RC, "inc_lock_ref locks only the last node, not its ancestors",
      ("            node.lock_ref += 1\n            self.evictable_leaves.discard(node)\n            node = node.parent",
       "            node.lock_ref += 1\n            self.evictable_leaves.discard(node)\n            break")),
    M("lock-size-twice", RC, "inc_lock_ref moves a node's tokens to protected on its second lock too",
      ("            if node.lock_ref == 0:\n                size = len(node.key)\n                self._evictable_size -= size",
       "            if node.lock_ref <= 1:\n                size = len(node.key)\n                self._evictable_size -= size")),
    M("unlock-no-sizes", RC, "dec_lock_ref does not move tokens back to evictable",
      ("                self._evictable_size += size\n                self._protected_size -= size\n", "")),
    M("unlock-no-leaf-status", RC, "dec_lock_ref does not make an unlocked leaf evictable again",
      ("                changed += size\n            self._update_leaf_status(node)\n",
       "                changed += size\n")),
    M("unlock-below-zero", RC, "dec_lock_ref lets a lock_ref go below zero",
      ("if walk.lock_ref <= 0:", "if walk.lock_ref < 0:")),
    # ----- evict -------------------------------------------------------------------------------------------------------
    M("evict-no-parent-push", RC, "evict skips the parent re-push (a parent left childless is never evicted)",
      ("                heapq.heappush(heap, (self.policy(parent), parent))\n        return freed",
       "                pass\n        return freed")),
    M("evict-max", RC, "evict picks the max policy key instead of the min",
      ("key, node = heapq.heappop(heap)", "key, node = heap.pop(heap.index(max(heap)))")),
    M("evict-one-too-many", RC, "evict goes on while freed == num_tokens",
      ("while freed < num_tokens and heap:", "while freed <= num_tokens and heap:")),
    M("evict-zero-guard", RC, "evict's early return only for negative counts",
      ("if num_tokens <= 0:\n            return 0\n        heap = self._heap()",
       "if num_tokens < 0:\n            return 0\n        heap = self._heap()")),
    M("evict-no-lock-check", RC, "evict does not re-check lock_ref/is_leaf of a popped node",
      ("if node.lock_ref > 0 or not node.is_leaf:", "if False:")),
    M("delete-no-evicted-count", RC, "evicted_tokens (the engine's metric) is not counted",
      ("        self.evicted_tokens += size\n", "")),
    M("delete-no-free", RC, "an evicted leaf's slots are not freed",
      ("        self.allocator.free(node.value)\n", "")),
    M("delete-parent-status", RC, "a parent left childless by eviction never joins evictable_leaves",
      ("        self.evictable_leaves.discard(node)\n        self._update_leaf_status(parent)\n",
       "        self.evictable_leaves.discard(node)\n")),
    M("peek-partial-page", RC, "peek_prefix_len looks at a partial last page",
      ("while len(ids) - pos >= self.page_size:", "while len(ids) - pos > 0:")),
    M("peek-counts-whole-edge", RC, "peek_prefix_len counts a partly matched edge in full",
      ("            pos += n\n            if n < len(child.key):\n                break",
       "            pos += len(child.key)\n            if n < len(child.key):\n                break")),
    M("root-unlocked", RC, "the root starts with lock_ref 0",
      ("self.root_node.lock_ref = 1", "self.root_node.lock_ref = 0")),
    # ----- the allocator -----------------------------------------------------------------------------------------------
    M("alloc-exact-refused", MEM, "alloc refuses when exactly enough pages are free",
      ("if num_pages > self._tail - self._head:", "if num_pages >= self._tail - self._head:")),
    M("alloc-view", MEM, "alloc returns a view of the ring (later frees overwrite it)",
      ("self._ring_np[start:start + num_pages].copy()", "self._ring_np[start:start + num_pages]")),
    M("alloc-not-dirty", MEM, "alloc does not mark the allocator as used (clear() then does nothing)",
      ("        self._head += num_pages\n        self._pristine = False\n", "        self._head += num_pages\n")),
    M("free-not-dirty", MEM, "free does not mark the allocator as used",
      ("        self._tail += k\n        self._pristine = False\n", "        self._tail += k\n")),
    M("free-size-guard", MEM, "free no longer refuses more pages than the pool holds up front",
      ("if k > self.num_pages:", "if False:")),
    M("free-torch-no-repeat", MEM, "the torch twin of free misses a slot repeated in one call",
      ("        repeat[order[1:]] = ordered[1:] == ordered[:-1]\n", "")),
    M("free-torch-already", MEM, "the torch twin (pools off the CPU) misses a slot freed at the head position",
      ("already = (self._pos[pages.clamp(0, self.num_pages)] >= self._head) & ~outside",
       "already = (self._pos[pages.clamp(0, self.num_pages)] > self._head) & ~outside")),
    M("mask-off-by-one", MEM, "is_free_mask misses the page at the head of free_pages",
      ("return (self._pos >= self._head).repeat_interleave(self.page_size)",
       "return (self._pos > self._head).repeat_interleave(self.page_size)")),
    M("kernel-double-free", K, "free misses double-free detection of a page already in free_pages",
      ("            if q < head:\n", "            if q < tail:\n")),
    M("kernel-no-rollback", K, "a rejected free leaves the pages before the bad one marked free",
      ("        for j in range(i):\n            pos[slots[j * page_size] // page_size] = -1\n", "")),
    M("kernel-paged-take-offset", K, "a paged alloc expands page p from slot (p-1)*page_size",
      ("        base = ring[start + i] * page_size", "        base = (ring[start + i] - 1) * page_size")),
    M("kernel-not-whole", K, "a paged free accepts a page that starts off a page boundary",
      ("            if s0 % page_size:\n                return NOT_WHOLE, i\n", "")),
    M("kernel-repeat-as-already", K, "a page listed twice in one call is reported as already free",
      ("code = REPEATED if q >= tail else ALREADY_FREE", "code = ALREADY_FREE")),
    # ----- eviction policies --------------------------------------------------------------------------------------------
    M("lfu-no-lru-tiebreak", EV, "lfu breaks ties by node id, not by last access",
      ("return (n.hit_count, n.last_access_time)", "return (n.hit_count,)")),
    M("slru-threshold", EV, "slru protects only nodes hit more than twice",
      ("return (1 if n.hit_count >= SLRU_PROTECTED_HITS else 0, n.last_access_time)",
       "return (1 if n.hit_count > SLRU_PROTECTED_HITS else 0, n.last_access_time)")),
    M("priority-inverted", EV, "priority evicts the highest priority first",
      ("return (n.priority, n.last_access_time)", "return (-n.priority, n.last_access_time)")),
    # ----- the lab replay ----------------------------------------------------------------------------------------------
    M("replay-hits-of-rejected", REP, "the replay counts hits of requests it then rejects",
      ("        hit = int(m.indices.numel())\n        cache.inc_lock_ref(m.last_node)\n",
       "        hit = int(m.indices.numel())\n        self.hits += hit\n        cache.inc_lock_ref(m.last_node)\n"),
      ("        self.hits += hit\n        value =", "        value =")),
    M("replay-hits-after-insert", REP, "the replay counts hits after inserting the prompt (its own tokens hit)",
      ("            m = m2\n", "            self.hits += int(m2.indices.numel()) - hit\n            m = m2\n")),
    M("replay-output-as-prompt", REP, "the replay matches prompt + output, counting output tokens as prompt hits",
      ("m = cache.match_prefix(RadixKey(prompt[:n_prompt], r.extra_key))\n        hit",
       "m = cache.match_prefix(RadixKey(seq[:self._aligned(r.cached_len)], r.extra_key))\n        hit")),
    M("replay-evicts-all-needed", REP, "the replay evicts the whole need, not need - available",
      ("self.cache.evict(n - self.alloc.available())", "self.cache.evict(n)")),
    M("replay-eviction-count", REP, "the replay counts evict calls, not evicted nodes",
      ("self.evictions += self.frees - before", "self.evictions += 1")),
    M("replay-reject-keeps-lock", REP, "a rejected request keeps its prefix locked",
      ("            cache.dec_lock_ref(m.last_node)\n            self.rejected += 1",
       "            self.rejected += 1")),
    M("replay-no-unfinished-insert", REP, "with overlap, a running prompt is not inserted until it finishes",
      ("if n_prompt > hit:", "if n_prompt > hit and not keep_running:")),
    M("replay-no-tick", REP, "the replay never advances the clock",
      ("        tick()\n        if kind == ARRIVE:", "        if kind == ARRIVE:")),
    M("replay-tail-free", REP, "the replay frees the tail from n_cached even when more is in the tree",
      ("self._free(value[max(n_cached, in_tree):])", "self._free(value[n_cached:])")),
    # ----- the optimum -------------------------------------------------------------------------------------------------
    M("opt-next-use-any", OPT, "the optimum's next use counts uncounted (finish) accesses too",
      ("pos = np.where(counted[order], order, n)", "pos = np.where(True, order, n)")),
    M("opt-never-no-depth", OPT, "pages never used again all get the same key (no depth order)",
      ("out = _NEVER + depth.astype(np.int64)", "out = np.full(n, _NEVER, dtype=np.int64)")),
    M("opt-capacity-plus-one", OPT, "the optimum holds one page more than the pool",
      ("if len(cache) < capacity_pages:", "if len(cache) <= capacity_pages:")),
    M("opt-no-bypass", OPT, "the optimum always admits, swapping out the farthest page",
      ("if -negk > k:", "if True:")),
    M("opt-swap-on-tie", OPT, "the optimum swaps on equal next use",
      ("if -negk > k:", "if -negk >= k:")),
    M("opt-admit-never-used", OPT, "the optimum admits pages that are never used again",
      ("        if k >= never:\n            continue", "        if False:\n            continue")),
    M("opt-stale-next-use", OPT, "a hit does not refresh the page's next use",
      ("            if cache[p] != k:\n                cache[p] = k\n                push(heap, (-k, p))\n",
       "")),
]
