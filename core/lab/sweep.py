"""Sweeps: capacities x policies replayed in parallel processes, next to the two bounds.

    res = run_sweep(workload, capacities=[...tokens], policies=["lru", "lfu"], page_size=512)
    res.table()                  # pandas: one row per (policy, capacity), plus the optimum's rows
    res.capacity_to_reach(0.9)   # per policy: smallest swept capacity reaching 90% of the infinite rate
    res.save("out/")             # results.csv + results.json

`progress(done, total, row)` is called in the calling process after each finished point (the
CLI feeds tqdm with it, the dashboard st.progress).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from core.eviction import POLICIES
from core.lab.optimal import BoundResult, Bounds, capacity_pages
from core.lab.pages import Overlap, PageTrace
from core.lab.replay import ReplayResult, check_policy, replay
from core.lab.workloads import Workload

Progress = Callable[[int, int, dict], None]
OPTIMAL = "optimal"
BACKENDS = ("local", "ray")


def parse_capacity(text: Union[str, int], page_size: int = 1) -> int:
    """'3072000', '3M', '512k', '1.5G' (tokens) or '6000p' (pages) -> tokens."""
    if isinstance(text, bool):
        raise ValueError(f"capacity must be a number of tokens, got {text!r}")
    if isinstance(text, int):
        tokens = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]|p|pages?)?\s*", str(text))
        if not m:
            raise ValueError(f"cannot read capacity {text!r}: use tokens (3072000, 3M, 512k) or pages (6000p)")
        num, unit = float(m.group(1)), (m.group(2) or "")
        scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}.get(unit.lower(), page_size)
        tokens = int(round(num * scale))
    capacity_pages(tokens, page_size)   # raises below one page
    return tokens


def parse_capacities(spec: Union[str, Iterable[Union[str, int]]], page_size: int = 1) -> list[int]:
    """A comma-separated string or a list; sorted, duplicates dropped."""
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    if not items:
        raise ValueError("give at least one capacity")
    return sorted({parse_capacity(s, page_size) for s in items})


def parse_policies(spec: Union[str, Iterable[str]]) -> list[str]:
    """'lru,lfu' or 'all' or a list; each checked against the core's policies."""
    items = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    if items == ["all"]:
        return list(POLICIES)
    if not items:
        raise ValueError(f"give at least one policy; choose from: {', '.join(POLICIES)}")
    out = []
    for p in items:
        check_policy(p)
        if p not in out:
            out.append(p)
    return out


