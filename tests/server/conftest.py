"""A real uvicorn on a free 127.0.0.1 port, in a thread, serving an engine the test built."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import openai
import pytest

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.server.app import ServerSettings, create_app
from core.server.drain import DrainingServer, make_server
from core.server.host import EngineHost
from tests.tiny_models import tiny_pair


@dataclass
class Served:
    url: str
    host: EngineHost
    api_key: Optional[str] = None
    admin_key: Optional[str] = None
    server: Optional[DrainingServer] = None

    @property
    def engine(self) -> Engine:
        return self.host.engine

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=kw.pop("timeout", 60), **kw)


@contextmanager
def serving(engine: Optional[Engine] = None, factory=None, settings: Optional[ServerSettings] = None,
            initial_config: Optional[dict] = None, header_timeout: float = 10.0,
            drain_seconds: float = 5.0, port: int = 0) -> Iterator[Served]:
    """The app as `python -m core.server` serves it (make_server: header deadline, drain on SIGTERM), on `port`
    (0: one the system picks; a given one may be one an earlier server here used: a restart)."""
    app = create_app(engine, factory=factory, settings=settings, initial_config=initial_config)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    server = make_server(app, log_level="warning", header_timeout=header_timeout, drain_seconds=drain_seconds)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        s = settings or ServerSettings()
        yield Served(f"http://127.0.0.1:{port}", app.state.host, s.api_key, s.admin_key, server)
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def tiny_runner():
    return tiny_pair("llama")[1]


def tiny_factory(runner):
    def build(config: EngineConfig) -> Engine:
        return Engine(runner, config)
    return build


@pytest.fixture
def tiny(tiny_runner) -> Iterator[Served]:
    """A tiny random model (vocab 128, no tokenizer: prompts are token ids, texts are empty)."""
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny")) as s:
        yield s


def wait_until(cond, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
