"""`--kv-events-config`: the server publishes its radix cache as SGLang's KV events, through rebuilds."""
from __future__ import annotations

import subprocess
import sys

import httpx

from core.kv_events.subscriber import KVEventSubscriber
from core.server.app import ServerSettings
from tests.kv_events.helpers import radix_hashes, radix_prefixes, tree_hashes
from tests.server.conftest import serving, tiny_factory

CONFIG = '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0"}'


def follow_until_equal(host, sub) -> None:
    """Publish what the cache did so far and wait until the subscriber's tree is the engine's."""
    seq = host.kv_publisher.flush()
    assert sub.follower.wait_for(seq, 10.0), sub.follower.status()
    snap = host.engine.snapshot().cache
    with sub.follower.lock:
        assert sub.follower.tree.prefixes() == radix_prefixes(snap)
        assert tree_hashes(sub.follower.tree) == radix_hashes(snap)


def test_the_server_publishes_its_tree_and_follows_a_rebuild(tiny_runner):
    settings = ServerSettings(model="tiny", kv_events_config=CONFIG)
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 128},
                 settings=settings) as s:
        info = httpx.get(s.url + "/server_info").json()["kv_events"]
        assert info["endpoint"].startswith("tcp://127.0.0.1:") and info["block_size"] == 1
        sub = KVEventSubscriber(info["endpoint"], replay_endpoint=info["replay_endpoint"]).start()
        try:
            client = s.client()
            shared = list(range(10, 40))
            for tail in ([41, 42, 43], [51, 52], [61]):
                r = client.completions.create(model="tiny", prompt=shared + tail, max_tokens=3, temperature=0)
            assert r.usage.prompt_tokens_details.cached_tokens == 30
            follow_until_equal(s.host, sub)
            with sub.follower.lock:
                assert len(sub.follower.tree.prefixes()) >= 30
        finally:
            sub.close()
        # a rebuild closes the old publisher (its ports) and publishes the new, empty cache
        old = s.host.kv_publisher
        assert httpx.post(s.url + "/state/rebuild", json={"model": "tiny", "pool_slots": 64}).status_code == 200
        assert s.host.kv_publisher is not old and s.host.kv_publisher.endpoint != old.endpoint
        info = httpx.get(s.url + "/server_info").json()["kv_events"]
        sub = KVEventSubscriber(info["endpoint"], replay_endpoint=info["replay_endpoint"]).start()
        try:
            s.client().completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=2, temperature=0)
            follow_until_equal(s.host, sub)
        finally:
            sub.close()


def test_a_bad_config_is_one_line_before_the_model_loads():
    out = subprocess.run([sys.executable, "-m", "core.server", "--kv-events-config", '{"publisher": "kafka"}'],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown publisher 'kafka'" in out.stderr and "Traceback" not in out.stderr


def test_a_server_publishing_on_every_interface_warns_what_it_publishes(tiny_runner, capfd):
    config = '{"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://127.0.0.1:0"}'
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 64},
                 settings=ServerSettings(model="tiny", kv_events_config=config)):
        pass
    err = capfd.readouterr().err
    assert "warning: KV events bind tcp://*:0 (every interface)" in err and "token ids" in err
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 64},
                 settings=ServerSettings(model="tiny", kv_events_config=CONFIG)):
        pass
    assert "warning" not in capfd.readouterr().err           # loopback: nothing to warn about
