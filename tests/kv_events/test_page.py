"""The KV events page (AppTest): follows a live publisher and shows its tree and status; replays a
recording; bad addresses and files are messages, never tracebacks."""
from __future__ import annotations

import pathlib

import torch
from streamlit.testing.v1 import AppTest

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.publisher import KVEventPublisher
from tests.kv_events.helpers import LOCAL

APP = str(pathlib.Path(__file__).resolve().parents[2] / "app.py")
PAGE = "radixui/pages/kv_events.py"
FIX = pathlib.Path(__file__).parent / "fixtures"


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def _close_source() -> None:
    from radixui.connect.kv_source import get_holder
    get_holder().close()


def test_live_endpoint_shows_the_tree_and_exact_status():
    cache = RadixCache(SlotAllocator(64, page_size=2), page_size=2)
    # publish only on flush(): batch 0 the empty tree, batch 1 both inserts, on every run
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, interval=3600)
    try:
        assert pub.flush() == 0
        cache.insert(RadixKey([5, 6, 7, 8]), cache.allocator.alloc(4))
        m = cache.match_prefix(RadixKey([5, 6, 9, 9]))
        cache.insert(RadixKey([5, 6, 9, 9]), torch.cat([m.indices, cache.allocator.alloc(2)]))
        seq = pub.flush()
        assert seq == 1
        at = _page()
        assert [t.value for t in at.title] == ["KV events"] and at.info   # asks for an address
        at.text_input(key="kv_endpoint").input(pub.endpoint)
        at.text_input(key="kv_replay").input(pub.replay_endpoint)
        at.run()
        at.toggle(key="kv_live").set_value(False)
        from radixui.connect.kv_source import get_holder
        assert get_holder().sub.follower.wait_for(seq, 5.0)
        at.run()
        assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
        assert any(f"seq {seq:,} applied" in s.value for s in at.success)
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["Blocks cached"] == "3" and metrics["Max depth"] == "2" and metrics["Branch points"] == "1"
        fig = at.get("plotly_chart")[0]
        assert fig is not None
        at.segmented_control(key="kv_view").set_value("Events").run()
        log = next(d.value for d in at.dataframe if "event" in d.value.columns)
        assert not at.exception and log["event"].tolist() == ["BlockStored", "BlockStored", "AllBlocksCleared"]
    finally:
        _close_source()
        pub.close()


def test_recording_replays_and_bad_input_is_a_message(tmp_path):
    at = _page()
    at.radio(key="kv_mode").set_value("Recording").run()
    at.text_input(key="kv_path").input(str(tmp_path / "nope.bin")).run()
    assert not at.exception and "cannot read recording" in at.error[0].value
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a recording")
    at.text_input(key="kv_path").input(str(bad)).run()
    assert not at.exception and "not a KV event recording" in at.error[0].value
    at.text_input(key="kv_path").input(str(FIX / "vllm_live.bin")).run()
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Blocks cached"] == "2" and metrics["Batches"] == "5"
    at.slider(key="kv_upto").set_value(4).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Orphans"] == "2" and not at.exception    # vLLM freed a parent before its children


def test_bad_endpoint_is_a_message():
    at = _page()
    at.text_input(key="kv_endpoint").input("localhost:5557").run()
    assert not at.exception and "not a ZMQ address" in at.error[0].value
    at.text_input(key="kv_endpoint").input("tcp://*:5557").run()
    assert not at.exception and "bind address" in at.error[0].value
    _close_source()


