"""What `python -m core.kv_events convert` makes a request of: a store that extends an earlier request (its own
output, stored when it finished, or a chat's next turn) said and, for single-turn traffic, merged; each request in
its namespace; a NaN timestamp that hides no restart; `show` piped into `head` without a traceback."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time

from core.cache.radix_cache import RadixKey
from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.kv_events.follower import StreamFollower
from core.kv_events.protocol import AllBlocksCleared, SGLangBlockStored, SGLangKVEventBatch, encode_batch
from core.kv_events.publish_config import attach_publisher
from core.kv_events.recorder import Recorder, replay_recording
from core.kv_events.subscriber import KVEventSubscriber
from core.kv_events.trace import convert_recording
from core.lab.replay import replay
from core.lab.traces import load_trace
from tests.tiny_models import tiny_pair

PS = 4


def record_engine(path, prompts: list, max_new_tokens: int) -> int:
    """Serve `prompts` one after another on a tiny engine publishing KV events, recorded to `path`; the engine's
    own prefix hits."""
    engine = Engine(tiny_pair("llama")[1], pool_slots=4096, page_size=PS, max_prefill_tokens=64)
    pub = attach_publisher(engine, '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", '
                                   '"replay_endpoint": "tcp://127.0.0.1:0"}')
    rec = Recorder(path)
    sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint,
                            follower=StreamFollower(on_frame=rec, on_gap=rec.gap)).start()
    hits = 0
    try:
        sub.catch_up()
        assert pub.wait_for_subscribers(1, 10.0)
        for p in prompts:
            hits += len(engine.cache.match_prefix(RadixKey(p)).indices)
            engine.submit(p, SamplingParams(max_new_tokens=max_new_tokens))
            while engine.has_work():
                engine.step()
                assert sub.follower.wait_for(pub.flush(), 5.0)
    finally:
        sub.close()
        pub.close()
        rec.close()
    return hits


def test_a_request_s_output_store_is_said_and_merged_for_single_turn_traffic(tmp_path):
    """The engine stores each request twice (its prompt, then its output under it). Six prompts with no hit
    replayed as twelve requests at 40 %; merged, they are the six prompts, each with its output, at 0 %."""
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 128) for _ in range(16)] for _ in range(6)]
    assert record_engine(tmp_path / "ev.bin", prompts, max_new_tokens=9) == 0
    split = convert_recording(tmp_path / "ev.bin", tmp_path / "split.jsonl")
    merged = convert_recording(tmp_path / "ev.bin", tmp_path / "merged.jsonl", merge_extensions=True)
    assert (split["requests"], split["extensions"]) == (12, 6)
    assert (merged["requests"], merged["extensions"]) == (6, 6)
    wl = load_trace(tmp_path / "merged.jsonl")
    assert [r.prompt_ids().tolist()[:16] for r in wl.requests] == prompts
    assert all(r.prompt_len == 24 for r in wl.requests)          # the prompt and its output's whole pages
    assert replay(wl, 4000, page_size=PS).hit_tokens == 0         # as the engine: nothing was shared
    assert replay(load_trace(tmp_path / "split.jsonl"), 4000, page_size=PS).hit_rate > 0.3   # what it was
    cli = subprocess.run([sys.executable, "-m", "core.kv_events", "convert", str(tmp_path / "ev.bin"), "--out",
                          str(tmp_path / "cli.jsonl")], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "6 stores extend the last block of an earlier request" in cli.stderr
    assert split["block_sizes"] == [PS] and f"sweep this trace with --page-size {PS}," in cli.stderr
    assert "--merge-extensions appends them to the request they extend" in cli.stderr


def write(path, batches) -> None:
    with Recorder(path) as r:
        for seq, b in batches:
            r.write(seq, b"", encode_batch(b), time.time())


def stored(hashes, parent, tokens, salt=None) -> SGLangBlockStored:
    return SGLangBlockStored(hashes, parent, tokens, PS, None, cache_salt=salt)


def test_each_request_keeps_its_namespace_so_tenants_share_no_prefix(tmp_path):
    """Two tenants' equal prompts are hashed apart by the engine (their cache_salt); the trace kept only the
    tokens, and replayed them as one tenant's prefix hit."""
    same = [1, 2, 3, 4, 5, 6, 7, 8]
    batches = [(0, SGLangKVEventBatch(1000.0, [stored([11, 12], None, same, "alice")])),
               (1, SGLangKVEventBatch(1001.0, [stored([21, 22], None, same, "bob")])),
               (2, SGLangKVEventBatch(1002.0, [stored([23], 22, [9, 9, 9, 9])]))]   # bob's chain goes on, unsalted
    write(tmp_path / "ev.bin", batches)
    convert_recording(tmp_path / "ev.bin", tmp_path / "t.jsonl")
    lines = [json.loads(ln) for ln in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [ln.get("extra_key") for ln in lines] == ["salt:alice", "salt:bob", "salt:bob"]   # inherited
    wl = load_trace(tmp_path / "t.jsonl")
    assert replay(wl, 4000, page_size=PS).hit_tokens == 8         # bob's second request hits bob's prompt only


def test_a_nan_timestamp_hides_no_restart_and_leaves_the_others_their_times(tmp_path):
    """A NaN kept as the follower's last timestamp made every later comparison False: a restarted publisher's
    batches were dropped as duplicates and the old tree kept."""
    batches = [(0, SGLangKVEventBatch(math.nan, [stored([1], None, [1, 2, 3, 4])])),
               (1, SGLangKVEventBatch(1001.0, [stored([2], 1, [5, 6, 7, 8])])),
               (2, SGLangKVEventBatch(math.nan, [stored([3], 2, [9, 9, 9, 9])])),
               (0, SGLangKVEventBatch(2000.0, [AllBlocksCleared(), stored([7], None, [7, 7, 7, 7])])),   # restart
               (1, SGLangKVEventBatch(2001.0, [stored([8], 7, [8, 8, 8, 8])]))]
    write(tmp_path / "ev.bin", batches)
    f = replay_recording(tmp_path / "ev.bin")
    assert f.duplicates == 0 and f.tree.stats()["blocks"] == 2
    assert any("restart" in g.reason for g in f.gaps)
    convert_recording(tmp_path / "ev.bin", tmp_path / "t.jsonl")
    stamps = [json.loads(ln)["timestamp"] for ln in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert stamps[0] is None and stamps[1] == 0.0 and stamps[-1] == 1_000_000.0   # from the first finite one


def test_show_piped_into_head_ends_without_a_traceback(tmp_path):
    # every other seq missing: thousands of gaps, a report far larger than what a pipe holds
    write(tmp_path / "ev.bin", [(2 * i, SGLangKVEventBatch(1000.0 + i, [stored([i + 1], None, [i] * 4)]))
                                for i in range(3000)])
    run = subprocess.run(f"{sys.executable} -m core.kv_events show {tmp_path / 'ev.bin'} | head -2", shell=True,
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.count("\n") == 2 and "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr
