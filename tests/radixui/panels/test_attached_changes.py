"""A dashboard attached to a server that changes under it: one that stops answering is named within
POLL_READ_S (it took 60-93 s, the page looking live meanwhile), a new reason replaces the shown one, a new engine
drops what was drawn from the old one and says what ended with it, and a redacted tree says its text is hidden
(it read "⟨0⟩⟨0⟩...")."""
from __future__ import annotations

import dataclasses
import socket
import threading
import time

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.server import redact
from core.server.app import ServerSettings
from radixui.connect import http_client
from radixui.connect.http_client import HttpClient
from radixui.panels.live_data import HIDDEN_TOKEN, decoder, follow_engine
from radixui.panels.server_down import needs_rerun, reason
from tests.server.conftest import serving, tiny_factory
from tests.tiny_models import tiny_pair


@pytest.fixture(scope="module")
def tiny_runner():
    return tiny_pair("llama")[1]


def test_a_server_that_accepts_and_never_answers_is_named_within_the_poll_timeout(monkeypatch):
    monkeypatch.setattr(http_client, "POLL_READ_S", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        held = []
        threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
        client = HttpClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
        started = time.perf_counter()
        with pytest.raises(ConnectionError, match="did not answer in time.*stopped, hung or overloaded"):
            client.version()
        assert time.perf_counter() - started < 5
        client.close()


def test_the_page_is_drawn_again_when_the_reason_changes_or_the_server_answers(tiny_runner):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = HttpClient(f"http://127.0.0.1:{port}")
    with pytest.raises(ConnectionError) as down:
        client.versions()
    assert not needs_rerun(client, reason(down.value))             # still down, for the same reason
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", api_key="k"), port=port):
        assert needs_rerun(client, reason(down.value))             # back, refusing this key: another reason
        with pytest.raises(RuntimeError) as refused:
            client.config()
        assert not needs_rerun(client, reason(refused.value))      # the same refusal, met on another route
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny"), port=port):
        assert needs_rerun(client, reason(down.value))             # back and answering
    client.close()


def test_a_new_engine_drops_the_old_figures_and_says_what_ended_with_it(tiny_runner):
    e = Engine(tiny_runner, pool_slots=256)
    e.submit([1, 2, 3], SamplingParams(max_new_tokens=4))
    busy = e.snapshot()
    state = {"my_requests": {"r-mine": 1}}
    follow_engine(state, busy)
    state.update(_figs={"tree": 1}, tree_focus=3, _tree_painted=(5, 0))
    follow_engine(state, busy)
    assert state["_figs"] == {"tree": 1} and "flash" not in state            # the same engine: kept
    other = dataclasses.replace(busy, engine_id="another", requests=())
    follow_engine(state, other)
    assert not {"_figs", "tree_focus", "_tree_painted"} & set(state) and state["my_requests"] == {}
    assert state["flash"] == ("warning", "The engine server now runs a new engine (restarted or replaced): 1 request "
                                         "that was waiting or running ended with the old one.")
    state = {"_engine_applied": True}
    follow_engine(state, busy)
    follow_engine(state, other)
    assert "flash" not in state                                  # this tab's own Apply said it already


def test_a_redacted_tree_draws_hidden_tokens(tiny_runner):
    e = Engine(tiny_runner, pool_slots=256)
    e.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=2))
    snap = redact.snapshot(e.snapshot())
    assert snap.redacted and not e.snapshot().redacted
    tt = decoder({}, None, snap, "tiny")
    node = snap.cache.nodes[1]
    assert tt(node.token_ids) == HIDDEN_TOKEN * len(node.token_ids)
