"""EngineLoop: the thread that runs an engine's steps while there is work, so callers (the dashboard, the server)
never block on generation; between steps with nothing to do it sleeps on the request table until a submit."""
from __future__ import annotations

import itertools
import sys
import threading
import traceback
from typing import Callable, Optional

import torch

from core.engine import omp_threads
from core.engine.request_table import RequestTable

_LOOP_IDS = itertools.count()
SWITCH_INTERVAL_S = 0.0002
IDLE_WAIT_S = 0.05


class EngineLoop:
    """One loop thread at a time per engine; `step` returns False when idle, `on_error` hears a step's traceback."""

    def __init__(self, step: Callable[[], bool], requests: RequestTable, on_error: Callable[[str], None]) -> None:
        self._step, self._requests, self._on_error = step, requests, on_error
        self.thread_name = f"radix-engine-{next(_LOOP_IDS)}"   # one name per engine: tests count its loops
        self.threads = 0   # torch intra-op threads of the running loop thread (0: never started)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def start(self) -> None:
        old = self._thread
        if old is not None and old.is_alive():
            if not self._stop.is_set():
                return
            old.join()  # a stop() that timed out mid-step: let that loop end, never run two
        self._stop.clear()
        # The loop thread needs the GIL back after each of the ~1,000 torch ops of a forward; with
        # the default 5 ms switch interval a busy caller thread (a dashboard) stalls it for seconds.
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._run, args=(omp_threads.loop_threads(),),
                                        name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._requests.wake_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None  # else keep it: start() waits for it instead of starting a second

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def _run(self, threads: Optional[int]) -> None:
        if threads is not None:              # OpenMP's thread count is per thread: see omp_threads.py
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        while not self._stop.is_set():
            try:
                busy = self._step()
            except Exception:  # never let the loop die; record and keep serving
                self._on_error(traceback.format_exc(limit=3))
                busy = False
            if not busy:
                self._requests.wait(self._stop, timeout=IDLE_WAIT_S)
