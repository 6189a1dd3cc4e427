"""The dashboard's /state routes through radixui.connect.http_client.HttpClient, against the engine itself."""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import httpx
import numpy as np
import pytest

from core.engine.sampling import SamplingParams
from core.observe import wire
from core.server.app import ServerSettings
from radixui.connect.http_client import HttpClient
from radixui.connect.resources import EngineConfig
from tests.server.conftest import serving, tiny_factory, wait_until

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]


def _same(a, b) -> None:
    """Field-by-field equality of two views (numpy arrays compared by value, dtype and shape;
    any two sequences element by element: a lazy tuple-like view arrives as a tuple)."""
    if isinstance(a, Sequence) and not isinstance(a, str):
        assert isinstance(b, Sequence) and not isinstance(b, str), (a, b)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert type(a) is type(b), (a, b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def test_snapshot_and_events_arrive_as_the_engine_made_them(tiny):
    client = HttpClient(tiny.url)
    v0 = client.version()
    rid = client.submit(PROMPT, SamplingParams(max_new_tokens=4), extra_key="ns")
    wait_until(lambda: not tiny.host.inflight, what="the request to finish")
    assert client.version() != v0
    snap = client.snapshot()
    _same(snap, tiny.engine.snapshot(wait=False))
    assert snap.requests[-1].rid == rid and snap.requests[-1].output_tokens == 4
    assert not snap.pool.k_norms.flags.writeable   # frozen, as the engine's own views are
    assert client.snapshot() is snap               # unchanged engine: 304, the same object
    events = tiny.engine.events_since(0)
    _same(client.events_since(0, limit=100_000), events[-10_000:])   # bounded by the server's page size
    _same(client.events_since(0, limit=3), events[-3:])            # the newest when there are more
    _same(client.events_since(events[-5].seq), events[-4:])        # incremental
    assert client.events_since(events[-1].seq) == []
    page = httpx.get(f"{tiny.url}/state/events", params={"since": 0, "limit": 4}).json()
    assert [e["seq"] for e in page["events"]] == [e.seq for e in events[:4]] and page["last_seq"] == events[-1].seq
    r = httpx.get(f"{tiny.url}/state/events", params={"since": 0, "limit": 10**6})
    assert r.status_code == 400   # the page size is bounded


def test_wire_round_trips_every_event_kind(tiny):
    c = tiny.client()
    for p in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9], [7] * 236):   # a split, then evictions in a 256-slot pool
        c.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0)
    events = tiny.engine.events_since(0)
    assert {"match", "split", "insert", "alloc", "free", "evict", "lock", "unlock", "reset"} <= {e.kind for e in events}
    _same([wire.event_from_dict(wire.event_to_dict(e)) for e in events], events)
    with pytest.raises(ValueError, match="unknown event kind"):
        wire.event_from_dict({"kind": "nope", "seq": 1, "time": 0})


def test_submit_errors_step_mode_reset_and_rebuild(tiny):
    client = HttpClient(tiny.url)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        client.submit(PROMPT, SamplingParams(max_new_tokens=-1))
    with pytest.raises(ValueError, match="does not fit a pool of 256 slots"):
        client.submit([3] * 300, SamplingParams(max_new_tokens=1))
    assert client.is_stepping() is False and client.last_error() is None
    client.set_step_mode(True)
    assert client.is_stepping() is True and tiny.engine.running is False
    rid = client.submit(PROMPT, SamplingParams(max_new_tokens=3))
    assert client.step() is True   # admitted and prefilled: it now holds slots
    assert "in flight" in client.reset_cache()
    assert client.abort(rid) is True and client.abort(rid) is False
    wait_until(lambda: not tiny.host.inflight, what="the abort to land")
    assert client.step() is False
    assert client.reset_cache() is None
    client.set_step_mode(False)
    assert tiny.engine.running
    cfg = client.config()
    assert cfg.model == "tiny" and cfg.pool_slots == 256
    msg = client.rebuild(dataclasses.replace(cfg, pool_slots=0))
    assert msg.startswith("pool_slots must be") and "got 0" in msg
    assert client.config().pool_slots == 256        # the old engine still serves
    old = tiny.engine
    assert client.rebuild(dataclasses.replace(cfg, pool_slots=128, eviction_policy="lfu")) is None
    assert tiny.engine is not old and not old.running and tiny.engine.running
    assert client.config() == EngineConfig(model="tiny", pool_slots=128, page_size=1, eviction_policy="lfu",
                                           schedule_policy=cfg.schedule_policy,
                                           max_running_requests=cfg.max_running_requests,
                                           max_prefill_tokens=cfg.max_prefill_tokens, disable_radix_cache=False,
                                           model_impl="native", dtype="fp32",
                                           kv_cache_dtype="fp32")   # what the tiny runner runs
    assert client.snapshot().pool.num_slots == 128
    got = tiny.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
    assert got.usage.completion_tokens == 2


def test_unreachable_server_names_the_url():
    client = HttpClient("http://127.0.0.1:9", timeout=2)
    with pytest.raises(ConnectionError, match=r"no engine server answers at http://127.0.0.1:9"):
        client.version()


def test_request_tokens_and_token_bytes_over_http(tiny):
    c = HttpClient(tiny.url)
    try:
        rid = c.submit(PROMPT, SamplingParams(max_new_tokens=3))
        wait_until(lambda: tiny.engine.request_tokens(rid) is not None
                   and len(tiny.engine.request_tokens(rid)["output_ids"]) == 3)
        got = c.request_tokens(rid)
        assert got == tiny.engine.request_tokens(rid) and got["prompt_ids"] == PROMPT
        assert c.request_tokens("no-such-rid") is None
        # the tiny model has no tokenizer: a token's bytes are its id written out
        assert c.token_bytes([5, 17, 127]) == ["35", "3137", "313237"]
        for bad in ([128], [-1], ["5"], [True]):
            with pytest.raises(ValueError, match="at most 50,000 integers in 0..127"):
                c.token_bytes(bad)
    finally:
        c.close()


def test_the_dashboard_s_abort_all_reaches_every_request_of_a_multi_choice_call(tiny_runner):
    """The dashboard's "Abort all requests" through the server: the samples of an n=4 call that one queue
    position (max_request_share=1) had not submitted yet end too."""
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", max_request_share=1)) as s:
        client = HttpClient(s.url)
        client.set_step_mode(True)
        got = []
        t = threading.Thread(target=lambda: got.append(httpx.post(
            f"{s.url}/v1/completions", timeout=60,
            json={"model": "tiny", "prompt": PROMPT, "max_tokens": 50, "n": 4, "ignore_eos": True})))  # none ends early
        try:
            t.start()
            wait_until(lambda: s.host.inflight, what="the first choice to reach the engine")
            assert client.step()
            assert client.abort_all() == 4
        finally:
            client.set_step_mode(False)
        t.join(30)
        assert got[0].status_code == 400 and got[0].json()["error"]["code"] == "request_aborted"
        wait_until(lambda: not s.host.inflight and not s.host.runs, what="everything to end")
        assert s.host.reserved == 0
        s.engine.check_invariants()
