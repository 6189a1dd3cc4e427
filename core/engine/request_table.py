"""RequestTable: the engine's requests by id and its inbox, behind one small lock of their own.

Why apart from the engine lock: submitting, aborting a queued request and reading the table for a viewer must not
wait for a running step (a step holds the engine lock for its whole forward). The table keeps every live request
and the last KEEP_FINISHED finished ones (the dashboard's request table); the inbox holds requests submitted since
the last step, not yet handed to the scheduler. Lock order: the engine lock first, then this one, never the
reverse.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Optional

from core.engine.request import ABORTED, FINISHED, Request

KEEP_FINISHED = 200          # finished requests kept for the dashboard's request table


class RequestTable:
    """Requests by rid (insertion order) and the inbox; `changes` counts what a viewer would see change."""

    def __init__(self, keep_finished: int = KEEP_FINISHED) -> None:
        self.keep_finished = keep_finished
        self.changes = 0
        self._requests: "OrderedDict[str, Request]" = OrderedDict()
        self._finished: "deque[str]" = deque()
        self._inbox: list[Request] = []
        self._wake = threading.Condition(threading.Lock())

    def submit(self, req: Request) -> None:
        """Add a new request to the table and the inbox, and wake the loop; the rid of a live request is a
        ValueError. A finished request's rid may be used again (as in SGLang): the new request takes its row."""
        with self._wake:
            old = self._requests.get(req.rid)
            if old is not None and not (old.finish_reason is not None and old.done.is_set()):
                raise ValueError(f"request id {req.rid!r} belongs to a request still running; pick another rid "
                                 f"or abort that one first")
            if old is not None:
                del self._requests[req.rid]
                if req.rid in self._finished:
                    self._finished.remove(req.rid)
            self._requests[req.rid] = req
            self._inbox.append(req)
            self.changes += 1
            self._wake.notify()

    def take_inbox(self) -> list[Request]:
        """The requests submitted since the last call, oldest first (for the scheduler)."""
        with self._wake:
            new, self._inbox = self._inbox, []
        return new

    def get(self, rid: str) -> Optional[Request]:
        """The request `rid` if it is still in the table."""
        with self._wake:
            return self._requests.get(rid)

    def withdraw(self, rid: str) -> Optional[Request]:
        """The live request `rid`, taken out of the inbox if still there (abort); None if unknown or done."""
        with self._wake:
            req = self._requests.get(rid)
            if req is None or req.state in (FINISHED, ABORTED) or req.done.is_set():
                return None
            if req in self._inbox:
                self._inbox.remove(req)
            return req

    def withdraw_queued(self, rid: str) -> Optional[Request]:
        """The request `rid` taken out of the inbox if it is still there (submitted, not yet scheduled), else
        None: such a request holds nothing, so aborting it needs no step to end first."""
        with self._wake:
            req = self._requests.get(rid)
            if req is None or req not in self._inbox:
                return None
            self._inbox.remove(req)
            req.state = ABORTED   # now, under this lock: a second abort (withdraw) finds it ended
            return req

    def finished(self, rid: str) -> None:
        """`rid` is done: it stays in the table among the last `keep_finished` finished ones."""
        with self._wake:
            self._finished.append(rid)
            self.changes += 1
            while len(self._finished) > self.keep_finished:
                old = self._finished.popleft()
                gone = self._requests.get(old)
                if gone is not None and gone.finish_reason is not None:
                    del self._requests[old]

    def tokens(self, rid: str) -> Optional[dict]:
        """{"prompt_ids", "output_ids"} of a request still in the table, or None."""
        with self._wake:
            req = self._requests.get(rid)
            if req is None:
                return None
            return {"prompt_ids": [int(t) for t in req.prompt_ids], "output_ids": [int(t) for t in req.output_ids]}

    def listing(self) -> tuple[list[Request], int]:
        """Every request in the table and the inbox's length, read together."""
        with self._wake:
            return list(self._requests.values()), len(self._inbox)

    def queued(self) -> int:
        """Requests in the inbox (read without the lock: a gauge)."""
        return len(self._inbox)

    def wait(self, stop: threading.Event, timeout: float) -> None:
        """Sleep until a submit, `wake_all` or `timeout`, unless something is queued or `stop` is set."""
        with self._wake:
            if not self._inbox and not stop.is_set():
                self._wake.wait(timeout=timeout)

    def wake_all(self) -> None:
        with self._wake:
            self._wake.notify_all()
