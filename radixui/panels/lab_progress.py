"""The sweep's progress line: which point is being replayed now, and how far it is.

run_sweep reports a finished point (`done`) and, while a replay runs, its share of requests
(`point`, as core.lab.sweep_worker sends it). A sweep of the conversation trace takes 18-48 s; a
bar that moves only between points (5 policies x 5 capacities) sits still for seconds, so the bar
counts the running points' shares too and the text names them. Pure: the page draws what it returns.
"""
from __future__ import annotations

import time
from typing import Callable, Optional


class SweepProgress:
    def __init__(self, total: int, fmt_tokens: Callable[[int], str], every_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.fmt, self.every_s, self.clock = total, fmt_tokens, every_s, clock
        self.finished = 0
        self.running: dict[tuple[str, int], float] = {}   # (policy, capacity) -> share of its requests done
        self.last: Optional[dict] = None
        self._shown = float("-inf")

    def start(self) -> tuple[float, str]:
        return 0.0, (f"0/{self.total} points done · replaying the offline optimum at each capacity first, "
                     f"then every policy")

    def point(self, task: dict, fraction: float) -> Optional[tuple[float, str]]:
        """A running point's share; (bar, text) at most every `every_s` seconds, else None."""
        self.running[(task["policy"], int(task["capacity_tokens"]))] = min(1.0, max(0.0, float(fraction)))
        now = self.clock()
        if now - self._shown < self.every_s:
            return None
        self._shown = now
        return self.state()

    def done(self, finished: int, total: int, row: dict) -> tuple[float, str]:
        self.finished, self.total = finished, total
        self.running.pop((row["policy"], int(row["capacity_tokens"])), None)
        self.last = row
        return self.state()

    def state(self) -> tuple[float, str]:
        bar = min(1.0, (self.finished + sum(self.running.values())) / self.total) if self.total else 1.0
        text = f"{self.finished}/{self.total} points done"
        if self.running:
            now = ", ".join(f"{p} at {self.fmt(c)} tokens ({f:.0%})" for (p, c), f in list(self.running.items())[:3])
            text += f" · replaying {now}"
        elif self.last is not None:
            text += (f" · last: {self.last['policy']} at {self.fmt(int(self.last['capacity_tokens']))} tokens, "
                     f"hit rate {self.last['hit_rate']:.1%}")
        return bar, text
