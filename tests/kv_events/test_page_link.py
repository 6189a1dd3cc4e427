"""The KV events page tells the truth before its first batch: waiting (on which address), or that
no one binds (the engine and the page both connect, SGLang's rule for a named host), with what to
change; "Bind here" then makes the stream flow. The typed address survives a reload (query string)."""
from __future__ import annotations

import pathlib
import socket
import time

from streamlit.testing.v1 import AppTest

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.publisher import KVEventPublisher, should_bind
from radixui.panels.kv_link import unresolved_host, waiting_message
from tests.kv_events.helpers import LOCAL

APP = str(pathlib.Path(__file__).resolve().parents[2] / "app.py")
PAGE = "radixui/pages/kv_events.py"
EP = "tcp://10.0.0.7:5557"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def _close_source() -> None:
    from radixui.connect.kv_source import get_holder
    get_holder().close()


def _texts(at: AppTest) -> list[str]:
    return [e.value for e in (*at.success, *at.info, *at.warning, *at.error)]


def test_nothing_received_on_a_connected_link_is_waiting_not_exact():
    level, text = waiting_message(EP, False, "connected", 0, 12.4)
    assert level == "info"
    assert text.startswith(f"Waiting for the first batch on {EP}: connected, subscribed 12 s ago, nothing received yet")


def test_a_refused_link_says_no_one_binds_and_what_to_change():
    level, text = waiting_message(EP, False, "refused", 0, 3.0, caught_up_to=0)
    assert level == "error"
    assert text.startswith(f"Nothing listens at {EP}, so no batch can arrive.")
    assert "no one binds" in text and "tcp://*:PORT (it binds)" in text and '"Bind here"' in text
    assert text.endswith("applied batches up to seq 0, but no live batch can follow.")


def test_a_host_that_does_not_resolve_is_named_not_called_a_refusal():
    """ZeroMQ retries an unresolvable name as it retries a refused connection (link "refused")."""
    assert unresolved_host("tcp://no-such-host.invalid:5557") == "no-such-host.invalid"
    assert unresolved_host("tcp://127.0.0.1:5557") is None and unresolved_host("tcp://localhost:5557") is None
    assert unresolved_host("tcp://*:5557") is None and unresolved_host("ipc:///tmp/kv") is None
    ep = "tcp://no-such-host.invalid:5557"
    level, text = waiting_message(ep, False, "refused", 0, 3.0, unresolved=unresolved_host(ep))
    assert level == "error" and text.startswith(f"No address found for 'no-such-host.invalid' (the host in {ep})")
    assert "Nothing listens" not in text
    # once batches came, the host resolved then: the link is gone, not misnamed
    assert waiting_message(ep, False, "refused", 3, 3.0, unresolved="x")[1].startswith("Nothing listens at")


def test_a_bound_page_nobody_connected_to_says_so_even_after_a_replay():
    level, text = waiting_message(EP, True, "listening", 0, 5.0, caught_up_to=3)
    assert (level, text.split(";")[0]) == ("warning", f"Listening at {EP} for 5 s")


def test_the_stream_status_shows_once_a_batch_came_live_or_by_replay():
    assert waiting_message(EP, False, "connected", 1, 1.0) is None
    assert waiting_message(EP, False, "connected", 0, 1.0, caught_up_to=4) is None
    assert waiting_message(EP, True, "connected", 2, 1.0) is None
    assert waiting_message(EP, False, "connecting", 0, 0.0) == ("info", f"Connecting to {EP} (0 s)...")


def test_engine_and_page_both_connecting_is_an_error_until_the_page_binds():
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    assert not should_bind(endpoint)        # a named host: the publisher connects, as SGLang's does
    cache = RadixCache(SlotAllocator(64, page_size=2), page_size=2)
    pub = KVEventPublisher(cache, endpoint=endpoint, replay_endpoint=LOCAL, interval=3600)
    try:
        assert pub.flush() == 0               # batch 0: the replay socket holds it
        at = _page()
        at.text_input(key="kv_endpoint").input(endpoint)
        at.text_input(key="kv_replay").input(pub.replay_endpoint).run()
        at.toggle(key="kv_live").set_value(False)
        from radixui.connect.kv_source import get_holder
        sub = get_holder().sub
        deadline = time.time() + 10
        while sub.link != "refused":
            assert time.time() < deadline, sub.link
            time.sleep(0.05)
        assert sub.follower.wait_for(0, 5.0)  # the catch-up applied batch 0 from the replay socket
        at.run()
        assert not at.exception
        assert not at.success, [s.value for s in at.success]          # no green "Exact"
        assert [e.value.split(",")[0] for e in at.error] == [f"Nothing listens at {endpoint}"]
        assert not any("No blocks cached" in t for t in _texts(at))
        # "Bind here": the page listens at the address the engine connects to, and batches flow
        at.checkbox(key="kv_bind").check().run()
        sub = get_holder().sub
        assert sub.bind and sub.endpoint == endpoint
        # the engine reconnects on its own; until its pipe is up a batch can be lost (ZMQ's slow
        # joiner), and the replay socket fills that gap: publish until one arrives live
        for i in range(1, 8):
            if i == 1:
                cache.insert(RadixKey([5, 6, 7, 8]), cache.allocator.alloc(4))     # 2 blocks
            else:
                cache.insert(RadixKey([10 + i, 10 + i]), cache.allocator.alloc(2))   # 1 more block
            seq = pub.flush()
            if sub.follower.wait_for(seq, 0.5):
                break
        assert sub.received >= 1 and sub.follower.last_seq == seq
        at.run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any(f"every batch up to seq {seq:,} applied" in s.value for s in at.success)
        assert {m.label: m.value for m in at.metric}["Blocks cached"] == str(2 + (i - 1))
    finally:
        _close_source()
        pub.close()


def test_the_typed_address_is_kept_in_the_query_string_across_a_reload():
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        at = _page()
        at.text_input(key="kv_endpoint").input(endpoint)
        at.text_input(key="kv_topic").input("kv").run()
        assert at.query_params["kv_endpoint"] == endpoint and at.query_params["kv_topic"] == "kv"
        reloaded = _page(kv_endpoint=endpoint, kv_topic="kv")    # a new session with the URL's query string
        assert reloaded.text_input(key="kv_endpoint").value == endpoint
        assert reloaded.text_input(key="kv_topic").value == "kv"
        assert any(t.startswith(f"Connecting to {endpoint}") or t.startswith(f"Nothing listens at {endpoint}")
                   for t in _texts(reloaded)), _texts(reloaded)
    finally:
        _close_source()


def test_a_link_with_kv_bind_connects_and_never_makes_the_page_listen():
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        at = _page(kv_endpoint=endpoint, kv_bind="1")           # a crafted link opened in a fresh session
        from radixui.connect.kv_source import get_holder
        sub = get_holder().sub
        assert at.checkbox(key="kv_bind").value is False and "kv_bind" not in at.query_params
        assert sub.endpoint == endpoint and not sub.bind
        with socket.socket() as probe:                          # the port is still free: nothing listens
            probe.bind(("127.0.0.1", port))
    finally:
        _close_source()
