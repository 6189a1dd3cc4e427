"""One sweep point in a worker process: the same code for the local process pool and for Ray tasks.

`init_worker` keeps the workload (and its page trace) in the worker once; `run_point` replays one
(capacity, policy) point, or computes the optimum at a capacity. Results are identical whichever
backend runs them, by construction.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from core.lab.optimal import Bounds
from core.lab.page_trace import Overlap, PageTrace
from core.lab.replay import replay
from core.lab.workloads import Workload

OPTIMAL = "optimal"
PointProgress = Callable[[dict, float], None]
_state: dict[str, Any] = {}   # this worker process's workload, page trace, bounds and progress queue


def init_worker(workload: Workload, page_size: int, overlap: Optional[Overlap], trace: Optional[PageTrace],
                level: str = "auto", queue=None, bounds: Optional[Bounds] = None) -> None:
    """Keep what every point of a sweep shares (a pool worker's Ctrl-C and parent: worker_pool.py)."""
    import torch
    torch.set_num_threads(1)
    _state.clear()
    _state.update(workload=workload, page_size=page_size, overlap=overlap, trace=trace, bounds=bounds,
                  queue=queue, level=level)


def set_progress_queue(queue) -> None:
    """Where running points report their progress (a Ray queue, set per task)."""
    _state["queue"] = queue


def clear() -> None:
    _state.clear()


def run_point(kind: str, capacity: int, policy: Optional[str], report: Optional[PointProgress] = None):
    """A ReplayResult for ("replay", capacity, policy), or the BoundResult for (OPTIMAL, capacity, None)."""
    if kind == OPTIMAL:
        if _state["bounds"] is None:
            _state["bounds"] = Bounds(_state["workload"], _state["page_size"], _state["overlap"], trace=_state["trace"])
        return _state["bounds"].optimal(capacity)
    task = {"policy": policy, "capacity_tokens": capacity}
    queue = _state.get("queue")
    if report is None and queue is not None:
        report = lambda t, f: queue.put((t["policy"], t["capacity_tokens"], f))  # noqa: E731
    progress = None if report is None else (lambda done, total: report(task, done / total if total else 1.0))
    return replay(_state["workload"], capacity, policy, _state["page_size"], _state["overlap"], progress=progress,
                  trace=_state["trace"], level=_state["level"])