@dataclass
class SweepResult:
    workload: dict[str, Any]
    page_size: int
    overlap: Optional[dict]
    capacities: list[int]
    policies: list[str]
    points: list[ReplayResult]
    infinite: BoundResult
    optimal: list[BoundResult] = field(default_factory=list)
    distinct_pages: int = 0
    seconds: float = 0.0

    @property
    def infinite_hit_rate(self) -> float:
        return self.infinite.hit_rate

    def _optimal_by_capacity(self) -> dict[int, float]:
        return {b.capacity_tokens: b.hit_rate for b in self.optimal}

    def table(self):
        """pandas DataFrame: a row per (policy, capacity) and per optimal capacity, sorted."""
        import pandas as pd
        opt = self._optimal_by_capacity()
        inf = self.infinite_hit_rate
        rows = []
        for p in self.points:
            d = p.to_dict()
            d["optimal_hit_rate"] = opt.get(p.capacity_tokens, math.nan)
            rows.append(d)
        for b in self.optimal:
            rows.append({"policy": OPTIMAL, "capacity_tokens": b.capacity_tokens, "capacity_pages": b.capacity_pages,
                         "page_size": b.page_size, "prompt_tokens": b.prompt_tokens, "hit_tokens": b.hit_tokens,
                         "tokens_saved": b.hit_tokens, "hit_rate": b.hit_rate, "optimal_hit_rate": b.hit_rate})
        cols = ["policy", "capacity_tokens", "capacity_pages", "hit_rate", "optimal_hit_rate", "gap_to_optimal",
                "fraction_of_infinite", "hit_tokens", "tokens_saved", "prompt_tokens", "evictions",
                "evicted_tokens", "rejected", "requests", "page_size", "overlap", "seconds"]
        df = pd.DataFrame(rows, columns=[c for c in cols if c not in ("gap_to_optimal", "fraction_of_infinite")])
        df["gap_to_optimal"] = df["optimal_hit_rate"] - df["hit_rate"]
        df["fraction_of_infinite"] = df["hit_rate"] / inf if inf > 0 else math.nan
        for c in ("evictions", "evicted_tokens", "rejected", "requests"):
            df[c] = df[c].astype("Int64")     # integers, empty on the optimum's rows
        order = {p: i for i, p in enumerate(self.policies + [OPTIMAL])}
        df = df.assign(_o=df["policy"].map(order)).sort_values(["_o", "capacity_tokens"]).drop(columns="_o")
        return df[cols].reset_index(drop=True)

    def capacity_to_reach(self, fraction: float = 0.9) -> dict[str, Optional[int]]:
        """Per policy (and the optimum): the smallest swept capacity whose hit rate reaches
        `fraction` of the infinite-capacity rate; None when no swept capacity does."""
        target = fraction * self.infinite_hit_rate
        out: dict[str, Optional[int]] = {}
        series = [(p.policy, p.capacity_tokens, p.hit_rate) for p in self.points]
        series += [(OPTIMAL, b.capacity_tokens, b.hit_rate) for b in self.optimal]
        for name in self.policies + ([OPTIMAL] if self.optimal else []):
            caps = sorted(c for n, c, h in series if n == name and h >= target - 1e-12)
            out[name] = caps[0] if caps else None
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "page_size": self.page_size, "overlap": self.overlap,
            "capacities": self.capacities, "policies": self.policies, "seconds": self.seconds,
            "distinct_pages": self.distinct_pages,
            "infinite": self.infinite.to_dict(),
            "optimal": [b.to_dict() for b in self.optimal],
            "points": [p.to_dict() for p in self.points],
            "capacity_for_90pct_of_infinite": self.capacity_to_reach(0.9),
        }

    def save(self, out_dir: Union[str, os.PathLike]) -> dict[str, Path]:
        """Write results.csv (the table) and results.json (everything) into `out_dir`."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / "results.csv", "json": out / "results.json"}
        self.table().to_csv(paths["csv"], index=False)
        paths["json"].write_text(json.dumps(self.to_json(), indent=2, default=_json_default))
        return paths


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ----- workers -----------------------------------------------------------------------------------
_W: dict[str, Any] = {}


def _init_worker(workload: Workload, page_size: int, overlap: Optional[Overlap], trace: Optional[PageTrace]) -> None:
    import torch
    torch.set_num_threads(1)
    _W.update(workload=workload, page_size=page_size, overlap=overlap, trace=trace, bounds=None)


def _task(kind: str, capacity: int, policy: Optional[str]):
    if kind == OPTIMAL:
        if _W["bounds"] is None:
            _W["bounds"] = Bounds(_W["workload"], _W["page_size"], _W["overlap"], trace=_W["trace"])
        return _W["bounds"].optimal(capacity)
    return replay(_W["workload"], capacity, policy, _W["page_size"], _W["overlap"])


def _row(res: Union[ReplayResult, BoundResult]) -> dict:
    if isinstance(res, ReplayResult):
        return res.to_dict()
    return {"policy": OPTIMAL, **res.to_dict()}


def run_sweep(workload: Workload, capacities: Sequence[Union[int, str]], policies: Sequence[str] = ("lru",),
              page_size: int = 1, overlap: Optional[Overlap] = None, workers: int = 2, with_optimal: bool = True,
              progress: Optional[Progress] = None, mp_context: Optional[str] = None,
              backend: str = "local", ray_address: Optional[str] = None) -> SweepResult:
    """Replay every (capacity, policy) point, plus the optimum at each capacity and the infinite rate.

    capacities are tokens (or strings such as '3M', '6000p', see parse_capacity), rounded down to
    whole pages. workers <= 1 runs everything in this process; otherwise a ProcessPoolExecutor.
    backend="ray" runs each point as a Ray task instead (on the cluster at `ray_address`, or a
    private local instance of `workers` CPUs); the points and their results are the same.
    """
    t0 = time.perf_counter()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    caps = parse_capacities(capacities, page_size)
    pols = parse_policies(policies)
    if overlap is not None and not workload.has_timestamps:
        raise ValueError("overlap replay needs a timestamp on every request; this workload has none "
                         "(give the generator a request_rate, or turn overlap off)")
    bounds = Bounds(workload, page_size, overlap)
    tasks: list[tuple[str, int, Optional[str]]] = []
    if with_optimal:
        tasks += [(OPTIMAL, c, None) for c in caps]
    tasks += [("replay", c, p) for p in pols for c in caps]
    results: list = []
    total = len(tasks)

    def done(res) -> None:
        results.append(res)
        if progress is not None:
            progress(len(results), total, _row(res))

    if backend == "ray":
        from core.lab.ray_backend import run_on_ray
        run_on_ray(tasks, (workload, page_size, overlap, bounds.trace), done, ray_address,
                   num_cpus=max(1, workers))
    elif workers <= 1 or total == 1:
        _init_worker(workload, page_size, overlap, bounds.trace)
        _W["bounds"] = bounds
        try:
            for t in tasks:
                done(_task(*t))
        finally:
            _W.clear()
    else:
        import multiprocessing as mp
        ctx = mp.get_context(mp_context) if mp_context else None
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(workload, page_size, overlap, bounds.trace)) as pool:
            pending = {pool.submit(_task, *t) for t in tasks}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    done(f.result())
    points = sorted((r for r in results if isinstance(r, ReplayResult)),
                    key=lambda r: (pols.index(r.policy), r.capacity_tokens))
    optimal = sorted((r for r in results if isinstance(r, BoundResult)), key=lambda b: b.capacity_tokens)
    return SweepResult(workload=workload.summary(), page_size=page_size,
                       overlap=None if overlap is None else asdict(overlap), capacities=caps, policies=pols,
                       points=points, infinite=bounds.infinite(), optimal=optimal,
                       distinct_pages=bounds.distinct_pages, seconds=time.perf_counter() - t0)
