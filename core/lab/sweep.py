"""Sweeps: capacities x policies replayed in parallel processes, next to the two bounds.

    res = run_sweep(workload, capacities=[...tokens], policies=["lru", "lfu"], page_size=512)
    res.table()                  # pandas: one row per (policy, capacity), plus the optimum's rows
    res.capacity_to_reach(0.9)   # per policy: smallest swept capacity reaching 90% of the infinite rate
    res.save("out/")             # results.csv + results.json

`progress(done, total, row)` is called in the calling process after each finished point (the
CLI feeds tqdm with it, the dashboard st.progress); `point_progress(task, fraction)` a few times a
second while a point is running (the workers report through a queue), so a long point is not silent.

Ctrl-C (KeyboardInterrupt) stops the workers at once (they ignore SIGINT themselves, so only the
calling process reports it) and propagates; nothing is written.

Capacities are parsed in one place, `core.lab.units.parse_capacity` (tokens, pages, and bytes of a
model's KV such as 80GiB), and rounded down to whole pages by `parse_capacities`, so two
capacities in the same page count give one row.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from core.cache.eviction.registry import POLICIES
from core.lab import sweep_worker, units
from core.lab.optimal import BoundResult, Bounds, capacity_pages
from core.lab.page_trace import Overlap, require_timestamps
from core.lab.replay import ReplayResult, check_policy
from core.lab.sweep_worker import OPTIMAL, PointProgress
from core.lab.worker_pool import pool_size, worker_pool
from core.lab.workloads import Workload

Progress = Callable[[int, int, dict], None]
BACKENDS = ("local", "ray")


def parse_capacities(spec: Union[str, Iterable[Union[str, int]]], page_size: int = 1,
                      kv: Optional[units.ModelKV] = None) -> list[int]:
    """A comma-separated string or a list; each rounded down to whole pages (the pool's real size), sorted,
    duplicates dropped (1000 and 1001 tokens in pages of 16 are the same 62-page pool: one row). With `kv`
    (a model's KV bytes per token) items may be bytes too: see core.lab.units.parse_capacity."""
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    if not items:
        raise ValueError("give at least one capacity")
    return sorted({capacity_pages(units.parse_capacity(s, page_size, kv), page_size) * page_size for s in items})


def rounding_note(spec: Union[str, Iterable[Union[str, int]]], page_size: int,
                  kv: Optional[units.ModelKV] = None) -> Optional[str]:
    """The capacities that page size rounds down (a pool holds whole pages), in one sentence; None when none is.
    Read after parse_capacities has checked `spec`."""
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    cut = []
    for item in items:
        tokens = units.parse_capacity(item, page_size, kv)
        if tokens % page_size:
            cut.append(f"{str(item).strip()} is {tokens // page_size * page_size:,} tokens")
    if not cut:
        return None
    shown = ", ".join(cut[:4]) + (f" and {len(cut) - 4} more" if len(cut) > 4 else "")
    return f"a pool holds whole pages of {page_size:,} tokens, so capacities are rounded down: {shown}"


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
    unfit_capacities: list[int] = field(default_factory=list)   # every request is larger than the pool there
    smallest_request_tokens: int = 0
    with_optimal: bool = True

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
        for c in self.unfit_capacities if self.with_optimal else []:   # no optimum: blank, see nothing_fits_note
            rows.append({"policy": OPTIMAL, "capacity_tokens": c, "capacity_pages": c // self.page_size,
                         "page_size": self.page_size, "prompt_tokens": self.infinite.prompt_tokens,
                         "hit_tokens": None, "tokens_saved": None, "hit_rate": math.nan,
                         "optimal_hit_rate": math.nan})
        cols = ["policy", "capacity_tokens", "capacity_pages", "hit_rate", "optimal_hit_rate", "gap_to_optimal",
                "fraction_of_infinite", "hit_tokens", "tokens_saved", "prompt_tokens", "evictions",
                "evicted_tokens", "rejected", "requests", "page_size", "overlap", "seconds"]
        df = pd.DataFrame(rows, columns=[c for c in cols if c not in ("gap_to_optimal", "fraction_of_infinite")])
        df["gap_to_optimal"] = df["optimal_hit_rate"] - df["hit_rate"]
        df["fraction_of_infinite"] = df["hit_rate"] / inf if inf > 0 else math.nan
        for c in ("evictions", "evicted_tokens", "rejected", "requests", "hit_tokens", "tokens_saved"):
            df[c] = df[c].astype("Int64")     # integers, empty on the optimum's rows (and where nothing fits)
        order = {p: i for i, p in enumerate(self.policies + [OPTIMAL])}
        df = df.assign(_o=df["policy"].map(order)).sort_values(["_o", "capacity_tokens"]).drop(columns="_o")
        return df[cols].reset_index(drop=True)

    def capacity_to_reach(self, fraction: float = 0.9) -> dict[str, Optional[int]]:
        """Per policy (and the optimum): the smallest swept capacity whose hit rate reaches
        `fraction` of the infinite-capacity rate; None when no swept capacity does, and for every one when that
        rate is 0 (no whole page repeats: a 0 hit rate "reaches" 90 % of 0 at any size, which answers nothing)."""
        target = fraction * self.infinite_hit_rate
        out: dict[str, Optional[int]] = {}
        if self.infinite_hit_rate <= 0:
            return {name: None for name in self.policies + ([OPTIMAL] if self.optimal else [])}
        series = [(p.policy, p.capacity_tokens, p.hit_rate) for p in self.points]
        series += [(OPTIMAL, b.capacity_tokens, b.hit_rate) for b in self.optimal]
        for name in self.policies + ([OPTIMAL] if self.optimal else []):
            caps = sorted(c for n, c, h in series if n == name and h >= target - 1e-12)
            out[name] = caps[0] if caps else None
        return out

    def capped_note(self) -> Optional[str]:
        """The points whose pool the replay capped at what the workload can ever fill (`pool_pages`, see
        core.lab.replay), in one sentence; None when there are none."""
        capped = sorted({(p.capacity_pages, p.pool_pages) for p in self.points if p.pool_pages < p.capacity_pages})
        if not capped:
            return None
        need = capped[0][1]
        unit = "token" if self.page_size == 1 else "page"   # at page size 1 a page is a token: say so
        need_text = units.plural(need, unit)
        return (f"{', '.join(f'{c:,}' for c, _ in capped)} {unit}s exceed the {need_text} this workload can ever fill; "
                f"those points were replayed with {need_text} (no policy evicts there, so the numbers are those of "
                f"any larger pool)")

    def nothing_fits_note(self) -> Optional[str]:
        """The capacities where every request is larger than the pool, in one sentence; None when there are none."""
        if not self.unfit_capacities:
            return None
        caps = ", ".join(f"{c:,}" for c in self.unfit_capacities)
        return (f"at {caps} tokens nothing fits: the smallest request holds {self.smallest_request_tokens:,} tokens "
                f"(prompt + output - 1, in whole pages), more than the pool, so every policy rejects every request "
                f"there and no "
                f"optimum is given (hit rate 0 is all any pool that small can do)")

    def to_json(self, target: float = 0.9) -> dict[str, Any]:
        """Everything, with the smallest swept capacity reaching `target` of the infinite-capacity rate."""
        target = check_target(target)
        return {
            "workload": self.workload, "page_size": self.page_size, "overlap": self.overlap,
            "capacities": self.capacities, "policies": self.policies, "seconds": self.seconds,
            "distinct_pages": self.distinct_pages,
            "infinite": self.infinite.to_dict(),
            "optimal": [b.to_dict() for b in self.optimal],
            "points": [p.to_dict() for p in self.points],
            "target_fraction_of_infinite": target,
            "capacity_to_reach_target": self.capacity_to_reach(target),
            "no_optimum": {"capacities": self.unfit_capacities, "why": self.nothing_fits_note()},
        }

    def save(self, out_dir: Union[str, os.PathLike], target: float = 0.9) -> dict[str, Path]:
        """Write results.csv (the table) and results.json (everything) into `out_dir`."""
        out = prepare_out_dir(out_dir)
        paths = {"csv": out / "results.csv", "json": out / "results.json"}
        self.table().to_csv(paths["csv"], index=False)
        paths["json"].write_text(json.dumps(self.to_json(target), indent=2, default=_json_default))
        return paths


def check_target(target: float) -> float:
    """A fraction of the infinite-capacity rate: a number in (0, 1]."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) \
            or not 0 < target <= 1:
        raise ValueError(f"target must be a fraction of the infinite-capacity hit rate in (0, 1], such as 0.9; "
                         f"got {target!r}")
    return float(target)


def prepare_out_dir(out_dir: Union[str, os.PathLike]) -> Path:
    """Create `out_dir` and prove it writable now, before any work is done (a sweep must not be lost)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {os.fspath(out)!r} is a file; give a directory to write results.csv, "
                         f"results.json and chart.html into")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write_test_"):
            pass
    except OSError as e:
        raise ValueError(f"cannot write results into {os.fspath(out)!r}: {e.strerror or e}; "
                         f"give a directory you can write to") from None
    return out


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _row(res: Union[ReplayResult, BoundResult]) -> dict:
    if isinstance(res, ReplayResult):
        return res.to_dict()
    return {"policy": OPTIMAL, **res.to_dict()}


def run_sweep(workload: Workload, capacities: Sequence[Union[int, str]], policies: Sequence[str] = ("lru",),
              page_size: int = 1, overlap: Optional[Overlap] = None, workers: int = 2, with_optimal: bool = True,
              progress: Optional[Progress] = None, mp_context: Optional[str] = None,
              point_progress: Optional[PointProgress] = None, level: str = "auto",
              backend: str = "local", ray_address: Optional[str] = None) -> SweepResult:
    """Replay every (capacity, policy) point, plus the optimum at each capacity and the infinite rate.

    capacities are tokens (or strings such as '3M', '6000p', see core.lab.units.parse_capacity), rounded down to
    whole pages. workers <= 1 runs everything in this process; otherwise a ProcessPoolExecutor.
    level: the replay's ("auto", "page" or "token"; see core.lab.replay: the same numbers either way).
    backend="ray" runs each point as a Ray task instead (on the cluster at `ray_address`, or a
    private local instance of `workers` CPUs); the points, their progress and results are the same.
    """
    t0 = time.perf_counter()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    caps = parse_capacities(capacities, page_size)
    pols = parse_policies(policies)
    if overlap is not None:
        require_timestamps(workload)
    bounds = Bounds(workload, page_size, overlap)
    unfit = [c for c in caps if not bounds.anything_fits(c)]
    tasks: list[tuple[str, int, Optional[str]]] = []
    if with_optimal:
        tasks += [(OPTIMAL, c, None) for c in caps if c not in unfit]
    tasks += [("replay", c, p) for p in pols for c in caps]
    results: list = []
    total = len(tasks)

    def done(res) -> None:
        results.append(res)
        if progress is not None:
            progress(len(results), total, _row(res))

    if backend == "ray":
        from core.lab.ray_backend import run_on_ray
        run_on_ray(tasks, (workload, page_size, overlap, bounds.trace, level), done, ray_address,
                   num_cpus=max(1, workers), point_progress=point_progress)
    elif workers <= 1 or total == 1:
        sweep_worker.init_worker(workload, page_size, overlap, bounds.trace, level, bounds=bounds)
        try:
            for t in tasks:
                done(sweep_worker.run_point(*t, report=point_progress))
        finally:
            sweep_worker.clear()
    else:
        _run_pool(tasks, pool_size(workers, len(tasks)), mp_context,
                  (workload, page_size, overlap, bounds.trace, level),
                  done, point_progress)
    points = sorted((r for r in results if isinstance(r, ReplayResult)),
                    key=lambda r: (pols.index(r.policy), r.capacity_tokens))
    optimal = sorted((r for r in results if isinstance(r, BoundResult)), key=lambda b: b.capacity_tokens)
    return SweepResult(workload=workload.summary(), page_size=page_size,
                       overlap=None if overlap is None else asdict(overlap), capacities=caps, policies=pols,
                       points=points, infinite=bounds.infinite(), optimal=optimal,
                       distinct_pages=bounds.distinct_pages, seconds=time.perf_counter() - t0,
                       unfit_capacities=unfit, smallest_request_tokens=bounds.smallest_request_pages * page_size,
                       with_optimal=with_optimal)


def _run_pool(tasks: list, workers: int, mp_context: Optional[str], initargs: tuple, done: Callable,
              point_progress: Optional[PointProgress]) -> None:
    """The tasks in a process pool (worker_pool: terminated on any exit but success, Ctrl-C included);
    running points report through a queue."""
    import multiprocessing as mp
    import queue as queue_mod
    ctx = mp.get_context(mp_context) if mp_context else mp.get_context()
    q = ctx.Queue()
    try:
        with worker_pool(workers, ctx, sweep_worker.init_worker, (*initargs, q)) as pool:
            def drain(timeout: float) -> None:
                while True:
                    try:
                        policy, capacity, fraction = q.get(timeout=timeout) if timeout else q.get_nowait()
                    except queue_mod.Empty:
                        return
                    if point_progress is not None:
                        point_progress({"policy": policy, "capacity_tokens": capacity}, fraction)

            pending = {pool.submit(sweep_worker.run_point, *t) for t in tasks}
            while pending:
                finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                drain(0)
                for f in finished:
                    done(f.result())
            drain(0.05)     # a worker's last reports can trail its result
    finally:
        q.close()
        q.join_thread()
