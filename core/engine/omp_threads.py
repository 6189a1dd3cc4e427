"""One OpenMP thread pool per serving process: the engine loop's.

libgomp keeps a pool of worker threads for each host thread that ever ran a parallel region, and once
its threads outnumber the CPUs it spins only ~100 times before sleeping, so every parallel region (a
decode step runs hundreds: each torch op and each C kernel) then wakes its workers through the kernel.
A server that loaded the model on its main thread (a pool of 2) and ran the engine on its loop thread
(a second pool of 2) measured decode steps 3x slower on 2 cores (40 vs 14 ms) than one thread doing both.

So the HTTP server calls `reserve()` before it loads anything: its own threads then run torch on one
thread (no second pool), and every engine loop thread (`Engine.start`) sets the count it was given.
Without `reserve()` (a script, a test, the in-process dashboard) the loop thread keeps OpenMP's default.
"""
from __future__ import annotations

from typing import Optional

import torch

_engine_threads: Optional[int] = None


def reserve(threads: Optional[int] = None) -> int:
    """Give `threads` (default: torch's current count) to engine loop threads; the calling thread, and the
    helper threads that call `helper_thread()`, run torch ops on one thread from now on."""
    global _engine_threads
    _engine_threads = max(1, int(threads or torch.get_num_threads()))
    torch.set_num_threads(1)
    return _engine_threads


def loop_threads() -> Optional[int]:
    """The intra-op thread count an engine loop thread should set, or None (no `reserve()`): the loop thread
    then keeps OpenMP's default for a new thread (OMP_NUM_THREADS, else one per core)."""
    return _engine_threads


def helper_thread() -> None:
    """Initializer of a server's helper threads: one torch thread once `reserve()` ran (else unchanged)."""
    if _engine_threads is not None:
        torch.set_num_threads(1)
