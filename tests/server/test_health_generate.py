"""SGLang's /health_generate on a tiny random model: a one-token probe when idle, the engine's steps when busy,
no key, one probe a second (a minute while the engine is idle), uncounted."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from core.server.app import ServerSettings
from tests.server.conftest import serving, tiny_factory, wait_until
from tests.server.test_native_generate import PROMPT, generate


def test_health_generate_generates_when_idle_and_refuses_in_step_mode(tiny):
    e = tiny.engine
    assert httpx.get(f"{tiny.url}/health_generate", timeout=30).status_code == 200
    probe = e.snapshot().requests[-1]       # its one-token probe ran: the prompt [0], one greedy token
    assert (probe.rid[:7], probe.prompt_tokens, probe.output_tokens, probe.state) == ("health-", 1, 1, "finished")
    e.stop()
    try:
        r = httpx.get(f"{tiny.url}/health_generate", timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
    finally:
        e.start()


def test_health_generate_on_a_busy_engine_answers_from_its_progress(tiny_runner):
    """Busy, the check sends no probe: the engine's progress answers it (SGLang's rule). Sixteen samples that may
    run one at a time (max_request_share=1) keep the engine busy for seconds."""
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 1024},
                 settings=ServerSettings(model="tiny", max_request_share=1)) as s:
        busy: list[httpx.Response] = []
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "n": 16}}
        t = threading.Thread(target=lambda: busy.append(httpx.post(f"{s.url}/generate", json=body, timeout=120)))
        t.start()
        wait_until(lambda: s.host.inflight, what="the samples to reach the engine")
        assert httpx.get(f"{s.url}/health_generate", timeout=30).status_code == 200
        assert httpx.post(f"{s.url}/abort_request", json={"abort_all": True}).json()["aborted"] >= 1
        t.join(60)
        reasons = [o["meta_info"]["finish_reason"]["type"] for o in busy[0].json()]
        # every sample not finished by then ends: the running one and the fifteen not submitted yet
        assert busy[0].status_code == 200 and len(reasons) == 16 and reasons.count("abort") >= 15
        assert all(not r.rid.startswith("health-") for r in s.engine.snapshot().requests)
        s.engine.check_invariants()


def test_health_checks_in_a_burst_run_one_probe(tiny):
    def probes() -> int:
        return sum(r.rid.startswith("health-") for r in tiny.engine.snapshot().requests)

    before = probes()
    with ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(lambda _: httpx.get(f"{tiny.url}/health_generate", timeout=30).status_code, range(8)))
    assert codes == [200] * 8 and probes() == before + 1


def test_health_generate_sees_a_hung_engine_even_while_requests_keep_arriving(tiny, monkeypatch):
    """Submissions change the engine's version but not its step count: only steps prove it generates."""
    import core.server.native_routes as native_routes
    monkeypatch.setattr(native_routes, "HEALTH_TIMEOUT_S", 1.5)
    stuck, release = threading.Event(), threading.Event()
    forward = tiny.engine.runner.forward

    def hung(*args, **kwargs):
        stuck.set()
        release.wait(30)
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny.engine.runner, "forward", hung)
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    senders = [threading.Thread(target=lambda: httpx.post(f"{tiny.url}/generate", json=body, timeout=60))
               for _ in range(4)]
    try:
        senders[0].start()
        assert stuck.wait(10)
        for t in senders[1:]:             # traffic while the check waits
            t.start()
        r = httpx.get(f"{tiny.url}/health_generate", timeout=30)
        assert r.status_code == 503 and r.json()["status"] == "unhealthy"
    finally:
        release.set()
        for t in senders:
            t.join(60)
    monkeypatch.setattr(native_routes, "HEALTH_REUSE_S", 0.0)
    assert httpx.get(f"{tiny.url}/health_generate", timeout=30).status_code == 200


def test_the_probe_is_not_counted_and_an_idle_engine_is_probed_once_until_it_steps(tiny, monkeypatch):
    import core.server.native_routes as native_routes
    monkeypatch.setattr(native_routes, "HEALTH_REUSE_S", 0.0)

    def probes() -> int:
        return sum(r.rid.startswith("health-") for r in tiny.engine.snapshot().requests)

    def counted() -> str:
        return [ln for ln in httpx.get(f"{tiny.url}/metrics").text.splitlines()
                if ln.startswith("sglang:num_requests_total")][0]

    before = counted()
    for _ in range(3):
        assert httpx.get(f"{tiny.url}/health_generate", timeout=30).status_code == 200
    assert probes() == 1 and counted() == before and not [o for o in tiny.host.owners if o.startswith("health-")]
    generate(tiny, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})     # the engine stepped
    assert httpx.get(f"{tiny.url}/health_generate", timeout=30).status_code == 200 and probes() == 2
