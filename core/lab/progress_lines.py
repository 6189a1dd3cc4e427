"""Sweep progress for a log file or a pipe: a handful of plain lines, not a bar's hundreds of redraws.

A line when the finished points pass each tenth of the total (and at the end), and, while long points run, at
most one line every `heartbeat` seconds, so a 5 s sweep writes about ten lines and a long one is never silent.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class PlainProgress:
    def __init__(self, out: Optional[TextIO] = None, steps: int = 10, heartbeat: float = 15.0) -> None:
        self.out = out if out is not None else sys.stderr
        self.steps = steps
        self.heartbeat = heartbeat
        self.start = self.last = time.monotonic()
        self.shown = 0          # tenths already announced

    def _line(self, text: str) -> None:
        self.last = time.monotonic()
        print(f"progress: {text} ({self.last - self.start:.1f} s)", file=self.out, flush=True)

    def finished(self, done: int, total: int, label: str) -> None:
        """A point finished: a line when `done` reaches the next tenth of `total`, and at the last point."""
        tenth = done * self.steps // max(total, 1)
        if tenth > self.shown or done == total:
            self.shown = tenth
            self._line(f"{done}/{total} points, {done / max(total, 1):.0%}; last {label}")

    def running(self, done: float, total: int) -> None:
        """Points are running (`done` counts their finished fractions): a line only after `heartbeat` silent s."""
        if time.monotonic() - self.last >= self.heartbeat:
            self._line(f"{done:.1f}/{total} points, {done / max(total, 1):.0%}, running")
