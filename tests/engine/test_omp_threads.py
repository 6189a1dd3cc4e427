"""One OpenMP thread pool per serving process (core/engine/omp_threads.py): after `reserve(n)` the reserving
thread and the server's helper threads run torch on one thread, and the engine loop thread runs with n. Run
in a fresh process: the thread counts are process state."""
from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent("""
    import threading, time, torch
    from concurrent.futures import ThreadPoolExecutor
    from core.engine import omp_threads
    torch.set_num_threads(2)
    before = omp_threads.loop_threads() or 0
    given = omp_threads.reserve(3)
    from core.engine.engine import Engine
    from core.engine.model.runner import ModelRunner
    from core.engine.sampling import SamplingParams
    from core.server.cpu_pool import CpuPool
    from tests.tiny_models import tiny_pair
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=64).start()
    out = e.submit([1, 2, 3], SamplingParams(max_new_tokens=3)).result(30).token_ids
    helper = CpuPool(1).executor.submit(torch.get_num_threads).result()
    e.stop()
    print(before, given, torch.get_num_threads(), e.loop.threads, helper, len(out))
""")


def test_the_engine_loop_gets_the_reserved_threads_and_every_other_thread_one():
    got = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    before, given, main, loop, helper, tokens = map(int, got.stdout.split())
    assert (before, given) == (0, 3)          # without reserve(): None, the loop keeps OpenMP's default
    assert main == 1 and helper == 1          # the reserving thread and the server's helper threads
    assert loop == 3 and tokens == 3          # the loop thread ran the model with the reserved count
