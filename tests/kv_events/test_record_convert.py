"""Recordings: `record` writes what arrives, `show` replays it, `convert` makes a lab trace whose
requests are the prompts the cache stored; bad configs and files are clear errors."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.publish_config import attach_publisher, parse_config
from core.kv_events.publisher import KVEventPublisher
from core.kv_events.recorder import Recorder, read_recording, replay_recording
from core.kv_events.trace import convert_recording
from core.lab.replay import replay
from core.lab.traces import load_trace
from core.observe.snapshot import snapshot_cache
from tests.interrupts import default_sigint
from tests.kv_events.helpers import LOCAL, radix_prefixes

PS = 4


def _insert(cache: RadixCache, ids: list) -> None:
    m = cache.match_prefix(RadixKey(ids))
    hit = len(m.indices)
    if hit == len(ids):
        return
    if cache.allocator.available() < len(ids) - hit:
        cache.inc_lock_ref(m.last_node)   # keep the matched prefix while making room
        cache.evict(len(ids) - hit - cache.allocator.available())
        cache.dec_lock_ref(m.last_node)
    cache.insert(RadixKey(ids), torch.cat([m.indices, cache.allocator.alloc(len(ids) - hit)]))


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [1, 2, 3, 4, 5, 6, 7, 8, 3, 3, 3, 3],
           [7] * 12, [1, 2, 3, 4, 9, 9, 9, 9, 2, 2, 2, 2], [8] * 8, [1, 2, 3, 4, 5, 6, 7, 8]]


def test_record_show_convert_from_the_command_line(tmp_path):
    cache = RadixCache(SlotAllocator(24, page_size=PS), page_size=PS)
    # publish only on flush(): one batch per prompt, so the recorder's 7 batches are the whole stream
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, interval=3600)
    out = tmp_path / "ev.bin"
    try:
        pub.flush()
        proc = subprocess.Popen([sys.executable, "-m", "core.kv_events", "record", "--endpoint", pub.endpoint,
                                 "--replay", pub.replay_endpoint, "--out", str(out), "--max-batches", "7",
                                 "--duration", "60"], stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while (not out.exists() or out.stat().st_size <= 9) and time.monotonic() < deadline:
                time.sleep(0.05)   # the recorder has caught up on batch 0 from the replay socket
            assert pub.wait_for_subscribers(1, 30.0)   # ... and hears every later batch live
            for p in PROMPTS[:6]:
                _insert(cache, p)
                pub.flush()
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert "7 batches recorded" in err
    finally:
        pub.close()
    frames = list(read_recording(out))
    assert [f.seq for f in frames] == list(range(7))
    f = replay_recording(out)
    assert f.tree.prefixes() == radix_prefixes(snapshot_cache(cache)) and f.status()["exact"]
    shown = subprocess.run([sys.executable, "-m", "core.kv_events", "show", str(out)], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and json.loads(shown.stdout)["tree"]["blocks"] == len(f.tree.blocks)
    trace = tmp_path / "trace.jsonl"
    conv = subprocess.run([sys.executable, "-m", "core.kv_events", "convert", str(out), "--out", str(trace)],
                          capture_output=True, text=True, timeout=60)
    assert conv.returncode == 0, conv.stderr
    assert json.loads(conv.stdout)["requests"] == 6


def test_trace_holds_the_stored_prompts_and_answers_what_if_bigger(tmp_path):
    cache = RadixCache(SlotAllocator(16, page_size=PS), page_size=PS)   # small: prompts evict each other
    rec = Recorder(tmp_path / "ev.bin")
    with KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL) as pub:
        from core.kv_events.follower import StreamFollower
        from core.kv_events.subscriber import KVEventSubscriber
        assert pub.flush() == 0
        sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint,
                                follower=StreamFollower(on_frame=rec))
        sub.start()
        assert sub.catch_up().end == 0 and pub.wait_for_subscribers(1, 10.0)
        for _ in range(2):
            for p in PROMPTS:
                _insert(cache, p)
                assert sub.follower.wait_for(pub.flush(), 5.0)
        sub.close()
        assert sub.follower.gaps[1:] == [] and sub.follower.duplicates == 0 and sub.errors == []
        last = pub.last_seq
    rec.close()
    assert [f.seq for f in read_recording(tmp_path / "ev.bin")] == list(range(last + 1))   # the whole stream
    summary = convert_recording(tmp_path / "ev.bin", tmp_path / "t.jsonl")
    wl = load_trace(tmp_path / "t.jsonl")
    prompts = [r.prompt_ids().tolist() for r in wl.requests]
    # every line is a prompt the cache stored: the cached prefix plus the new blocks
    assert summary["requests"] == len(wl.requests) >= 10
    assert all(p in PROMPTS for p in prompts), prompts
    small, big = replay(wl, 16, page_size=PS), replay(wl, 64, page_size=PS)
    assert big.hit_tokens > small.hit_tokens   # twice... four times the cache keeps what was evicted
    # a failed convert loses nothing: the trace was opened (emptied) before the recording was read
    recording = (tmp_path / "ev.bin").read_bytes()
    with pytest.raises(ValueError, match="is the recording itself"):
        convert_recording(tmp_path / "ev.bin", tmp_path / "ev.bin")
    with pytest.raises(ValueError, match="cannot read recording"):
        convert_recording(tmp_path / "typo.bin", tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match="output_len must be an integer >= 0"):
        convert_recording(tmp_path / "ev.bin", tmp_path / "t.jsonl", output_len=-5)
    assert (tmp_path / "ev.bin").read_bytes() == recording and len(load_trace(tmp_path / "t.jsonl")) == len(wl)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ev.bin", "t.jsonl"]     # no .part left behind


def test_config_errors_say_what_to_change():
    assert parse_config('{"publisher": "zmq"}').endpoint == "tcp://127.0.0.1:5557"   # loopback by default
    with pytest.raises(ValueError, match="unknown publisher"):
        parse_config('{"publisher": "kafka"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_config("{publisher: zmq}")
    with pytest.raises(ValueError, match="unknown field"):
        parse_config('{"publisher": "zmq", "endpiont": "tcp://*:1"}')
    with pytest.raises(ValueError, match="buffer_steps must be >= 1"):
        parse_config('{"publisher": "zmq", "buffer_steps": 0}')
    with pytest.raises(ValueError, match="Expected `int`"):
        parse_config('{"publisher": "zmq", "hwm": "lots"}')
    with pytest.raises(ValueError, match="replay_endpoint must differ"):
        parse_config('{"publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6000"}')
    with pytest.raises(ValueError, match="hash must be one of"):
        parse_config('{"publisher": "zmq", "hash": "md5"}')
    with pytest.raises(ValueError, match="needs a JSON object"):
        parse_config("  ")
    assert attach_publisher(None, '{"publisher": "null"}') is None


def test_port_in_use_is_a_clear_error_and_leaks_nothing():
    cache = RadixCache(SlotAllocator(16, page_size=PS), page_size=PS)
    with KVEventPublisher(cache, endpoint=LOCAL) as pub:
        with pytest.raises(ValueError, match="pick a free port"):
            KVEventPublisher(cache, endpoint=pub.endpoint, bind=True)
        sent = pub.batches_sent
        cache.insert(RadixKey(list(range(PS))), cache.allocator.alloc(PS))
        assert pub.flush() >= 0 and pub.batches_sent > sent      # the first publisher still publishes
        endpoint = pub.endpoint
    with KVEventPublisher(cache, endpoint=endpoint, bind=True) as again:   # and its port is free once closed
        assert again.endpoint == endpoint


def test_torn_recording_is_reported(tmp_path):
    path = tmp_path / "r.bin"
    with Recorder(path) as rec:
        rec.write(0, b"", b"\x93\xcb", 1.0)
        rec.write(1, b"", b"\x93\xcb", 2.0)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(ValueError, match="record 2 is cut short"):
        list(read_recording(path))
    errors: list = []
    assert [f.seq for f in read_recording(path, errors)] == [0] and "cut short" in errors[0]


def _record_then_ctrl_c(out, *extra: str, presses: tuple = (0.0,)) -> tuple[int, str]:
    """`record` from a dead endpoint, stopped by SIGINT once per entry of `presses` (seconds to wait before it),
    the first sent after its "recording ..." line; returns the exit code and stderr."""
    import signal
    proc = subprocess.Popen([sys.executable, "-m", "core.kv_events", "record", "--endpoint", "tcp://127.0.0.1:9",
                             *extra, "--out", str(out)], stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        line = proc.stderr.readline()     # printed inside the try that turns Ctrl-C into a clean stop
        assert line.startswith("recording tcp://127.0.0.1:9") and out.exists(), line
        for wait in presses:
            time.sleep(wait)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def test_ctrl_c_stops_record_cleanly(tmp_path):
    code, err = _record_then_ctrl_c(tmp_path / "ev.bin")
    assert code == 0 and "0 batches recorded" in err and "Traceback" not in err, err
    assert list(read_recording(tmp_path / "ev.bin")) == []      # a valid, empty recording


def test_record_says_when_nothing_listens_at_the_endpoint(tmp_path):
    """It printed "0 batches recorded" and nothing else, as for an engine that is up but quiet."""
    done = subprocess.run([sys.executable, "-m", "core.kv_events", "record", "--endpoint", "tcp://127.0.0.1:9",
                           "--out", str(tmp_path / "ev.bin"), "--duration", "1.5"], capture_output=True, text=True,
                          timeout=30)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 0 and last.startswith("0 batches recorded"), done.stderr
    assert "tcp://127.0.0.1:9: refused" in last and "is the engine up?" in last, last


def test_a_second_ctrl_c_while_record_closes_is_ignored(tmp_path):
    """With a replay endpoint where nothing answers, close() waits for the catch-up's 2 s replay; a second Ctrl-C
    then raised inside it (a traceback, exit -2). The first press once the catch-up waits on the replay socket,
    the second while close() joins the thread."""
    code, err = _record_then_ctrl_c(tmp_path / "ev.bin", "--replay", "tcp://127.0.0.1:9", presses=(0.5, 0.3))
    assert code == 0 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert list(read_recording(tmp_path / "ev.bin")) == []


def test_ctrl_c_during_start_is_delivered_once_the_thread_has_started(monkeypatch):
    """A Ctrl-C that lands while start() starts the thread (the recorder prints "Ctrl-C stops" just before) waits
    until the thread runs: close() then joins it, where landing inside Thread.start() left one that could not be
    joined yet (a CI run once exited 1 there)."""
    import signal
    import threading

    from core.kv_events.subscriber import KVEventSubscriber
    real_start = threading.Thread.start
    def ctrl_c_then_start(self):
        signal.raise_signal(signal.SIGINT)        # pending: held back until start() is done
        real_start(self)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sub = KVEventSubscriber("tcp://127.0.0.1:9")
        monkeypatch.setattr(threading.Thread, "start", ctrl_c_then_start)
        with pytest.raises(KeyboardInterrupt):
            sub.start()
        monkeypatch.undo()
        thread = sub._thread
        assert thread is not None and thread.ident is not None   # it started before the Ctrl-C arrived
        sub.close()
        assert not thread.is_alive() and sub._sub.closed and sub._ctx.closed
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_before_the_thread_starts_still_closes(monkeypatch):
    """Ctrl-C landing inside start(), after the thread object exists but before it runs: close()
    (the recorder's finally) must close the sockets, not fail joining a thread never started."""
    import threading

    from core.kv_events.subscriber import KVEventSubscriber
    sub = KVEventSubscriber("tcp://127.0.0.1:9")
    def interrupted(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sub.start()
    monkeypatch.undo()
    sub.close()
    assert sub._sub.closed and sub._ctx.closed


def test_bad_addresses_are_clear_errors():
    from core.kv_events.subscriber import KVEventSubscriber
    for bad, msg in (("localhost:5557", "not a ZMQ address"), ("tcp://*:5557", "bind address"),
                     ("udp://h:1", "unsupported transport"), (None, "not a ZMQ address")):
        with pytest.raises(ValueError, match=msg):
            KVEventSubscriber(bad)
    r = subprocess.run([sys.executable, "-m", "core.kv_events", "record", "--endpoint", "h:1", "--out", "/dev/null"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a ZMQ address" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_convert_counts_each_request_once_from_its_device_store(engine, tmp_path):
    """Streams from SGLang's / vLLM's own publisher, recorded from seq 1 on: SGLang HiCache copies
    every store to CPU_PINNED (write-through); vLLM's hybrid model stores each request in two KV
    cache groups and offloads to CPU. Only device-tier stores of group 0 with a known parent chain
    are requests; tier copies, other groups and orphans ([5..8], whose parent was stored before
    the recording began) are counted, not replayed."""
    import os

    from tests.kv_events.helpers import FIX
    with open(os.path.join(FIX, "convert_expected.json")) as fh:
        want = json.load(fh)[engine]
    out = tmp_path / "trace.jsonl"
    summary = convert_recording(os.path.join(FIX, f"{engine}_tiers.bin"), out)
    assert [r.prompt_ids().tolist() for r in load_trace(out).requests] == want["prompts"]
    assert {k: summary[k] for k in ("requests", "tier_copies", "other_groups", "orphans")} == \
        {"requests": len(want["prompts"]), "tier_copies": want["tier_copies"], "other_groups": want["other_groups"],
         "orphans": want["orphans"]}
    assert summary["blocks_stored"] == 3 and summary["blocks_requested"] == 5
    conv = subprocess.run([sys.executable, "-m", "core.kv_events", "convert", os.path.join(FIX, f"{engine}_tiers.bin"),
                           "--out", str(tmp_path / "cli.jsonl")], capture_output=True, text=True, timeout=60)
    assert conv.returncode == 0 and json.loads(conv.stdout)["orphans"] == 1
    assert f"not replayed: {want['tier_copies']} tier copies" in conv.stderr
