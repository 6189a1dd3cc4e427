"""`recall` and `recall-value`: ARC whose "seen before" reaches back several pools.

Why: on prefix-cache traces most reuse of a new page comes later than one pool's turnover (the
Mooncake synthetic trace: a block used once returns 45 % of the time, median 573 requests later,
while a pool of 6,000 blocks turns over in about 300). ARC's ghosts remember one pool, so most
returning pages look new again and share T1 with the pages that never return. Here every evicted
page's name (depth, first tokens) goes into a *recall* memory of RECALL_POOLS pools of tokens; a
node re-inserted whose first page is remembered enters T2 (seen before), as a hit would have put it.
ARC's own ghosts (one pool each) still move its T1 target, so the split adapts online as in ARC.
"""
from __future__ import annotations

from core.cache.eviction.base import PolicyCache
from core.cache.eviction.classic import ARC
from core.cache.eviction.tracked import Ghosts
from core.cache.radix_node import TreeNode

RECALL_POOLS = 4   # how far back "seen before" reaches, in pools of evicted tokens (a memory bound, not a fit)


class Recall(ARC):
    name = "recall"
    description = ("ARC with a long memory: a page evicted in the last few pools and asked for again "
                   "comes back as seen-before (T2), so late reuse is recognised")

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.page = max(1, int(cache.page_size))
        self.recall = Ghosts(RECALL_POOLS * self.capacity)

    def page_name(self, node: "TreeNode", offset: int) -> tuple:
        """(depth, the page's first tokens, namespace): within the page, so a page keeps its name however
        the tree splits the node around it (pages under 4 tokens would otherwise borrow their neighbours')."""
        ids = node.key.token_ids
        return (node.ev_start + offset, ids[offset:offset + min(4, self.page)].tobytes(), node.key.extra_key)

    def admit(self, node: "TreeNode") -> None:
        super().admit(node)
        c = self.recall.pop(self.page_name(node, 0))
        if c is not None:
            self.recalled(c)
            if node.ev_list == 1:
                self._move(node, 2)

    def recalled(self, info: object) -> None:
        """A remembered page was asked for again (`info`: what `on_evict` stored with it)."""

    def on_evict(self, node: "TreeNode") -> None:
        super().on_evict(node)
        for off in range(0, len(node.key), self.page):
            self.recall.add(self.page_name(node, off), self.page)


DECAY = 0.5        # per pool of inserted tokens: the class rates follow a workload that changes
AGE_STEPS = 8      # age buckets are log2 of the age in 1/AGE_STEPS pool (a resolution, not a fit) ...
AGE_BUCKETS = 10   # ... up to 2^8 / 8 = 32 pools, past the recall memory's reach


