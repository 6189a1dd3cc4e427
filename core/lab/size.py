"""The planner's question: how small a pool still reaches `target` x the infinite-capacity hit rate?

Answered by search on capacity, not read off a grid: for each policy (and the offline optimum) a
gallop doubles the pool until it reaches the goal, then bisection halves the bracket
[largest capacity that misses, smallest that reaches] until the two are within `rel_tol`
(1 %) or one page of each other. The answer is the bracket's upper end; the lower end is reported too.

Shortcuts that are exact, not heuristics:
- the optimum bounds every policy at every capacity (core.lab.optimal), so a capacity where the
  optimum misses the goal is a miss for every policy too: a policy's search starts from the
  optimum's bracket and never replays below it;
- at `core.lab.replay.pool_pages_needed` pages nothing is ever evicted, so every policy hits as often
  as infinite capacity there (and the replay caps any larger pool there): the gallop never goes beyond it.

Bisection relies on the hit count rising with capacity. Belady's optimum is a stack algorithm
(monotone). LRU on a radix tree nearly is, but the tree evicts whole nodes and locks running
paths, and FIFO-like policies can show Belady's anomaly (a larger pool hitting less). Every probe
is kept and checked: any pair of probes where the larger pool hit less is reported in
`violations`, and then the answer means "reaches the goal, and a pool `rel_tol` smaller did not",
not "nothing smaller reaches it".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from core.lab.optimal import Bounds
from core.lab.page_trace import NO_HITS_NOTE, Overlap
from core.lab.replay import check_policy, pool_pages_needed, replay
from core.lab.units import ModelKV, fmt_capacity
from core.lab.sweep_worker import OPTIMAL
from core.lab.workloads import Workload
from core.lab.worker_pool import pool_size, worker_pool



@dataclass
class SizeAnswer:
    """The smallest pool (within rel_tol) reaching the goal, for one policy or the optimum."""

    name: str
    target: float
    goal_hit_tokens: float
    page_size: int
    capacity_pages: Optional[int]          # None: not reached even with every page cached
    lower_pages: int                       # largest capacity known to miss (0 = none)
    hit_tokens: Optional[int]              # at capacity_pages
    prompt_tokens: int
    probes: dict[int, int] = field(default_factory=dict)    # pages -> hit tokens, every replay made
    violations: list[tuple[int, int, int, int]] = field(default_factory=list)  # (a, hits a, b, hits b), a<b
    note: str = ""

    @property
    def capacity_tokens(self) -> Optional[int]:
        return None if self.capacity_pages is None else self.capacity_pages * self.page_size

    @property
    def monotone(self) -> bool:
        return not self.violations

    @property
    def hit_rate(self) -> Optional[float]:
        return None if self.hit_tokens is None else self.hit_tokens / self.prompt_tokens

    def to_dict(self, kv: Optional[ModelKV] = None) -> dict:
        d = {"policy": self.name, "target": self.target, "capacity_tokens": self.capacity_tokens,
             "capacity_pages": self.capacity_pages, "lower_tokens": self.lower_pages * self.page_size,
             "hit_rate": self.hit_rate, "replays": len(self.probes), "monotone": self.monotone, "note": self.note}
        if kv is not None:
            d["capacity_gib"] = None if self.capacity_tokens is None else kv.gib(self.capacity_tokens)
            d["capacity_bytes"] = None if self.capacity_tokens is None else self.capacity_tokens * kv.bytes_per_token
        return d

    def describe(self, kv: Optional[ModelKV] = None) -> str:
        if self.capacity_pages is None:
            return f"{self.name}: not reached ({self.note})"
        s = (f"{self.name}: {fmt_capacity(self.capacity_tokens, self.page_size, kv)}; hit rate {self.hit_rate:.4f}"
             f" (goal {self.goal_hit_tokens / self.prompt_tokens:.4f}); {self.lower_pages * self.page_size:,} tokens"
             f" miss it; {len(self.probes)} replays")
        if self.violations:
            a, ha, b, hb = self.violations[0]
            s += (f". NOT MONOTONE: {a * self.page_size:,} tokens hit {ha:,} but {b * self.page_size:,} hit only "
                  f"{hb:,} ({len(self.violations)} such pair(s)); a smaller pool might also reach the goal")
        return s


def _violations(probes: dict[int, int]) -> list[tuple[int, int, int, int]]:
    pts = sorted(probes.items())
    out, best = [], None
    for p, h in pts:
        if best is not None and h < best[1]:
            out.append((best[0], best[1], p, h))
        if best is None or h > best[1]:
            best = (p, h)
    return out


def search(f: Callable[[int], int], goal: float, hi_max: int, start: int = 1, lower: int = 0,
           rel_tol: float = 0.01, probes: Optional[dict[int, int]] = None) -> tuple[Optional[int], int, dict[int, int]]:
    """Smallest pages p (within rel_tol) with f(p) >= goal, for f rising in p. `lower` is known to miss.

    Returns (p or None when f(hi_max) misses, the largest probe that missed, every probe)."""
    probes = {} if probes is None else probes

    def at(p: int) -> int:
        if p not in probes:
            probes[p] = int(f(p))
        return probes[p]

    lo, hi = lower, max(start, lower + 1, 1)
    hi = min(hi, hi_max)
    while at(hi) < goal:                      # gallop
        lo = hi
        if hi >= hi_max:
            return None, lo, probes
        hi = min(2 * hi, hi_max)
    while hi - lo > max(1, int(rel_tol * hi)):    # bisect [lo misses, hi reaches]
        mid = (lo + hi) // 2
        if at(mid) >= goal:
            hi = mid
        else:
            lo = mid
    return hi, lo, probes


def check_goal(target: float, rel_tol: float) -> None:
    """A size goal (a share of the infinite-capacity rate) and its tolerance, or a ValueError saying what to pass."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ValueError(f"--target must be a fraction in (0, 1], e.g. 0.9; got {target!r}")
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, (int, float)) or not 0 < rel_tol < 1:
        raise ValueError(f"the tolerance must be a fraction in (0, 1), e.g. 0.01; got {rel_tol!r}")


