"""The dashboard attached to an engine server (RADIX_ENGINE_URL) that goes away, refuses its key or rebuilds
slowly: each page says why in place of its views, never a traceback, and comes back once the server answers."""
from __future__ import annotations

import socket
import time

import pytest
from streamlit.testing.v1 import AppTest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from radixui.connect.http_client import HttpClient
from radixui.connect.resources import forget_clients
from tests.radixui.pages.conftest import APP
from tests.server.conftest import serving, tiny_factory
from tests.tiny_models import tiny_pair

WALKTHROUGH = "radixui/pages/walkthrough.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_runner():
    return tiny_pair("llama")[1]


@pytest.fixture
def attached(monkeypatch):
    def attach(url: str, **keys: str) -> AppTest:
        monkeypatch.setenv("RADIX_ENGINE_URL", url)
        for k in ("RADIX_API_KEY", "RADIX_ADMIN_KEY"):
            monkeypatch.delenv(k, raising=False)
        for k, v in keys.items():
            monkeypatch.setenv(k, v)
        forget_clients()
        return AppTest.from_file(APP, default_timeout=120)
    yield attach
    forget_clients()


def errors(at: AppTest) -> list[str]:
    assert not at.exception, [e.value for e in at.exception]      # a message, never a traceback
    return [e.value for e in at.error]


def shows_the_live_page(at: AppTest) -> bool:
    return any("data-testid='kpi-line'" in m.value for m in at.markdown)


def test_a_server_that_goes_away_is_said_on_the_page_which_comes_back_when_it_answers(tiny_runner, attached):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    at = attached(url)
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny"), port=port):
        at.run()
        assert not errors(at) and shows_the_live_page(at)
    at.run()                                                       # the server stopped mid-demo
    (said,) = errors(at)
    assert said.startswith(f"The engine server cannot be used: no engine server answers at {url}")
    assert not shows_the_live_page(at)
    assert any("comes back by itself once it answers" in c.value for c in at.caption)
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny"), port=port):
        at.run()                                                   # what the page's retry does every 3 s
        assert not errors(at) and shows_the_live_page(at)


def test_the_walkthrough_without_its_server_says_so_too(attached):
    at = attached(f"http://127.0.0.1:{free_port()}")
    at.switch_page(WALKTHROUGH).run()
    (said,) = errors(at)
    assert said.startswith("The engine server cannot be used: no engine server answers at")


def test_a_wrong_key_is_said_with_the_variable_that_holds_it(tiny_runner, attached):
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", api_key="right-key")) as s:
        for keys in ({"RADIX_API_KEY": "wrong-key"}, {}):
            at = attached(s.url, **keys).run()
            (said,) = errors(at)
            assert "missing or wrong API key" in said and "start it with the server's key in one of them" in said
            assert "RADIX_API_KEY" in said


def test_a_rebuild_slower_than_the_client_s_timeout_is_waited_for(tiny_runner):
    """A rebuild answers once the new model is loaded (minutes for a large one): it ended in 'no engine server
    answers' after the client's 30 s, though the server went on and rebuilt."""
    def slow(config):
        time.sleep(2.5)
        return Engine(tiny_runner, config)

    with serving(factory=slow, initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny")) as s:
        client = HttpClient(s.url, timeout=1.0)
        try:
            assert client.rebuild(client.config().replace(pool_slots=128)) is None
            assert client.config().pool_slots == 128
        finally:
            client.close()
