"""Issue 26, item 5: a web page cannot reach the server from a browser. A foreign Origin or Host is
refused, a state change needs a JSON POST (a page cannot send one cross-site without a preflight this
server never grants), and GET never changes state."""
from __future__ import annotations

import httpx
import pytest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from core.server.browser_guard import HostPolicy
from tests.server.conftest import serving

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]


def test_a_foreign_origin_cannot_change_step_mode_or_flush_the_cache(tiny):
    url, e = tiny.url, tiny.engine
    tiny.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
    held = e.allocator.num_slots - e.allocator.available()
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1", f"https{url[4:]}"):
        headers = {"Origin": origin, "Content-Type": "application/json"}
        r = httpx.post(url + "/state/step_mode", headers=headers, json={"on": True})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin
        assert httpx.post(url + "/flush_cache", headers=headers).status_code == 403
        assert httpx.post(url + "/v1/completions", headers=headers,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2}).status_code == 403
    assert e.running and e.allocator.num_slots - e.allocator.available() == held    # nothing changed
    same = httpx.post(url + "/state/step_mode", headers={"Origin": url}, json={"on": False})
    assert same.status_code == 200      # the server's own origin may


def test_a_text_plain_post_is_415_and_changes_nothing(tiny):
    # the audit's cross-site request: a "simple" text/plain POST, which a page may send without asking
    r = httpx.post(tiny.url + "/state/step_mode", content=b'{"on": true}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = httpx.post(tiny.url + "/state/step_mode", content=b"on=true",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and tiny.engine.running
    ok = httpx.post(tiny.url + "/state/step_mode", content=b'{"on": false}',
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_get_never_changes_state_flush_cache_is_405_with_allow(tiny):
    tiny.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
    before = tiny.engine.snapshot().cache.total_size
    r = httpx.get(tiny.url + "/flush_cache")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert tiny.engine.snapshot().cache.total_size == before > 0
    r = httpx.delete(tiny.url + "/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:30000", "attacker.test", "10.0.0.1"])
def test_a_foreign_host_header_is_refused_so_dns_rebinding_reads_nothing(tiny, host):
    r = httpx.get(tiny.url + "/state/snapshot", headers={"Host": host})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert "--allowed-hosts" in r.json()["error"]["message"]
    for ok in ("localhost", "127.0.0.1", f"127.0.0.1:{tiny.url.rsplit(':', 1)[1]}", "[::1]:80", "LOCALHOST"):
        assert httpx.get(tiny.url + "/v1/models", headers={"Host": ok}).status_code == 200, ok


def test_allowed_hosts_and_origins_are_configurable(tiny_runner):
    settings = ServerSettings(model="tiny", allowed_hosts=["gpu-box.lan"], allowed_origins=["https://ui.lan"])
    with serving(Engine(tiny_runner, pool_slots=64), settings=settings) as s:
        assert httpx.get(s.url + "/v1/models", headers={"Host": "gpu-box.lan:30000"}).status_code == 200
        assert httpx.get(s.url + "/v1/models", headers={"Host": "other.lan"}).status_code == 403
        assert httpx.post(s.url + "/flush_cache", headers={"Origin": "https://ui.lan"}).status_code == 200
        assert httpx.post(s.url + "/flush_cache", headers={"Origin": "https://other.lan"}).status_code == 403


def test_a_wildcard_bind_answers_ip_literals_and_this_machines_names_but_no_other_name():
    p = HostPolicy("0.0.0.0")
    assert p.host_ok("192.168.1.20:30000") and p.host_ok("[fe80::1]:30000") and p.host_ok("localhost")
    assert not p.host_ok("evil.example") and not p.host_ok("evil.example:30000")
    loop = HostPolicy("127.0.0.1")
    assert loop.host_ok("127.0.0.1:1") and loop.host_ok("[::1]") and not loop.host_ok("192.168.1.20")
    assert HostPolicy("127.0.0.1", ["*"]).host_ok("anything.example")