def _answer(name, target, goal, bounds: Bounds, found, lower, probes, note="") -> SizeAnswer:
    t = bounds.trace
    return SizeAnswer(name, target, goal, t.page_size, found, lower, None if found is None else probes[found],
                      t.prompt_tokens, probes, _violations(probes), note)


def size_optimal(bounds: Bounds, target: float = 0.9, hi_max: Optional[int] = None, rel_tol: float = 0.01) -> SizeAnswer:
    """The optimum's smallest pool reaching target x the infinite rate. Never below the smallest request: a
    smaller pool rejects every request under every policy (Bounds.anything_fits), whatever hits the page-level
    optimum would claim there (sweep blanks those points)."""
    check_goal(target, rel_tol)
    inf = bounds.infinite().hit_tokens
    goal = target * inf
    floor = max(1, bounds.smallest_request_pages)
    hi_max = max(hi_max or bounds.distinct_pages + 1, floor)
    ps = bounds.page_size
    if inf == 0:
        return _answer(OPTIMAL, target, goal, bounds, None, 0, {}, NO_HITS_NOTE)
    found, lower, probes = search(lambda p: bounds.optimal(p * ps).hit_tokens, goal, hi_max, floor, floor - 1,
                                  rel_tol)
    return _answer(OPTIMAL, target, goal, bounds, found, lower, probes)


def size_policy(workload: Workload, policy: str, bounds: Bounds, target: float = 0.9,
                overlap: Optional[Overlap] = None, rel_tol: float = 0.01, start: Optional[SizeAnswer] = None,
                hi_max: Optional[int] = None) -> SizeAnswer:
    """One policy's smallest pool (replays through the real RadixCache), starting from the optimum's bracket."""
    check_goal(target, rel_tol)
    check_policy(policy)
    ps = bounds.page_size
    inf = bounds.infinite().hit_tokens
    goal = target * inf
    hi_max = hi_max or pool_pages_needed(workload, ps, overlap, bounds.distinct_pages)
    if inf == 0:
        return _answer(policy, target, goal, bounds, None, 0, {}, NO_HITS_NOTE)
    lower, first = 0, 1
    if start is not None and start.capacity_pages is not None:
        lower, first = start.lower_pages, start.capacity_pages   # the optimum misses below: so does the policy
    probe = (lambda p: replay(workload, p * ps, policy, ps, overlap, trace=bounds.trace).hit_tokens)
    found, lower, probes = search(probe, goal, hi_max, first, lower, rel_tol)
    note = "" if found is not None else f"not even at {hi_max * ps:,} tokens, where every page fits"
    return _answer(policy, target, goal, bounds, found, lower, probes, note)


def _size_one(args) -> SizeAnswer:
    workload, policy, page_size, target, overlap, rel_tol, opt = args
    import torch
    torch.set_num_threads(1)
    return size_policy(workload, policy, Bounds(workload, page_size, overlap), target, overlap, rel_tol, opt)


def size(workload: Workload, policies: Sequence[str] = ("lru",), target: float = 0.9, page_size: int = 1,
         overlap: Optional[Overlap] = None, rel_tol: float = 0.01, workers: int = 1,
         with_optimal: bool = True) -> list[SizeAnswer]:
    """Per policy (and the optimum, first): the smallest pool reaching target x the infinite rate."""
    check_goal(target, rel_tol)
    for p in policies:
        check_policy(p)
    bounds = Bounds(workload, page_size, overlap)
    opt = size_optimal(bounds, target, rel_tol=rel_tol)
    start = opt    # the optimum's bracket is cheap and makes every policy's search shorter
    tasks = [(workload, p, page_size, target, overlap, rel_tol, start) for p in policies]
    if workers <= 1 or len(tasks) <= 1:
        out = [size_policy(workload, p, bounds, target, overlap, rel_tol, start) for p in policies]
    else:
        with worker_pool(pool_size(workers, len(tasks))) as pool:
            out = list(pool.map(_size_one, tasks))
    return ([opt] if with_optimal else []) + out