def test_a_dropped_batch_is_shown_then_filled_by_replay():
    cache = RadixCache(SlotAllocator(64, page_size=2), page_size=2)
    pub = KVEventPublisher(cache, endpoint=LOCAL)          # no replay socket: the gap cannot be filled
    pub2 = KVEventPublisher(RadixCache(SlotAllocator(64, page_size=2), page_size=2), endpoint=LOCAL,
                            replay_endpoint=LOCAL)
    try:
        assert pub.flush() == 0 and pub2.flush() == 0   # batch 0 of each goes out before any SUB exists
        at = _page()
        at.text_input(key="kv_endpoint").input(pub.endpoint).run()
        at.toggle(key="kv_live").set_value(False).run()
        from radixui.connect.kv_source import get_holder
        sub = get_holder().sub
        assert pub.wait_for_subscribers(1, 10.0)   # the page's SUB hears every batch from here
        cache.insert(RadixKey([9, 9]), cache.allocator.alloc(2))
        assert sub.follower.wait_for(pub.flush(), 5.0)   # batch 1, heard live
        pub.drop_next = 1                                  # armed before the insert: batch 2 is the one lost
        cache.insert(RadixKey([1, 2]), cache.allocator.alloc(2))
        assert pub.flush() == 2
        cache.insert(RadixKey([1, 2, 3, 4]), torch.cat([cache.match_prefix(RadixKey([1, 2])).indices,
                                                        cache.allocator.alloc(2)]))
        assert sub.follower.wait_for(pub.flush(), 5.0)
        at.run()
        assert not at.exception
        assert any("missing since seq" in e.value and "not recovered" in e.value for e in at.error), \
            [e.value for e in at.error]
        assert {m.label: m.value for m in at.metric}["Orphans"] == "1"
        assert [(g.start, g.end, g.reason, g.recovered) for g in sub.follower.gaps] == \
            [(0, 0, "joined late", False), (2, 2, "missing batches", False)]
        # the same loss with a replay socket: filled, and the page says so
        at.text_input(key="kv_endpoint").input(pub2.endpoint)
        at.text_input(key="kv_replay").input(pub2.replay_endpoint).run()
        sub2 = get_holder().sub
        assert sub2.catch_up().end == 0 and pub2.wait_for_subscribers(1, 10.0)
        c2 = pub2.cache
        c2.insert(RadixKey([1, 2]), c2.allocator.alloc(2))
        assert sub2.follower.wait_for(pub2.flush(), 5.0)
        pub2.drop_next = 1
        c2.insert(RadixKey([5, 6]), c2.allocator.alloc(2))
        assert pub2.flush() == 2
        c2.insert(RadixKey([5, 6, 7, 8]), torch.cat([c2.match_prefix(RadixKey([5, 6])).indices,
                                                     c2.allocator.alloc(2)]))
        assert sub2.follower.wait_for(pub2.flush(), 5.0)
        at.run()
        assert not at.exception and not at.error
        assert any("filled from the replay socket" in s.value for s in at.success)
        assert {m.label: m.value for m in at.metric}["Orphans"] == "0"
        assert [(g.start, g.end, g.reason, g.recovered, g.replayed) for g in sub2.follower.gaps] == \
            [(0, 0, "joined late", True, 1), (2, 2, "missing batches", True, 2)]
        assert sub2.follower.batches == 4 and sub2.follower.duplicates == 1   # batch 3: live and replayed
    finally:
        _close_source()
        pub.close()
        pub2.close()


def test_page_says_how_many_batches_a_late_join_lost():
    """Buffer of 5, 20 batches before the page subscribes, 3 after: 8 blocks, one gap, 15 lost;
    after the engine flushes its cache the tree is exact again and the page still says 15 were lost."""
    cache = RadixCache(SlotAllocator(128, page_size=2), page_size=2)
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, buffer_steps=5, interval=3600)
    try:
        assert pub.flush() == 0
        for n in range(1, 20):
            cache.insert(RadixKey([n, n]), cache.allocator.alloc(2))
            assert pub.flush() == n
        at = _page()
        at.text_input(key="kv_endpoint").input(pub.endpoint)
        at.text_input(key="kv_replay").input(pub.replay_endpoint).run()
        at.toggle(key="kv_live").set_value(False).run()
        from radixui.connect.kv_source import get_holder
        sub = get_holder().sub
        assert sub.catch_up().end == 14 and pub.wait_for_subscribers(1, 10.0)
        for n in range(20, 23):
            cache.insert(RadixKey([n, n]), cache.allocator.alloc(2))
            assert sub.follower.wait_for(pub.flush(), 5.0)
        at.run()
        assert not at.exception
        assert any("15 batch(es) lost (1 gap(s))" in e.value for e in at.error), [e.value for e in at.error]
        assert {m.label: m.value for m in at.metric}["Blocks cached"] == "8"
        table = next(d.value for d in at.dataframe if "lost" in d.value.columns)
        assert table[["from seq", "to seq", "reason", "lost"]].values.tolist() == [[0, 14, "joined late", 15]]
        cache.evict(100)
        cache.reset()
        assert sub.follower.wait_for(pub.flush(), 5.0)
        at.run()
        assert not at.error and any("15 batch(es) lost before that" in s.value for s in at.success)
    finally:
        _close_source()
        pub.close()
