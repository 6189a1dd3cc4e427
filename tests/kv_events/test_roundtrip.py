"""Our engine publishes, a subscriber rebuilds: the block tree equals the engine's radix tree at
every step of a random workload (page sizes 1 and 16; SGLang's default and dynamo formats, salted
requests included), through evictions and a flush."""
from __future__ import annotations

import random

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.kv_events.publish_config import attach_publisher
from core.kv_events.subscriber import KVEventSubscriber
from tests.kv_events.helpers import radix_hashes, radix_prefixes, tree_hashes
from tests.tiny_models import tiny_pair


@pytest.fixture(scope="module")
def runner():
    return tiny_pair("llama")[1]


def _prompt(rng: random.Random, stems: list, unit: int) -> list:
    stem = rng.choice(stems)
    return stem + [rng.randrange(1, 128) for _ in range(rng.randrange(1, 3 * unit + 3))]


@pytest.mark.parametrize("page_size,fmt", [(1, "default"), (16, "dynamo")])
def test_rebuilt_tree_equals_radix_tree_every_step(runner, page_size, fmt):
    rng = random.Random(page_size)
    unit = max(page_size, 4)
    pool = 8 * unit   # small: the workload must evict
    engine = Engine(runner, pool_slots=pool, page_size=page_size, max_prefill_tokens=64, max_running_requests=3)
    pub = attach_publisher(engine, '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", '
                                   f'"replay_endpoint": "tcp://127.0.0.1:0", "format": "{fmt}"}}')
    assert pub.flush() == 0   # batch 0 (AllBlocksCleared) is out before anyone listens: the subscriber catches up on it
    sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
    try:
        catch_up = sub.catch_up()
        assert pub.wait_for_subscribers(1, 10.0)   # from here every batch reaches the SUB live
        stems = [[rng.randrange(1, 128) for _ in range(n)] for n in (unit, 2 * unit, 3 * unit + 1)]
        steps = evicted_steps = 0
        flushed = False
        for round_ in range(8):
            for _ in range(rng.randrange(1, 4)):
                engine.submit(_prompt(rng, stems, unit), SamplingParams(max_new_tokens=rng.randrange(1, 3)),
                              extra_key=rng.choice([None, None, None, "tenant-b"]))
            while engine.has_work():
                before = engine.cache.evicted_tokens
                engine.step()
                steps += 1
                evicted_steps += engine.cache.evicted_tokens > before
                seq = pub.flush()
                assert sub.follower.wait_for(seq, 5.0), sub.follower.status()
                snap = engine.snapshot().cache
                with sub.follower.lock:
                    tree = sub.follower.tree
                    assert tree.prefixes() == radix_prefixes(snap), f"step {steps}"
                    assert tree_hashes(tree) == radix_hashes(snap, "sglang", fmt), f"step {steps}"
                    assert not tree.orphans
            if round_ == 4:
                engine.reset_cache()   # flush_cache: AllBlocksCleared
                flushed = True
                seq = pub.flush()
                assert sub.follower.wait_for(seq, 5.0)
                assert not sub.follower.tree.blocks and not radix_prefixes(engine.snapshot().cache)
        st = sub.follower.status()
        print("steps", steps, "evicting steps", evicted_steps)
        assert flushed and evicted_steps >= 3, (evicted_steps, steps)
        # the one gap is the catch-up on batch 0; every later batch came live, once
        assert [(g.start, g.end, g.reason, g.recovered) for g in sub.follower.gaps] == [(0, 0, "joined late", True)]
        assert sub.follower.gaps == [catch_up]
        assert st["exact"] and st["batches"] == pub.last_seq + 1 and st["duplicates"] == 0
        assert list(sub.follower.arrivals) == [(0, "replay")] + [(s, "live") for s in range(1, pub.last_seq + 1)]
        assert sub.follower.tree.clears == 2       # the publisher's first batch, then the flush
        assert sub.follower.tree.removed_total > 0 and sub.follower.tree.unknown_removals == 0
        assert pub.errors == [] and sub.errors == []
    finally:
        sub.close()
        pub.close()


def test_engine_thread_and_client_threads_with_vllm_hashes(runner):
    """The engine runs its own loop while four threads submit; the publisher thread follows, and once
    everything is done the rebuilt tree (vLLM-style bytes hashes) equals the radix tree."""
    import threading
    engine = Engine(runner, pool_slots=96, page_size=4, max_prefill_tokens=64, max_running_requests=4)
    pub = attach_publisher(engine, '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", '
                                   '"replay_endpoint": "tcp://127.0.0.1:0", "hash": "vllm"}')
    assert pub.flush() == 0
    sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
    try:
        catch_up = sub.catch_up()
        assert pub.wait_for_subscribers(1, 10.0)
        engine.start()
        stem = list(range(10, 22))
        def client(k: int) -> None:
            rng = random.Random(k)
            for _ in range(4):
                h = engine.submit(stem + [rng.randrange(1, 128) for _ in range(rng.randrange(1, 14))],
                                  SamplingParams(max_new_tokens=2))
                h.result(120)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads)
        seq = pub.flush()
        assert sub.follower.wait_for(seq, 5.0)
        snap = engine.snapshot().cache
        with sub.follower.lock:
            tree = sub.follower.tree
            assert tree.prefixes() == radix_prefixes(snap)
            assert tree_hashes(tree) == radix_hashes(snap, "vllm")
            assert all(isinstance(k[1], bytes) and len(k[1]) == 32 for k in tree.blocks)
        # batch 0 by the catch-up, every later one live and once, however the threads interleaved
        f = sub.follower
        assert f.gaps == [catch_up] and (catch_up.end, catch_up.recovered) == (0, True)
        assert pub.errors == [] and sub.errors == [] and f.batches == pub.last_seq + 1 and f.duplicates == 0
        assert list(f.arrivals) == [(0, "replay")] + [(s, "live") for s in range(1, pub.last_seq + 1)]
        assert engine.cache.evicted_tokens > 0      # 96 slots: the 16 prompts evicted each other
    finally:
        engine.stop()
        sub.close()
        pub.close()
