"""Sweep points as Ray tasks, so a sweep spreads over a Ray cluster (`--backend ray [--address]`).

Each point runs the very same `core.lab.sweep_worker.run_point` as a local worker process, after the
same `init_worker`, so results are identical to the local backend by construction. The workload
goes into Ray's object store once; a worker process initialises itself the first time it sees
that object. Without an address a private local Ray instance is started and shut down again, its session
files (logs, sockets, spilled objects) in a folder of its own under the system's temp folder
(radix-lab-ray-*, never /tmp/ray, which other Ray users share), removed with the instance.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from core.lab import sweep_worker

ROOT = Path(__file__).resolve().parents[2]
_EXCLUDES = [".git", ".venv", "**/__pycache__", ".pytest_cache", ".hypothesis", "tests/e2e/artifacts", "lab_out"]
_SEEN: dict[str, Any] = {}
TEMP_PREFIX = "radix-lab-ray-"   # short: Ray's unix sockets live below it, and a socket path has at most 107 bytes


def _point(init_args: tuple, key: str, task: tuple, queue=None):
    if _SEEN.get("key") != key:
        sweep_worker.init_worker(*init_args)
        _SEEN["key"] = key
    sweep_worker.set_progress_queue(queue)   # a ray.util.queue.Queue: the point's progress goes to the driver
    return sweep_worker.run_point(*task)


def _runtime_env(address: Optional[str]) -> dict:
    if address is None:    # a local instance: this checkout is on every worker's path already
        return {"env_vars": {"PYTHONPATH": str(ROOT)}}
    return {"working_dir": str(ROOT), "excludes": _EXCLUDES}


def run_on_ray(tasks: Sequence[tuple], init_args: tuple, done: Callable[[Any], None],
               address: Optional[str] = None, num_cpus: Optional[int] = None,
               point_progress: Optional[Callable[[dict, float], None]] = None) -> None:
    """Run every task, calling `done(result)` in this process as each finishes (progress order),
    and `point_progress(task, fraction)` as running points report, as the local pool does.

    Ctrl-C cancels what is still queued or running and shuts a private instance down."""
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs the 'ray' package (pip install ray)") from None
    started = False
    temp_dir: Optional[str] = None
    if not ray.is_initialized():
        kw: dict[str, Any] = dict(address=address, runtime_env=_runtime_env(address), include_dashboard=False,
                                  log_to_driver=False, configure_logging=False)
        if address is None:
            temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX)
            kw.update(num_cpus=num_cpus, object_store_memory=256 * 1024 * 1024, _temp_dir=temp_dir)
        try:
            ray.init(**kw)
        except ConnectionError as exc:
            _remove(temp_dir)
            raise ValueError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None
        except BaseException:
            _remove(temp_dir)
            raise
        started = True
    pending: list = []
    try:
        from ray.util.queue import Empty, Queue
        queue = Queue() if point_progress is not None else None

        def drain() -> None:
            while queue is not None:
                try:
                    policy, capacity, fraction = queue.get_nowait()
                except Empty:
                    return
                point_progress({"policy": policy, "capacity_tokens": capacity}, fraction)
        ref = ray.put(init_args)
        point = ray.remote(num_cpus=1)(_point)
        pending = [point.remote(ref, ref.hex(), t, queue) for t in tasks]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.25)
            drain()
            for r in ready:
                done(ray.get(r))
        drain()
    except BaseException:
        for p in pending:
            ray.cancel(p, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
            _remove(temp_dir)


def _remove(temp_dir: Optional[str]) -> None:
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)
