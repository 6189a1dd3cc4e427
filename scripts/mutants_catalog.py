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
CACHE_TESTS = ["tests/test_radix_cache.py", "tests/test_eviction_heap.py", "tests/test_eviction.py", "tests/test_memory.py",
               "tests/test_slot_store.py", "tests/test_radix_kernels.py", *PROPERTIES]
LAB_TESTS = ["tests/lab/test_optimal.py", "tests/lab/test_replay.py"]
# A lab file's own test files (the page-level replay, the host tier and the size search have theirs).
LAB_FILE_TESTS = {
    "core/lab/replay.py": [*LAB_TESTS, "tests/lab/test_page_level.py", "tests/lab/test_host_tier.py"],
    "core/lab/lab_cache.py": ["tests/lab/test_page_level.py", "tests/lab/test_host_tier.py", *LAB_TESTS],
    "core/lab/pages.py": [*LAB_TESTS, "tests/lab/test_page_level.py"],
    "core/lab/host_tier.py": ["tests/lab/test_host_tier.py"],
    "core/lab/size.py": ["tests/lab/test_size.py"],
}
# Written to kill the survivors of the suite above; run only against a mutant that survived it, so one pass
# gives both figures (a mutant the older suite kills, the larger one kills too).
NEW_TESTS = {"cache": ["tests/test_radix_mutants.py"],
             "lab": ["tests/lab/test_replay_reference.py", "tests/lab/test_lab_mutants.py"]}


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
        return LAB_FILE_TESTS.get(self.file, LAB_TESTS) if self.area == "lab" else CACHE_TESTS

    @property
    def new_tests(self) -> list[str]:
        return NEW_TESTS[self.area]


def M(name: str, file: str, description: str, *edits: tuple[str, str]) -> Mutant:
    return Mutant(name, file, tuple(edits), description)


RV = "core/radix_evict.py"
RC, RN, MEM, K, EV = ("core/radix_cache.py", "core/radix_node.py", "core/memory.py", "core/slot_kernels.py",
                      "core/eviction.py")
RK = "core/radix_kernels.py"
ST = "core/slot_store.py"
REP, OPT = "core/lab/replay.py", "core/lab/optimal.py"
LC, PG, HT, SZ = "core/lab/lab_cache.py", "core/lab/pages.py", "core/lab/host_tier.py", "core/lab/size.py"

