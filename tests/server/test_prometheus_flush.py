"""/metrics parsed with prometheus_client's own parser; /flush_cache idle and busy."""
from __future__ import annotations

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from core.engine.engine import Engine
from core.server.app import ServerSettings
from core.server.host import QUIET_GRACE_S
from tests.server.conftest import serving, wait_until


def scrape(url: str) -> dict[str, float]:
    """sample name -> value, for the model_name label's series (histogram buckets left out)."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in fam.samples:
            if not s.name.endswith("_bucket") and not s.name.endswith("_created"):
                out[s.name] = s.value
    return out


def test_counters_equal_what_was_sent_and_survive_a_flush(tiny_runner):
    # 40 slots: the fourth distinct prompt has to evict
    with serving(Engine(tiny_runner, pool_slots=40), settings=ServerSettings(model="tiny")) as s:
        c = s.client()
        sent = [([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), ([20, 21, 22, 23], 5),
                ([30] * 12, 6), ([40 + i for i in range(14)], 2), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 1)]
        usage = [c.completions.create(model="tiny", prompt=p, max_tokens=n, temperature=0).usage for p, n in sent]
        m = scrape(s.url)
        assert m["sglang:prompt_tokens_total"] == sum(len(p) for p, _ in sent) == sum(u.prompt_tokens for u in usage)
        assert m["sglang:generation_tokens_total"] == sum(n for _, n in sent)
        cached = sum(u.prompt_tokens_details.cached_tokens for u in usage)
        assert cached > 0 and m["sglang:cached_tokens_total"] == cached
        assert m["sglang:num_requests_total"] == len(sent)
        for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
            assert m[f"sglang:{h}_count"] == len(sent)
        assert m["sglang:inter_token_latency_seconds_count"] == sum(n - 1 for _, n in sent)
        assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0
        e = s.engine
        assert m["sglang:token_usage"] == (e.allocator.num_slots - e.allocator.available()) / e.allocator.num_slots
        assert e.cache.evicted_tokens > 0 and m["radix:evicted_tokens_total"] == e.cache.evicted_tokens
        evictions = sum(1 for ev in e.events_since(0) if ev.kind == "evict")
        assert evictions > 0 and m["radix:evictions_total"] == evictions
        before = m
        assert httpx.post(f"{s.url}/flush_cache").status_code == 200
        c.completions.create(model="tiny", prompt=[20, 21, 22, 23], max_tokens=2, temperature=0)
        after = scrape(s.url)
        assert after["sglang:cached_tokens_total"] == before["sglang:cached_tokens_total"]   # flushed: a miss
        assert after["sglang:prompt_tokens_total"] == before["sglang:prompt_tokens_total"] + 4
        assert after["radix:evicted_tokens_total"] == before["radix:evicted_tokens_total"]   # never goes down
        assert after["sglang:num_requests_total"] == len(sent) + 1


def test_evictions_count_every_leaf_even_when_the_event_log_drops_them_between_scrapes(tiny_runner, monkeypatch):
    """The event log keeps only its newest events; the count comes from the cache's own counter (read from
    the log, 15 % of a busy pool's evictions went uncounted)."""
    e = Engine(tiny_runner, pool_slots=40, event_capacity=20)
    appended = []
    real = e.cache.events.append

    def spy(kind, *args, **kwargs):      # the true count: every evict event ever appended
        appended.append(kind.kind)
        return real(kind, *args, **kwargs)

    monkeypatch.setattr(e.cache.events, "append", spy)
    with serving(e, settings=ServerSettings(model="tiny")) as s:
        c = s.client()
        for i in range(30):
            c.completions.create(model="tiny", prompt=[(i * 9 + k) % 120 + 1 for k in range(9)], max_tokens=3,
                                 temperature=0)
            if i == 5:
                scrape(s.url)
        evictions = appended.count("evict")
        assert evictions > 20 > sum(1 for ev in e.events_since(0) if ev.kind == "evict")
        assert scrape(s.url)["radix:evictions_total"] == evictions


def test_flush_cache_when_idle_empties_everything_and_refuses_while_busy(tiny):
    c = tiny.client()
    c.completions.create(model="tiny", prompt=[9, 8, 7, 6, 5], max_tokens=3, temperature=0)
    e = tiny.engine
    assert e.allocator.available() < e.allocator.num_slots
    e.stop()   # step mode: the next request stays in flight
    rid = httpx.post(f"{tiny.url}/state/requests", json={"prompt": [9, 8, 7, 6, 5, 4],
                                                         "params": {"max_new_tokens": 3}}).json()["rid"]
    e.step()   # admitted: it holds slots and locks its prefix
    r = httpx.post(f"{tiny.url}/flush_cache")
    assert r.status_code == 409 and "in flight" in r.json()["error"]["message"]
    assert e.snapshot().metrics["running"] == 1   # refused, and nothing was lost
    while e.step():
        pass
    wait_until(lambda: not tiny.host.inflight, what="the request to finish")
    assert e.snapshot().requests[-1].rid == rid and e.snapshot().requests[-1].state == "finished"
    e.start()
    r = httpx.post(f"{tiny.url}/flush_cache")
    assert r.status_code == 200
    snap = e.snapshot()
    assert e.allocator.available() == e.allocator.num_slots and len(snap.cache.nodes) == 1
    assert snap.cache.total_size == 0
    e.check_invariants()
    again = c.completions.create(model="tiny", prompt=[9, 8, 7, 6, 5], max_tokens=3, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == 0


def test_a_flush_right_after_an_answer_waits_for_its_queue_position_to_come_back(tiny):
    """A client had its answer a moment before the route gave its queue position back; a flush sent at once was
    refused with 409 "1 request(s) are in flight". It now waits up to QUIET_GRACE_S for that, and no longer."""
    tiny.host.reserve(1)           # the position a finished request's route has not given back yet
    later = threading.Timer(0.5, tiny.host.release, args=(1,))
    later.start()
    try:
        t0 = time.monotonic()
        r = httpx.post(f"{tiny.url}/flush_cache")
        assert r.status_code == 200 and 0.4 < time.monotonic() - t0 < QUIET_GRACE_S
    finally:
        later.join()
    tiny.host.reserve(1)           # one that stays: refused after the grace
    try:
        r = httpx.post(f"{tiny.url}/flush_cache")
        assert r.status_code == 409 and "1 request(s) are in flight" in r.json()["error"]["message"]
    finally:
        tiny.host.release(1)
