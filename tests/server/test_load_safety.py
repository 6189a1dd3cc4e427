"""Issue 26, items 1 and 2, on the real default model (SmolLM2-135M): an oversized prompt costs the event loop
nothing (/health answers within 1 s, the 400 comes within 2 s, a small request still runs), and the /metrics
gauges read the engine's true state under load (sglang:num_running_reqs at concurrency 16)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.engine.engine import Engine
from core.server.app import ServerSettings
from tests.server.conftest import serving, wait_until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def real(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=4096, max_running_requests=16),
                 settings=ServerSettings(model="default")) as s:
        yield s


class HealthProbe:
    """Polls /health every 50 ms in a thread; `worst` is the slowest answer (a timeout counts as its limit)."""

    def __init__(self, url: str) -> None:
        self.url, self.times, self.stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    ok = c.get(self.url + "/health").status_code == 200
                except httpx.TimeoutException:
                    ok = False
                self.times.append(time.perf_counter() - start if ok else 5.0)
                time.sleep(0.05)

    def __enter__(self) -> "HealthProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)

    @property
    def worst(self) -> float:
        return max(self.times)


def post_prompt(url: str, prompt: str, **params) -> tuple[int, dict, float]:
    start = time.perf_counter()
    r = httpx.post(url + "/v1/completions", timeout=60, json={"model": "default", "prompt": prompt, "max_tokens": 2,
                                                              **params})
    return r.status_code, r.json(), time.perf_counter() - start


def test_an_8mb_prompt_is_400_within_seconds_and_health_keeps_answering_throughout(real):
    """The 8 MB body is refused unread (its length alone cannot fit the pool), so it costs what parsing JSON
    costs, not a tokenizer's minutes. The limits leave room for a CI box whose other worker is busy: JSON
    parsing holds the GIL for tens of milliseconds a body, on client and server alike."""
    big = "The capital of France is Paris. " * 250_000          # 8,000,000 characters
    with HealthProbe(real.url) as probe:
        time.sleep(0.3)
        status, body, took = post_prompt(real.url, big)
        assert status == 400 and body["error"]["param"] == "prompt" and took < 3.0, (status, took)
        with ThreadPoolExecutor(4) as pool:                       # three at once, and a small request among them
            bigs = [pool.submit(post_prompt, real.url, big) for _ in range(3)]
            small = pool.submit(post_prompt, real.url, "The capital of France is", temperature=0)
            results = [f.result() for f in bigs]
            small_status, small_body, small_took = small.result()
        time.sleep(0.3)
    assert [s for s, _, _ in results] == [400, 400, 400] and max(t for _, _, t in results) < 5.0
    assert small_status == 200 and small_body["usage"]["completion_tokens"] == 2
    assert len(probe.times) >= 5 and probe.worst < 2.0, sorted(probe.times)[-3:]
    assert not real.host.inflight and real.host.reserved == 0


def test_a_large_prompt_is_tokenized_off_the_event_loop(real):
    """Under the refuse-unread limit (1.3 M characters for this pool) a prompt is tokenized, on a worker
    thread: the loop keeps answering while the tokenizer works, then the 400 names the prompt."""
    limit = real.host.char_limit(real.engine)
    text = "Why is the sky blue? " * (limit // 22)
    with HealthProbe(real.url) as probe:
        time.sleep(0.3)
        status, body, _ = post_prompt(real.url, text)
        time.sleep(0.3)
    assert status == 400 and "does not fit a pool of 4,096 slots" in body["error"]["message"]
    assert probe.worst < 1.0, sorted(probe.times)[-3:]


def running_gauge(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sglang:num_running_reqs":
                return s.value
    raise AssertionError("no sglang:num_running_reqs")


def test_num_running_reqs_reads_the_true_count_at_concurrency_16(real):
    e = real.engine

    def one(i: int) -> int:
        r = httpx.post(real.url + "/v1/completions", timeout=300,
                       json={"model": "default", "prompt": f"Count slowly from {i} to one hundred:", "max_tokens": 64,
                             "temperature": 0, "ignore_eos": True})
        return r.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, i) for i in range(16)]
        wait_until(lambda: len(e.scheduler.running) == 16, timeout=120, what="all 16 to be admitted")
        admitted_at = e.step_count
        wait_until(lambda: e.step_count > admitted_at, timeout=60, what="a step with all 16 running")
        reads = []
        for _ in range(6):
            reads.append(running_gauge(real.url))
            # still all 16 running after this scrape: none had finished, so 16 is the true count
            assert len(e.scheduler.running) == 16 and len(real.host.inflight) == 16
        assert [f.result() for f in futures] == [64] * 16
    assert reads == [16.0] * 6
    wait_until(lambda: running_gauge(real.url) == 0.0, what="the gauge to fall back to 0")
