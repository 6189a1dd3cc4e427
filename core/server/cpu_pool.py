"""The server's bounded worker pool: every step that costs CPU or may wait on the engine runs here,
never on the event loop (parsing a body, tokenizing, the chat template, building and serialising a
snapshot, rendering /metrics, submitting, aborting, flushing, rebuilding).

A fixed number of threads (`--cpu-workers`) bounds how much of the machine the HTTP side can take;
the event loop stays free to answer /health and to stream tokens while a large prompt is tokenized.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from core.engine import omp_threads

T = TypeVar("T")
DEFAULT_WORKERS = 4


class CpuPool:
    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        if workers < 1:
            raise ValueError(f"--cpu-workers must be >= 1, got {workers}")
        self.workers = workers
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="radix-cpu", initializer=omp_threads.helper_thread)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on a worker; the caller's task awaits it without blocking the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def fire(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on a worker without waiting (an abort from a `finally` that cannot await)."""
        try:
            self.executor.submit(fn, *args)
        except RuntimeError:   # the pool is shut down: the server is stopping, run it here
            fn(*args)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
