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

from typing import TYPE_CHECKING

from core.eviction import register
from core.eviction_policies import ARC, _Ghosts

if TYPE_CHECKING:
    from core.radix_cache import RadixCache, TreeNode

RECALL_POOLS = 4   # how far back "seen before" reaches, in pools of evicted tokens (a memory bound, not a fit)


@register
class Recall(ARC):
    name = "recall"
    description = ("ARC with a long memory: a page evicted in the last few pools and asked for again "
                   "comes back as seen-before (T2), so late reuse is recognised")

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.page = max(1, int(cache.page_size))
        self.recall = _Ghosts(RECALL_POOLS * self.capacity)

    def page_name(self, node: "TreeNode", offset: int) -> tuple:
        ids = node.key.token_ids
        return (node.ev_start + offset, ids[offset:offset + 4].tobytes(), node.key.extra_key)

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


@register
class RecallValue(Recall):
    """`recall` whose T1 (pages not seen before) is ranked by a learned value per page, tail first.

    A page's class is what the cache knows once its request is done: the length of the sequence it was
    inserted with (bit length, in pages), its distance from that sequence's end (0, 1, 2-3, 4-7, 8+
    pages), whether it extended a cached prefix, and the bit length of the output its request generated
    (told at the finish, `on_finish`; -1 until then or when never told): a short answer over a long
    prompt (a question about a document) is asked again far more often than a long generation. The
    policy counts pages that left T1 and those that came back (a hit in T1, or asked for again while in
    the recall memory), so reuse later than the pool's turnover is seen, twice: per class of the first
    three fields (`n`, `r`) and per output field (`n_out`, `r_out`), pooled over the rest. A page's rate
    is naive Bayes over the two: the first three fields' rate (r + 1) / (n + 2) (Laplace: 1/2 with no
    evidence) times the output field's lift (its rate over the pooled rate). Why not one count per full
    class: split by a field that says nothing, the classes' rates are noisier and reorder T1 by noise
    (output lengths shuffled across the trace's requests cost up to 1.3 points that way, 0.4 like this).
    The rate ranks T1 leaves by their last page, then by recency, and only the leaf's last run of pages
    of that class is freed (`evict_tail`), so a prompt's low-value tail goes before its reusable head.

    Cost: O(pages) of the node per hook (class counts per page), O(classes) once per pool (decay);
    each freed run is one split and one heap push, O(log n), at most five runs per leaf."""

    name = "recall-value"
    description = ("recall + a learned reuse rate per page class (sequence length, distance from its end, "
                   "extension, its request's output length): T1 leaves lose their lowest-value tail pages first")

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.n: dict = {}           # class[:3] -> pages whose fate is known (came back, or forgotten)
        self.r: dict = {}           # class[:3] -> of those, pages that came back
        self.n_out: dict = {}       # output field -> the same, pooled over the first three fields
        self.r_out: dict = {}
        self.n_all = self.r_all = 0.0
        self.next_decay = self.capacity
        self.recall.dropped = self.forgotten

    def _cls(self, node: "TreeNode", page: int) -> tuple:
        end = node.ev_seq - (node.ev_start // self.page + page) - 1   # pages after this one in its sequence
        return (node.ev_seq.bit_length(), min(int(end).bit_length(), 4), node.ev_ext, node.ev_out)

    def _rate(self, c: tuple) -> float:
        head, out = c[:3], c[3]
        # one product over another: exactly 1.0 when the field has a single value (the same counts), so
        # then the ranking is the first three fields' to the last bit
        lift = ((self.r_out.get(out, 0.0) + 1.0) * (self.n_all + 2.0)
                / ((self.n_out.get(out, 0.0) + 2.0) * (self.r_all + 1.0)))
        return (self.r.get(head, 0.0) + 1.0) / (self.n.get(head, 0.0) + 2.0) * lift

    def _count(self, c: tuple, back: bool) -> None:
        """One more page of class `c` whose fate is known: it came back (`back`) or was forgotten."""
        head, out = c[:3], c[3]
        self.n[head] = self.n.get(head, 0.0) + 1.0
        self.n_out[out] = self.n_out.get(out, 0.0) + 1.0
        self.n_all += 1.0
        if back:
            self.r[head] = self.r.get(head, 0.0) + 1.0
            self.r_out[out] = self.r_out.get(out, 0.0) + 1.0
            self.r_all += 1.0

    def on_insert(self, node: "TreeNode", now: float) -> None:
        parent = node.parent
        start = getattr(parent, "ev_start", 0) + len(parent.key)
        node.ev_seq = (start + len(node.key)) // self.page     # the inserted sequence, in pages
        node.ev_ext = start > 0
        node.ev_out = -1                                       # its request's output: told at the finish
        super().on_insert(node, now)
        if self.clock >= self.next_decay:
            self.next_decay = self.clock + self.capacity
            for d in (self.n, self.r, self.n_out, self.r_out):
                for k in d:
                    d[k] *= DECAY
            self.n_all *= DECAY
            self.r_all *= DECAY

    def admit(self, node: "TreeNode") -> None:
        super().admit(node)
        for k in range(1, len(node.key) // self.page):     # page 0 was looked up by `recall`
            c = self.recall.pop(self.page_name(node, k * self.page))
            if c is not None:
                self.recalled(c)

    def recalled(self, info: object) -> None:
        if isinstance(info, tuple):
            self._count(info, True)

    def forgotten(self, info: object) -> None:
        """A T1 page left the recall memory without coming back."""
        if isinstance(info, tuple):
            self._count(info, False)

    def hit(self, node: "TreeNode") -> None:
        if node.ev_list == 1:
            for k in range(len(node.key) // self.page):
                self._count(self._cls(node, k), True)
        super().hit(node)

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        super().split(head, tail)
        head.ev_seq, head.ev_ext, head.ev_out = tail.ev_seq, tail.ev_ext, tail.ev_out

    def on_finish(self, node: "TreeNode", output_len: int) -> None:
        """The finished request's pages not yet classed (those it inserted, from `node` up to the first
        node an earlier finish classed) take the bit length of its output: O(nodes it inserted)."""
        bits = int(output_len).bit_length()
        while getattr(node, "ev_out", None) == -1:
            node.ev_out = bits
            node = node.parent

    def key(self, node: "TreeNode") -> tuple:
        if node.ev_list == 1:
            last = len(node.key) // self.page - 1
            return (node.ev_list != self.first, self._rate(self._cls(node, last)), node.last_access_time)
        return (node.ev_list != self.first, 1.0, node.last_access_time)

    def evict_tail(self, node: "TreeNode") -> int:
        """A T1 leaf loses its last run of pages of one class (the same rate: they would go one after
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
            c = self._cls(node, k) if t1 else True
            self.recall.add(self.page_name(node, k * self.page), self.page, c)
