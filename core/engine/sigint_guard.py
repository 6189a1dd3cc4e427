"""Ctrl-C held back while the engine's state is mid-change.

`Engine.generate` and the CLI step the engine on the main thread, where Python raises KeyboardInterrupt at any
bytecode. Cut inside the scheduler, the tree or the allocator, a step would leave slots owned twice or lost and
paths locked for good, and the next request could read another's KV. While a guard is held, SIGINT is only
noted; it is raised where the state is whole: at the start of the model's forward (whose failure path fails the
batch cleanly), inside the forward (`interruptible()`), or when the guard ends. Off the main thread (the server's
engine loop) a guard does nothing: Python delivers signals to the main thread only."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional


class SigintGuard:
    """One guarded region (a step, an abort, a reset): `with SigintGuard() as guard: ...`."""

    def __init__(self) -> None:
        self.pending = False              # a Ctrl-C came while the state was mid-change
        self._open = False                # inside interruptible(): a Ctrl-C is raised at once
        self._previous: Optional[Callable[..., Any]] = None

    def __enter__(self) -> "SigintGuard":
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGINT)
        if callable(previous):            # SIG_IGN / SIG_DFL / a C handler: nothing Python would raise
            self._previous = previous
            signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if self._open:
            self._open = False
            self._deliver(frame)
        else:
            self.pending = True

    def _deliver(self, frame: Any = None) -> None:
        """Run the handler the guard stood in for (Python's raises KeyboardInterrupt)."""
        self.pending = False
        if self._previous is not None:
            self._previous(signal.SIGINT, frame)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A region a Ctrl-C may cut (the model's forward: it writes only the batch's own new slots). A Ctrl-C
        held back so far is raised on entry."""
        if self.pending:
            self._deliver()
        self._open = True
        try:
            yield
        finally:
            self._open = False

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._previous is None:
            return
        if signal.getsignal(signal.SIGINT) == self._note:   # a handler that ran may have set its own: kept
            signal.signal(signal.SIGINT, self._previous)
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        try:
            if self.pending and not interrupted:   # held back until the state was whole: delivered now (over an
                self._deliver()                    # ordinary exception too: a caller that catches it keeps it)
        finally:
            self._previous = None
