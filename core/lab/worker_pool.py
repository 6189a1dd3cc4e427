"""The lab's process pools (a sweep's points, a size search's policies): as many workers as are useful, each
gone when the run ends, however it ends.

- At most one worker a point and one a CPU: every worker imports torch and holds a copy of the workload,
  so more than the CPUs only adds memory and switching (`--workers 100000` forked 108 on 2 cores).
- On any exit but success (Ctrl-C, SIGTERM, an error) the workers are terminated at once instead of
  finishing their points.
- A worker dies with its parent (Linux's PR_SET_PDEATHSIG): a parent killed outright (SIGKILL, the OOM
  killer) cannot leave workers blocked on their queues under PID 1.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Optional

PR_SET_PDEATHSIG = 1


def pool_size(workers: int, tasks: int) -> int:
    """Processes for `tasks` independent tasks when `workers` were asked for."""
    return max(1, min(workers, tasks, os.cpu_count() or 1))


def die_with_parent() -> None:
    """In a worker (SIGTERM at its default, see _init): SIGTERM when the parent process dies; at once if it
    already has."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):   # no prctl in this libc: the parent's own cleanup still runs
            pass
    if os.getppid() == 1:                          # the parent was gone before prctl: SIGTERM now (SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


def _init(initializer: Optional[Callable], initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle: it terminates the worker
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the CLI's unwinding handler, whose
    die_with_parent()                              # exception the pool's worker loop would catch and live on
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def worker_pool(workers: int, mp_context=None, initializer: Optional[Callable] = None,
                initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor of `workers` processes (see pool_size) that waits for its work only when the
    block succeeds; otherwise its workers are terminated."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp_context, initializer=_init,
                               initargs=(initializer, initargs))
    ok = False
    try:
        yield pool
        ok = True
    finally:
        if ok:
            pool.shutdown(wait=True)
        else:
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
