"""Stopping on SIGTERM (or Ctrl-C) without cutting anyone off mid-sentence.

uvicorn's own graceful stop waits a few seconds for open connections, then cancels what is left:
a plain-text 500, or a stream cut with no end, and a CancelledError traceback each. Here the first
signal drains instead: the server stops admitting (new requests get 503 with Retry-After and
/health says "draining"), lets what is in flight finish for up to `drain_seconds`, then ends the rest
with an OpenAI error (a stream gets an error event, then `data: [DONE]`), gives those answers a
moment to leave, and only then lets uvicorn stop. A second signal stops at once, as uvicorn's does.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import uvicorn

from core.server.host import SHUTDOWN, EngineHost
from core.server.read_timeouts import protocol_with

DEFAULT_DRAIN_S = 5.0
FLUSH_S = 1.0          # how long the ended requests' answers get to leave before uvicorn stops


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, host: EngineHost, drain_seconds: float = DEFAULT_DRAIN_S) -> None:
        super().__init__(config)
        self.host, self.drain_seconds = host, drain_seconds
        self.drain_thread: Optional[threading.Thread] = None

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain_thread is not None:       # a second signal: stop now
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)      # uvicorn re-raises it once stopped (the exit status says which)
        self.drain_thread = threading.Thread(target=self.drain, name="radix-drain", daemon=True)
        self.drain_thread.start()

    def drain(self) -> None:
        host = self.host
        host.begin_drain()
        if not host.wait_idle(self.drain_seconds):
            host.abort_all(SHUTDOWN)
            host.wait_idle(FLUSH_S)
            time.sleep(min(FLUSH_S, 0.3))       # the error answers and [DONE]s are on their way out
        self.should_exit = True


def make_server(app, host: str = "127.0.0.1", port: int = 30000, log_level: str = "info",
                header_timeout: float = 10.0, drain_seconds: float = DEFAULT_DRAIN_S) -> DrainingServer:
    """The uvicorn server for `app` (create_app's), with the header deadline and the drain on SIGTERM."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=protocol_with(header_timeout),
                            timeout_graceful_shutdown=2, timeout_keep_alive=5)
    return DrainingServer(config, app.state.host, drain_seconds)
