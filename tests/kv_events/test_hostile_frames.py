"""What a publisher that is not quite SGLang sends must not stop the subscriber: a batch with a None, float or
string token (its thread died in the tree, and the recorder went on recording nothing, exit 0), a negative
sequence number (written as a gap record, it made the whole recording unreadable) and a replay frame whose
sequence is not 8 bytes (the thread died again). Each is noted in `errors`, counted as a gap where a batch is
lost, and the batches after it are followed."""
from __future__ import annotations

import threading
import time

import pytest
import zmq

from core.kv_events.protocol import SGLangBlockStored, SGLangKVEventBatch, encode_batch, seq_bytes
from core.kv_events.subscriber import KVEventSubscriber, check_endpoint

TOPIC = b"kv-events"


def batch(h: int, tokens=(1, 2, 3, 4)) -> bytes:
    ev = SGLangBlockStored(block_hashes=[h], parent_block_hash=None, token_ids=list(tokens), block_size=4,
                           lora_id=None)
    return encode_batch(SGLangKVEventBatch(ts=time.time(), events=[ev]))   # encoding does not check types


@pytest.fixture
def pub():
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, port
    sock.close(0)


def joined(sock, sub) -> None:
    """Send batch 0 until the subscriber has it (a SUB misses what is sent before it has joined)."""
    deadline = time.time() + 10
    while not sub.follower.wait_for(0, 0.05):
        assert time.time() < deadline
        sock.send_multipart([TOPIC, seq_bytes(0), batch(100)])


@pytest.mark.parametrize("token", [None, 1.5, "abcd", True], ids=["none", "float", "string", "bool"])
def test_a_bad_token_is_an_undecodable_batch_and_the_thread_follows_on(pub, token):
    sock, port = pub
    with KVEventSubscriber(f"tcp://127.0.0.1:{port}") as sub:
        sub.start(catch_up=False)
        joined(sock, sub)
        sock.send_multipart([TOPIC, seq_bytes(1), batch(101, (token, 1, 2, 3))])
        sock.send_multipart([TOPIC, seq_bytes(-1), batch(102)])
        for seq in (2, 3):
            sock.send_multipart([TOPIC, seq_bytes(seq), batch(100 + seq)])
        assert sub.follower.wait_for(3, 5.0), sub.errors
        st = sub.follower.status()
        assert st["last_seq"] == 3 and st["unrecovered_gaps"] == 1 and st["missing_batches"] == 1
        assert sub._thread.is_alive()
        assert any("sequence number -1" in e for e in sub.errors), sub.errors
        assert sorted(h for _, h in sub.follower.tree.blocks) == [100, 102, 103]


def test_a_replay_frame_with_a_bad_sequence_is_noted_and_the_gap_stays_open(pub):
    sock, port = pub
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def answer() -> None:   # every replay request: one frame with a 3-byte sequence, then the end marker
        while not stop.is_set():
            if router.poll(50):
                ident, _, _start = router.recv_multipart()
                router.send_multipart([ident, b"", TOPIC, b"abc", batch(999)])
                router.send_multipart([ident, b"", TOPIC, seq_bytes(-1), b""])

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with KVEventSubscriber(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{rport}",
                               replay_timeout=2.0) as sub:
            sub.start(catch_up=False)
            joined(sock, sub)
            sock.send_multipart([TOPIC, seq_bytes(3), batch(103)])       # 1 and 2 lost: a replay is asked
            sock.send_multipart([TOPIC, seq_bytes(4), batch(104)])
            assert sub.follower.wait_for(4, 5.0), sub.errors
            assert sub._thread.is_alive()
            assert any("sequence frame has 3 bytes" in e for e in sub.errors), sub.errors
            st = sub.follower.status()
            assert st["unrecovered_gaps"] == 1 and st["missing_batches"] == 2 and not st["exact"]
    finally:
        stop.set()
        t.join(2)
        router.close(0)


@pytest.mark.parametrize("endpoint", ["tcp://", "tcp://127.0.0.1", "tcp://127.0.0.1:99999", "tcp://:5557",
                                      "tcp://127.0.0.1:0"])
def test_a_tcp_endpoint_needs_a_host_and_a_port_in_range(endpoint):
    with pytest.raises(ValueError, match="needs a host and a port in 1-65535"):
        check_endpoint(endpoint, "replay endpoint")
    assert check_endpoint("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5557"


def test_a_recording_keeps_an_undecodable_batch_so_show_counts_its_gap_once(tmp_path):
    """The recorder wrote the gap but not the frame, so `show` found the gap and then a hole in the seqs:
    two gaps and twice the missing batches for one bad batch."""
    from core.kv_events.follower import StreamFollower
    from core.kv_events.recorder import Recorder, replay_recording
    with Recorder(tmp_path / "ev.bin") as rec:
        live = StreamFollower(on_frame=rec, on_gap=rec.gap)
        for seq, payload in enumerate([batch(100), b"\xc1not msgpack", batch(102, (None, 1, 2, 3)), batch(103)]):
            assert live.offer(seq, payload, TOPIC) is None
    want = live.status()
    got = replay_recording(tmp_path / "ev.bin").status()
    assert (want["gaps"], want["missing_batches"], want["last_seq"]) == (2, 2, 3)
    assert {k: got[k] for k in ("gaps", "unrecovered_gaps", "missing_batches", "batches", "last_seq")} == \
        {k: want[k] for k in ("gaps", "unrecovered_gaps", "missing_batches", "batches", "last_seq")}
