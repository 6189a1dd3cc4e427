"""`/metrics` in Prometheus' text format, under SGLang's metric names.

Counters are counted by the server as each request completes and never go down (not on
/flush_cache, not on a rebuild), so `rate(sglang:cached_tokens_total[5m]) /
rate(sglang:prompt_tokens_total[5m])` is the true hit rate over any window; the
`sglang:cache_hit_rate` gauge (the engine's last 20 admissions) is for a glance only.
Every counter is there from the start, at 0, so an idle replica's scrape has the same series as a
busy one's. Gauges are read from the gauges the engine publishes at the end of each step
(`Engine.gauges()`): no lock is taken, so a scrape never waits behind a step and never reads an old
view while the engine is busy.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from core.engine.request import Completion

if TYPE_CHECKING:
    from core.engine.engine import Engine

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class EvictionTally:
    """Evicted tokens and evictions (leaves removed), monotonic across cache resets and engine rebuilds.

    The cache's own counters restart at 0 on reset; the server calls `sync` before every reset or rebuild
    it performs and on every scrape, and keeps what was counted so far. (Evictions were counted from the
    event log, whose oldest events drop out: 15 % of them went uncounted between two scrapes of a busy pool.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base = (0, 0)
        self._last = (0, 0)
        self._engine_id = None

    def sync(self, engine: "Engine") -> tuple[int, int]:
        with self._lock:
            now = (int(engine.cache.evicted_tokens), int(engine.cache.evicted_nodes))
            # another engine, or a reset behind our back: what we had counted stays counted
            if id(engine) != self._engine_id or now[0] < self._last[0] or now[1] < self._last[1]:
                self._base = (self._base[0] + self._last[0], self._base[1] + self._last[1])
                self._engine_id = id(engine)
            self._last = now
            return self._base[0] + now[0], self._base[1] + now[1]


class ServerMetrics:
    def __init__(self, host) -> None:
        self.host = host
        r = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens of finished requests", lab, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generated tokens", lab, registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens", "Prompt tokens served from the radix cache",
                                     lab, registry=r)
        self.num_requests = Counter("sglang:num_requests", "Finished requests (aborted ones included)",
                                    lab, registry=r)
        self.aborted = Counter("radix:aborted_requests", "Requests aborted (client disconnect, abort call)",
                               lab, registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Submit to first token", lab,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds",
                             "Time between output tokens (each request's mean, once per interval)", lab,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Submit to finish", lab,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.evictions = EvictionTally()
        r.register(_EngineCollector(self))
        name = host.served_model_name
        for metric in (self.prompt_tokens, self.generation_tokens, self.cached_tokens, self.num_requests,
                       self.aborted, self.ttft, self.itl, self.e2e):
            metric.labels(name)       # present at 0 before the first request

    def on_finish(self, c: Completion) -> None:
        name = self.host.served_model_name
        n = len(c.token_ids)
        self.prompt_tokens.labels(name).inc(c.prompt_tokens)
        self.generation_tokens.labels(name).inc(n)
        self.cached_tokens.labels(name).inc(c.cached_tokens)
        self.num_requests.labels(name).inc()
        if c.finish_reason == "abort":
            self.aborted.labels(name).inc()
        if c.ttft is not None:
            self.ttft.labels(name).observe(c.ttft)
            if n > 1:
                gap = max(0.0, c.total_time - c.ttft) / (n - 1)
                h = self.itl.labels(name)
                for _ in range(n - 1):
                    h.observe(gap)
        self.e2e.labels(name).observe(c.total_time)

    def sync_evictions(self) -> tuple[int, int]:
        return self.evictions.sync(self.host.engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Gauges (from the engine's published gauges) and the eviction counters, when Prometheus scrapes."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self):
        host = self.metrics.host
        name = host.served_model_name
        g = host.engine.gauges()
        tokens, evictions = self.metrics.sync_evictions()
        for metric, doc, value in (
                ("sglang:num_running_reqs", "Requests in the running batch", g.running),
                ("sglang:num_queue_reqs", "Requests waiting to be admitted", g.waiting),
                ("sglang:token_usage", "Share of KV slots not free (tree + running requests)", g.token_usage),
                ("sglang:cache_hit_rate", "Hit rate of the last 20 admissions (use the counters' rate() "
                                          "for the true rate)", g.hit_rate_recent)):
            g = GaugeMetricFamily(metric, doc, labels=["model_name"])
            g.add_metric([name], float(value))
            yield g
        for metric, doc, value in (("radix:evicted_tokens", "Tokens evicted from the radix tree", tokens),
                                   ("radix:evictions", "Leaves evicted from the radix tree", evictions)):
            c = CounterMetricFamily(metric, doc, labels=["model_name"])
            c.add_metric([name], float(value))
            yield c