MUTANTS: list[Mutant] = [
    # ----- the prefix compare (radix_node.common_len, compiled in radix_kernels.prefix_len) and keys ----------
    M("cmp-off-by-one", RK, "common prefix one token too long when the runs differ in the first tokens",
      ("    if j < short:\n        return j\n", "    if j < short:\n        return j + 1\n")),
    M("cmp-tail-off-by-one", RK, "common prefix one token too long when the runs differ after the blocks",
      ("        j += 1\n    return j\n", "        j += 1\n    return j + 1 if j < n else j\n")),
    M("cmp-block-no-stop", RK, "a block that differs is skipped as if it matched",
      ("        if differs:\n            break\n        j += BLOCK\n", "        j += BLOCK\n")),
    M("cmp-no-page-round", RN, "a common prefix ending mid-page is not rounded down to the page",
      ("    return m - m % page_size", "    return m")),
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
      ("self._add_leaf(node, key, value, now, priority)",
       "self._add_leaf(node, key[:size - pos - 1], value[:size - pos - 1], now, priority)")),
    M("insert-root-key-shared", RC, "a leaf added from the root keeps the caller's key object (not its own)",
      ("                key = RadixKey._of(key.token_ids, key.extra_key)", "                pass")),
    M("insert-priority-overwrite", RC, "insert overwrites the path's priority instead of raising it",
      ("n.priority = max(n.priority, priority)", "n.priority = priority")),
    M("insert-no-dtype", RC, "insert keeps a value tensor of another dtype as it is",
      ("if value.dtype is not SLOT_DTYPE or value.device != self.device or value.dim() != 1:", "if False:")),
    M("insert-slots-wrap", RC, "insert converts int64 ids past int32 without refusing them (they wrap into other slots)",
      ("int(value.max()) > torch.iinfo(SLOT_DTYPE).max):", "int(value.max()) > 2**32):")),
    M("leaf-parent-stays-evictable", RC, "the parent of a new leaf stays in evictable_leaves",
      ("        self.evictable_leaves.discard(parent)\n        self._update_leaf_status(new_node)",
       "        self._update_leaf_status(new_node)")),
    M("leaf-not-evictable", RC, "a new leaf never joins evictable_leaves",
      ("        self.evictable_leaves.discard(parent)\n        self._update_leaf_status(new_node)\n",
       "        self.evictable_leaves.discard(parent)\n")),
    M("leaf-no-push", RC, "a leaf that turns evictable is not pushed on the kept heap",
      ("                if self._lazy_heap is not None:\n                    self._push_lazy(node)\n", "")),
    M("leaf-never-copies", RC, "a short tail is kept as a view of the caller's long tensor",
      ("if value.untyped_storage().nbytes() > 2 * value.element_size() * size:", "if False:")),
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
    M("evict-no-parent-push", RV, "evict skips the parent re-push (a parent left childless is never evicted)",
      ("                heapq.heappush(heap, (self.policy(parent), parent))\n        return freed",
       "                pass\n        return freed")),
    M("evict-max", RV, "evict picks the max policy key instead of the min",
      ("key, node = heapq.heappop(heap)", "key, node = heap.pop(heap.index(max(heap)))")),
    M("evict-one-too-many", RV, "evict goes on while freed == num_tokens",
      ("heapq.heapify(heap)\n        freed = 0\n        while freed < num_tokens and heap:",
       "heapq.heapify(heap)\n        freed = 0\n        while freed <= num_tokens and heap:")),
    M("lazy-evict-one-too-many", RV, "the kept heap's evict goes on while freed == num_tokens",
      ("        while freed < num_tokens and heap:\n            key, node = pop(heap)",
       "        while freed <= num_tokens and heap:\n            key, node = pop(heap)")),
    M("evict-zero-guard", RV, "evict's early return only for negative counts",
      ("if num_tokens <= 0:\n            return 0\n        if self._lazy_heap",
       "if num_tokens < 0:\n            return 0\n        if self._lazy_heap")),
    M("evict-no-lock-check", RV, "evict does not re-check lock_ref/is_leaf of a popped node",
      ("if node.lock_ref > 0 or not node.is_leaf:", "if False:")),
    M("delete-no-evicted-count", RV, "evicted_tokens (the engine's metric) is not counted",
      ("        self.evicted_tokens += size\n", "")),
    M("delete-no-free", RV, "an evicted leaf's slots are not freed",
      ("        self.allocator.free(node.value)\n", "")),
    M("delete-parent-status", RV, "a parent left childless by eviction never joins evictable_leaves",
      ("        self.evictable_leaves.discard(node)\n        self._update_leaf_status(parent)\n",
       "        self.evictable_leaves.discard(node)\n")),
    M("peek-partial-page", RC, "peek_prefix_len looks at a partial last page",
      ("while len(ids) - pos >= self.page_size:", "while len(ids) - pos > 0:")),
    M("peek-counts-whole-edge", RC, "peek_prefix_len counts a partly matched edge in full",
      ("            pos += n\n            if n < len(child.key):\n                break",
       "            pos += len(child.key)\n            if n < len(child.key):\n                break")),
    M("root-unlocked", RC, "the root starts with lock_ref 0",
      ("self.root_node.lock_ref = 1", "self.root_node.lock_ref = 0")),
    # ----- the allocator (core/memory.py front, core/slot_store.py stores, core/slot_kernels.py run kernels) ------
    M("alloc-exact-refused", MEM, "alloc refuses when exactly enough pages are free",
      ("if num_pages > self._store.available_pages():", "if num_pages >= self._store.available_pages():")),
    M("alloc-not-dirty", MEM, "alloc does not mark the allocator as used (clear() then does nothing)",
      ("        self._pristine = False\n        slots = self._store.take(num_pages)\n",
       "        slots = self._store.take(num_pages)\n")),
    M("free-not-dirty", MEM, "free does not mark the allocator as used",
      ("            raise self._free_error(code, page)\n        self._pristine = False\n",
       "            raise self._free_error(code, page)\n")),
    M("free-size-guard", MEM, "free no longer refuses more pages than the pool holds up front",
      ("if n // ps > self.num_pages:", "if False:")),
    M("free-noncontiguous", MEM, "a strided slot tensor reaches the kernel as it is",
      ("slots if slots.is_contiguous() else slots.contiguous()", "slots")),
    M("free-error-page", MEM, "the error names the page number, not its first slot",
      ("ps, slot = self.page_size, page * self.page_size", "ps, slot = self.page_size, page")),
    M("pool-past-int32", MEM, "a pool too large for int32 slot ids is built (its ids would wrap)",
      ("        if num_slots > MAX_SLOTS:", "        if num_slots > 2**40:")),
    M("runs-give-as-int32", ST, "the run store reads a caller's int64 slots as int32 (half the ids, garbled)",
      ("give = K.give_runs_at if slots.dtype is torch.int32 else K.give_runs_at64", "give = K.give_runs_at")),
    M("runs-clear-padding", ST, "clear() marks the padding page 0 free too",
      ("        K.mark(self._free, 1, self.num_pages, True)", "        K.mark(self._free, 0, self.num_pages + 1, True)")),
    M("runs-compact-lengths", ST, "compacting the run ring moves the starts but not the lengths",
      ("            self._lengths[:live] = self._lengths[self._head:self._tail].copy()\n", "")),
    M("runs-count-on-error", ST, "a rejected free still adds its pages to available()",
      ("        if code == K.OK:\n            self._count += i\n            return K.OK, 0\n",
       "        self._count += i\n        if code == K.OK:\n            return K.OK, 0\n")),
    M("ring-take-view", ST, "the ring store's alloc (page 1) returns a view of the ring (later frees overwrite it)",
      ("            return pages.clone()                # a copy: the ring region is reused later\n",
       "            return pages\n")),
    M("free-torch-no-repeat", ST, "the ring store's free misses a slot repeated in one call",
      ("        repeat[order[1:]] = ordered[1:] == ordered[:-1]\n", "")),
    M("free-torch-already", ST, "the ring store misses a slot freed at the head position",
      ("already = (self._pos[pages.clamp(0, self.num_pages)] >= self._head) & ~outside",
       "already = (self._pos[pages.clamp(0, self.num_pages)] > self._head) & ~outside")),
    M("mask-off-by-one", ST, "the ring store's free mask misses the page at the head of free_pages",
      ("        return self._pos >= self._head\n", "        return self._pos > self._head\n")),
    M("kernel-double-free", K, "free misses a page that is already free",
      ("            problem = any_free(free, p0, n)\n", "            problem = False\n")),
    M("kernel-no-rollback", K, "a rejected free leaves the pages before the bad one marked free",
      ("    for r in range(first_run, tail):     # roll back: this call's pages are held again\n"
       "        mark(free, starts[r], lengths[r], False)\n", "")),
    M("kernel-rollback-keeps-runs", K, "a rejected free keeps the runs it appended (they become free_pages)",
      ("    return code, bad, first_run\n", "    return code, bad, tail\n")),
    M("kernel-repeat-as-already", K, "a page listed twice in one call is reported as already free",
      ("                            code = REPEATED\n", "                            code = ALREADY_FREE\n")),
    M("kernel-not-whole", K, "a paged free accepts a run that starts off a page boundary",
      ("        if a % page_size or (j - i) % page_size:\n            code, bad = NOT_WHOLE",
       "        if (j - i) % page_size:\n            code, bad = NOT_WHOLE")),
    M("kernel-bounds-last", K, "a run's last page may lie one past the pool",
      ("problem = p0 < 1 or p0 > num_pages - n + 1", "problem = p0 < 1 or p0 > num_pages - n + 2")),
    M("kernel-block-no-stop", K, "a run is extended through a block that breaks it (long runs only)",
      ("        if differs:\n            break\n        j += BLOCK\n", "        j += BLOCK\n")),
    M("kernel-mask-short", K, "a run's word mask leaves out its last page in the word",
      ("    return (ALL >> np.uint64(WORD - (hi - lo))) << np.uint64(lo)",
       "    return (ALL >> np.uint64(WORD - (hi - lo) + 1)) << np.uint64(lo)")),
    M("kernel-mark-one-word", K, "marking a run stops after its first word (runs across 64-page words)",
      ("        free[w] = (free[w] | m) if on else (free[w] & ~m)\n        p0 += hi - lo\n",
       "        free[w] = (free[w] | m) if on else (free[w] & ~m)\n        p0 = end\n")),
    M("kernel-free-bit-off", K, "the free test reads the neighbouring page's bit",
      ("    return (free[p // WORD] >> np.uint64(p % WORD)) & np.uint64(1) != 0",
       "    return (free[p // WORD] >> np.uint64((p + 1) % WORD)) & np.uint64(1) != 0")),
    M("kernel-merge-gap", K, "a run merges with the previous one across a gap",
      ("starts[tail - 1] + lengths[tail - 1] == p0", "starts[tail - 1] + lengths[tail - 1] <= p0")),
    M("kernel-take-split", K, "alloc taking part of a run leaves its first page in the run",
      ("            starts[head] = s + take\n", "            starts[head] = s + take - 1\n")),
    M("kernel-take-no-unmark", K, "alloc leaves the pages it hands out marked free",
      ("        mark(free, s, take, False)\n", "")),
    M("kernel-paged-take-offset", K, "a paged alloc expands page p from slot (p-1)*page_size",
      ("        base = s * page_size\n", "        base = (s - 1) * page_size\n")),
    M("kernel-expand-skip", K, "free_pages lists each run without its first page",
      ("        for t in range(lengths[r]):\n            out[k] = s + t\n",
       "        for t in range(1, lengths[r]):\n            out[k] = s + t\n")),
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
      ("        extra = self._host_hits(i, keys, hit, n_prompt)\n",
       "        extra = self._host_hits(i, keys, hit, n_prompt)\n        self.hits += hit * self.unit\n"),
      ("        self.hits += hit * self.unit\n        self.host_hits", "        self.host_hits")),
    M("replay-hits-after-insert", REP, "the replay counts hits after inserting the prompt (its own tokens hit)",
      ("            m = m2\n", "            self.hits += int(m2.indices.numel()) - hit\n            m = m2\n")),
    M("replay-output-as-prompt", REP, "the replay matches prompt + output, counting output tokens as prompt hits",
      ("prompt = RadixKey._of(keys[:n_prompt], r.extra_key)", "prompt = RadixKey._of(keys[:n_cached], r.extra_key)")),
    M("replay-evicts-all-needed", REP, "the replay evicts the whole need, not need - available",
      ("self.cache.evict(n - self.alloc.available())", "self.cache.evict(n)")),
    M("replay-eviction-count", REP, "the replay counts evict calls, not evicted nodes",
      ("self.evictions += (self.cache.evicted_nodes if self.page_level else self.frees) - before",
       "self.evictions += 1")),
    M("replay-page-unit", REP, "the page-level replay counts hits in pages, not tokens",
      ("        self.hits += hit * self.unit\n", "        self.hits += hit\n")),
    M("replay-reject-no-host", REP, "a rejected request's host loads are not undone",
      ("                self.host.on_reject(i)\n", "                pass\n")),
    M("replay-inserted-from-hit", REP, "the host is told the prompt entered the tree from the device hit on",
      ("            self._inserted(i, keys, cached, n_prompt)\n", "            self._inserted(i, keys, hit, n_prompt)\n")),
    M("replay-pool-one-short", REP, "a capped pool is one page short of what the workload can fill",
      ("pool = max(1, min(want, needed))", "pool = max(1, min(want, needed - 1))")),
    M("replay-auto-stateful-pages", REP, "auto replays stateful policies at page level too",
      ("(level == \"auto\" and page_size > 1 and not is_stateful(policy))", "(level == \"auto\" and page_size > 1)")),
    M("replay-no-host-begin", REP, "a host tier is not emptied before a replay (it carries the last one's pages)",
      ("        begin(workload)                        # an empty tier for this replay\n", "        pass\n")),
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
    # ----- the kept eviction heap of the monotone key policies (radix_cache.py, eviction.py) -------------------
    M("lazy-heap-no-stale-skip", RV, "the kept heap evicts entries that are no longer evictable leaves",
      ("            if node not in leaves:\n                continue", "            if False:\n                continue")),
    M("lazy-heap-stale-key", RV, "the kept heap evicts by the key a node had when pushed",
      ("            if now != key:\n", "            if False:\n")),
    M("lazy-heap-no-push", RC, "a leaf that becomes evictable is not pushed on the kept heap",
      ("                    self._push_lazy(node)\n", "                    pass\n")),
    M("lazy-heap-unbounded", RV, "the kept heap is never rebuilt: stale entries pile up",
      ("        if len(heap) > 2 * len(self.evictable_leaves) + 64:", "        if False:")),
    M("lazy-heap-mru", EV, "mru (its key falls as a node is used) gets the kept heap",
      ('MONOTONE_KEYS = frozenset({"lru", "lfu", "fifo", "filo", "priority", "slru"})',
       'MONOTONE_KEYS = frozenset({"lru", "lfu", "fifo", "filo", "priority", "slru", "mru"})')),
    # ----- the page-level replay's cache (lab_cache.py) ------------------------------------------------------------
    M("lab-no-batch-free", LC, "the batched evict frees nothing (slots leak)",
      ("            if batch.values:\n", "            if False:\n")),
    M("lab-no-on-evict", LC, "the host tier is not told of evictions",
      ("            self.on_evict(node.key.token_ids)\n", "            pass\n")),
    M("lab-evicted-nodes", LC, "evicted nodes are not counted (the page level reports no evictions)",
      ("        self.evicted_nodes += 1\n", "")),
    # ----- pages (pages.py) -------------------------------------------------------------------------------------------
    M("pages-arrive-first-on-tie", PG, "an arrival at the same time as a finish goes first",
      ("order = np.lexsort((idx, kinds == ARRIVE, times))", "order = np.lexsort((idx, kinds == FINISH, times))")),
    M("pages-fresh-reused", PG, "fresh output pages reuse ids (they collide with later pages)",
      ("        start = self.count\n        self.count += n\n", "        start = self.count\n")),
    M("pages-block-any-size", PG, "block contents are used when the page size is not a multiple of the block",
      ("if r.hash_ids is None or r._output is not None or page_size % r.block_size:",
       "if r.hash_ids is None or r._output is not None:")),
    M("pages-one-namespace", PG, "requests of different extra_key share pages",
      ("        root = trie.root(r.extra_key)\n", "        root = trie.root(None)\n")),
    M("pages-finish-counted", PG, "pages touched on finish count as hits in the trace",
      ("chunks_c.append(np.full(sel.shape[0], kind == ARRIVE))", "chunks_c.append(np.full(sel.shape[0], True))")),
    M("pages-partial-cached-page", PG, "a partial last page of prompt + output counts as a whole page",
      ("        n_cached = r.cached_len // page_size\n", "        n_cached = -(-r.cached_len // page_size)\n")),
    # ----- the host tier (host_tier.py) ---------------------------------------------------------------------------------
    M("host-victim-on-device", HT, "a full host replaces a page that is still on the device",
      ("if p in self.host and p not in self.on_device and self.host[p] == (t, d):",
       "if p in self.host and self.host[p] == (t, d):")),
    M("host-write-over-newer", HT, "a write into a full host replaces even a page used after the one written",
      ("if v is None or (v[0], v[1]) > key:", "if v is None:")),
    M("host-selective-threshold", HT, "write_through_selective writes on the third use, not the second",
      ("u >= SELECTIVE_THRESHOLD", "u > SELECTIVE_THRESHOLD")),
    M("host-match-on-device", HT, "a host hit may be a page the device already holds",
      ("            if p not in self.host or p in self.on_device:\n", "            if p not in self.host:\n")),
    M("host-reject-keeps-loads", HT, "a rejected request's loaded pages stay marked on the device",
      ("        for p in self._loading:\n            self._off_device(p)\n", "")),
    M("host-write-back-always", HT, "every policy writes on eviction",
      ("            if self.policy == \"write_back\":\n                self._write(p)\n",
       "            self._write(p)\n")),
    M("host-depth-tiebreak", HT, "recency ties go shallowest page first",
      ("        key = (self.t, -depth)\n", "        key = (self.t, depth)\n")),
    M("host-ttft-gib", HT, "the load time divides by GiB/s, not GB/s",
      ("load = host * kv.bytes_per_token / (bandwidth_gbps * 1e9)", "load = host * kv.bytes_per_token / (bandwidth_gbps * 2 ** 30)")),
    M("host-ttft-rejected", HT, "the time estimate includes rejected requests",
      ("        ok = ~self.rejected\n", "        ok = np.ones_like(self.rejected)\n")),
    M("host-begin-keeps-pages", HT, "begin() keeps the previous replay's host pages",
      ("        self.host: dict[int, tuple[int, int]] = {}     # page -> (last use, -depth): its recency key\n",
       "        self.host: dict[int, tuple[int, int]] = getattr(self, 'host', {})\n")),
    # ----- the size search (size.py) ------------------------------------------------------------------------------------
    M("size-goal-strict", SZ, "bisection needs strictly more than the goal",
      ("        if at(mid) >= goal:\n", "        if at(mid) > goal:\n")),
    M("size-tolerance-double", SZ, "bisection stops at twice the tolerance",
      ("while hi - lo > max(1, int(rel_tol * hi)):", "while hi - lo > max(1, int(2 * rel_tol * hi)):")),
    M("size-start-above-optimum", SZ, "a policy's search treats the optimum's answer as a miss",
      ("lower, first = start.lower_pages, start.capacity_pages", "lower, first = start.capacity_pages, start.capacity_pages + 1")),
    M("size-violation-equal", SZ, "equal hits at a larger pool count as a monotonicity violation",
      ("        if best is not None and h < best[1]:\n", "        if best is not None and h <= best[1]:\n")),
    M("size-gallop-past-max", SZ, "the gallop doubles past hi_max (where every page already fits)",
      ("        hi = min(2 * hi, hi_max)\n", "        hi = 2 * hi\n")),
]
