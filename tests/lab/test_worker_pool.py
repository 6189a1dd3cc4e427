"""The lab's process pools: no more workers than points or CPUs, and none left running when the run ends early."""
from __future__ import annotations

import os
import time

import pytest

from core.lab.worker_pool import pool_size, worker_pool


def test_a_pool_has_at_most_one_worker_a_task_and_one_a_cpu():
    cpus = os.cpu_count() or 1
    assert pool_size(100_000, 50) == min(50, cpus)     # --workers 100000 forked 108 processes on 2 cores
    assert pool_size(4, 1) == 1 and pool_size(0, 8) == 1 and pool_size(1, 8) == 1


def test_an_interrupted_block_terminates_its_workers_instead_of_waiting_for_them():
    """`size` waited for every running search on Ctrl-C (15.8 s) and then said the workers were stopped."""
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with worker_pool(2) as pool:
            futures = [pool.submit(time.sleep, 60) for _ in range(2)]
            procs = []
            while len(procs) < 2:
                procs = list(pool._processes.values())
                time.sleep(0.05)
            time.sleep(0.5)
            raise KeyboardInterrupt
    assert time.perf_counter() - t0 < 10
    assert not any(p.is_alive() for p in procs) and all(f.cancelled() or f.done() for f in futures)