class RecallValue(Recall):
    """`recall` whose T1 (pages not seen before) is ranked by a learned value per page, tail first.

    A page's class is what the cache knows once its request is done: the length of the sequence it was
    inserted with (bit length, in pages), its distance from that sequence's end (0, 1, 2-3, 4-7, 8+
    pages), whether it extended a cached prefix, and the bit length of the output its request generated
    (told at the finish, `on_finish`; -1 until then or when never told): a short answer over a long
    prompt (a question about a document) is asked again far more often than a long generation.

    Its value is the chance it still comes back given that it has not by its age: per class of the
    first three fields the policy counts T1 pages inserted (`ins`) and those that came back (`ret`, by
    age bucket: a hit in T1, or asked for again while in the recall memory, so reuse later than the
    pool's turnover is seen); P(back | class, not back by age a) = (back at a or later + 1) /
    (inserted - back before a + 2). Why by age: where reuse comes soon (conversations: the next turn), an
    old page that has not come back is dead, and ranking by the class rate alone keeps such pages
    forever (the Mooncake conversation trace at 16,000 blocks: 5.7 points under LRU); where reuse comes
    late (the synthetic trace) the conditional chance stays high and old pages of good classes are kept.
    Why count inserts, not fates: a page that never comes back is only known as such when the memory
    forgets it, which in a large pool may be never; counted at insert, the misses weigh at once.
    The output field is counted apart (`n_out` at the finish, `r_out` at a return), pooled over the
    rest, and multiplies as a lift (its rate over the pooled rate: naive Bayes, exactly 1.0 when every
    request has one output length). Split by a field that says nothing, finer classes would be noisier
    and reorder T1 by noise (output lengths shuffled across the trace's requests cost up to 1.3 points
    that way). The value ranks T1 leaves by their last page, then by recency, and only the leaf's last
    run of pages of that class is freed (`evict_tail`), so a prompt's low-value tail goes before its
    reusable head.

    Cost: O(pages) of the node per hook (class counts per page), O(AGE_BUCKETS) per key, O(classes)
    once per pool (decay); each freed run is one split and one heap push, O(log n), at most five runs
    per leaf."""

    name = "recall-value"
    description = ("recall + a learned chance per page class (sequence length, distance from its end, "
                   "extension, its request's output length) that a page not back by its age still comes "
                   "back: T1 leaves lose their lowest-value tail pages first")

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.ins: dict = {}         # class[:3] -> T1 pages inserted
        self.ret: dict = {}         # class[:3] -> of those, pages back, per age bucket at their return
        self.n_out: dict = {}       # output field -> T1 pages told it, pooled over the first three fields
        self.r_out: dict = {}       # output field -> of those, pages back
        self.n_all = self.r_all = 0.0
        self.next_decay = self.capacity
        # ARC starts its T1 target at 0 (all room to the hit pages) and moves it only on ghost hits: in a
        # large pool on a short trace it never settles (the conversation trace at 32,000 blocks: 0.8 points
        # under LRU). Here T1 loses its dead pages first whatever its size, so half the pool, no side
        # favoured, costs little where p moves fast (docs/eviction.md, "Held out")
        self.p = 0.5 * self.capacity

    def _cls(self, node: "TreeNode", page: int) -> tuple:
        end = node.ev_seq - (node.ev_start // self.page + page) - 1   # pages after this one in its sequence
        return (node.ev_seq.bit_length(), min(int(end).bit_length(), 4), node.ev_ext, node.ev_out)

    def _bucket(self, age: float) -> int:
        return min(int(age * AGE_STEPS / self.capacity).bit_length(), AGE_BUCKETS - 1)

    def _rate(self, c: tuple, age: float = 0.0) -> float:
        """P(back | class c, not back by `age` tokens inserted since it came in), times the output lift."""
        head, out = c[:3], c[3]
        ret, b = self.ret.get(head), self._bucket(age)
        later = sum(ret[b:]) if ret else 0.0
        earlier = sum(ret[:b]) if ret else 0.0
        # decay and lag can leave fewer inserts than returns on record: never fewer at risk than back
        at_risk = max(self.ins.get(head, 0.0) - earlier, later)
        # one product over another: exactly 1.0 when the field has a single value (the same counts), so
        # then the ranking is the first three fields' to the last bit
        lift = ((self.r_out.get(out, 0.0) + 1.0) * (self.n_all + 2.0)
                / ((self.n_out.get(out, 0.0) + 2.0) * (self.r_all + 1.0)))
        return (later + 1.0) / (at_risk + 2.0) * lift

    def _back(self, c: tuple, born: float) -> None:
        """One page of class `c`, inserted at `born`, came back now."""
        head, out = c[:3], c[3]
        self.ret.setdefault(head, [0.0] * AGE_BUCKETS)[self._bucket(self.clock - born)] += 1.0
        if out >= 0:
            self.r_out[out] = self.r_out.get(out, 0.0) + 1.0
            self.r_all += 1.0

    def on_insert(self, node: "TreeNode", now: float) -> None:
        parent = node.parent
        start = getattr(parent, "ev_start", 0) + len(parent.key)
        node.ev_seq = (start + len(node.key)) // self.page     # the inserted sequence, in pages
        node.ev_ext = start > 0
        node.ev_out = -1                                       # its request's output: told at the finish
        node.ev_born = self.clock
        super().on_insert(node, now)
        if node.ev_list == 1:                                  # new to the cache (not recalled): counted
            for k in range(len(node.key) // self.page):
                head = self._cls(node, k)[:3]
                self.ins[head] = self.ins.get(head, 0.0) + 1.0
        if self.clock >= self.next_decay:
            self.next_decay = self.clock + self.capacity
            for d in (self.ins, self.n_out, self.r_out):
                for k in d:
                    d[k] *= DECAY
            for buckets in self.ret.values():
                buckets[:] = [x * DECAY for x in buckets]
            self.n_all *= DECAY
            self.r_all *= DECAY

    def admit(self, node: "TreeNode") -> None:
        super().admit(node)
        for k in range(1, len(node.key) // self.page):     # page 0 was looked up by `recall`
            c = self.recall.pop(self.page_name(node, k * self.page))
            if c is not None:
                self.recalled(c)

    def recalled(self, info: object) -> None:
        if isinstance(info, tuple):                        # (class, born) of a T1 page; T2 pages: True
            self._back(*info)

    def hit(self, node: "TreeNode") -> None:
        if node.ev_list == 1:
            for k in range(len(node.key) // self.page):
                self._back(self._cls(node, k), node.ev_born)
        super().hit(node)

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        super().split(head, tail)
        head.ev_seq, head.ev_ext, head.ev_out, head.ev_born = tail.ev_seq, tail.ev_ext, tail.ev_out, tail.ev_born

    def on_finish(self, node: "TreeNode", output_len: int) -> None:
        """The finished request's pages not yet classed (those it inserted, from `node` up to the first
        node an earlier finish classed) take the bit length of its output, and its T1 pages count for
        that output: O(nodes it inserted)."""
        bits = int(output_len).bit_length()
        while getattr(node, "ev_out", None) == -1:
            node.ev_out = bits
            if node.ev_list == 1:
                pages = len(node.key) // self.page
                self.n_out[bits] = self.n_out.get(bits, 0.0) + pages
                self.n_all += pages
            node = node.parent

    def key(self, node: "TreeNode") -> tuple:
        if node.ev_list == 1:
            last = len(node.key) // self.page - 1
            value = self._rate(self._cls(node, last), self.clock - node.ev_born)
            return (node.ev_list != self.first, value, node.last_access_time)
        return (node.ev_list != self.first, 1.0, node.last_access_time)

    def evict_tail(self, node: "TreeNode") -> int:
        """A T1 leaf loses its last run of pages of one class (the same value: they would go one after
        another); a T2 leaf goes whole."""
        if node.ev_list != 1:
            return len(node.key)
        pages = len(node.key) // self.page
        last = self._cls(node, pages - 1)
        k = pages - 1
        while k > 0 and self._cls(node, k - 1) == last:
            k -= 1
        return (pages - k) * self.page

    def on_evict(self, node: "TreeNode") -> None:
        ARC.on_evict(self, node)
        t1 = node.ev_list == 1
        for k in range(len(node.key) // self.page):
            info = (self._cls(node, k), node.ev_born) if t1 else True
            self.recall.add(self.page_name(node, k * self.page), self.page, info)
