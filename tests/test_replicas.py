"""Two engine servers behind the real sglang-router (`python -m core.replicas`), one endpoint.

cache_aware: a group's repeated prompts go where its first prompt went, and that replica's own
/metrics counters show the hits. round_robin (a second router over the same two servers):
requests alternate, and a replica hits only on its own second sight of the prompt.
"""
from __future__ import annotations

import json
import signal
import random
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from core.server import http_probe

SYSTEM = ("You are a patient tutor who explains computer science to first-year students. Answer in two "
          "short sentences, give one concrete example, and never use jargon without defining it. ")


def free_base(n: int) -> int:
    """A port p such that p .. p+n-1 are all free on 127.0.0.1, below the ephemeral range: the servers bind them
    seconds later, after the model loads, and a port in that range may meanwhile be the local end of any client
    connection on the box (the other test worker's, or one in TIME_WAIT), which fails the bind."""
    low, _ = ephemeral_range()
    top = min(low, 65535) - n
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(max(1024, top - 12000), top)
        if all(bindable(p) for p in range(base, base + n)):
            return base
    raise RuntimeError("no run of free ports")


def ephemeral_range() -> tuple[int, int]:
    """Linux's range of local ports for outgoing connections (its default where the file is missing)."""
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def counters(worker: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(get(worker + "/metrics")):
        for s in fam.samples:
            if s.name in ("sglang:num_requests_total", "sglang:cached_tokens_total", "sglang:prompt_tokens_total"):
                out[s.name.split(":")[1]] = s.value
    return {k: out.get(k, 0.0) for k in ("num_requests_total", "cached_tokens_total", "prompt_tokens_total")}


def wait_for(url: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        if http_probe.answers(url):
            return
        time.sleep(0.3)
    raise TimeoutError(url)


def start_round_robin(workers: list[str], log) -> tuple[subprocess.Popen, int]:
    """A round-robin sglang-router over `workers`, answering /health, and its port. Its two ports are picked
    now, not with the cluster's; a start that still dies (a port taken between the pick and the router's
    bind) is retried on fresh ports."""
    for _ in range(3):
        port = free_base(2)
        rr = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                               "--port", str(port), "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
                               "--prometheus-port", str(port + 1), "--worker-urls", *workers],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(f"http://127.0.0.1:{port}/health", rr, 60)
            return rr, port
        except AssertionError:   # it exited: try fresh ports
            continue
        except TimeoutError:
            rr.kill()
            rr.wait(30)
            raise
    raise RuntimeError(f"the round-robin router exited {rr.returncode} on three sets of free ports")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = free_base(4)      # router, 2 servers, the router's metrics
    logs = tmp_path_factory.mktemp("replicas")
    proc = subprocess.Popen([sys.executable, "-m", "core.replicas", "--replicas", "2", "--port", str(base),
                             "--policy", "cache_aware", "--log-dir", str(logs), "--",
                             "--pool-slots", "2048", "--max-running-requests", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()          # printed once the router lists both workers as healthy
        assert "2 replica(s) behind sglang-router" in line, line + proc.stdout.read()
        yield {"base": base, "proc": proc, "logs": logs,
               "workers": [f"http://127.0.0.1:{base + 1}", f"http://127.0.0.1:{base + 2}"]}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def ask(base: int, prompts: list[str]) -> list:
    client = OpenAI(base_url=f"http://127.0.0.1:{base}/v1", api_key="unused", max_retries=0, timeout=120)
    return [client.completions.create(model="default", prompt=p, max_tokens=4, temperature=0) for p in prompts]


def router_order(base: int) -> list[str]:
    return [w["url"] for w in json.loads(get(f"http://127.0.0.1:{base}/workers"))["workers"]]


def test_cache_aware_sends_a_group_to_the_replica_that_cached_it(cluster):
    base, workers = cluster["base"], cluster["workers"]
    assert sorted(router_order(base)) == workers
    before = {w: counters(w) for w in workers}
    prompts = [SYSTEM + f"Question {i}: what is a {topic}?" for i, topic in enumerate(["stack", "queue", "heap"])]
    res = ask(base, prompts)
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in res]
    after = {w: counters(w) for w in workers}
    got = {w: after[w]["num_requests_total"] - before[w]["num_requests_total"] for w in workers}
    # one request at a time: every load is 0, the first prompt goes to the router's first worker,
    # the next two match it (> 30 % of their characters) and follow
    first = router_order(base)[0]
    assert got[first] == 3 and sum(got.values()) == 3
    assert cached[0] == 0 and min(cached[1:]) >= 35
    assert after[first]["cached_tokens_total"] - before[first]["cached_tokens_total"] == sum(cached)


def test_sglang_s_native_generate_goes_through_the_router_to_the_replica_that_cached_it(cluster):
    """bench_serving's default backend and SGLang's own scripts post /generate: the router forwards it, matching
    its text against the prompts it routed before (the previous test's, on the router's first worker)."""
    base = cluster["base"]
    first = router_order(base)[0]
    before = counters(first)
    body = json.dumps({"text": SYSTEM + "Question 9: what is a tree?", "stream": False,
                       "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{base}/generate", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    out = json.loads(urllib.request.urlopen(req, timeout=120).read())
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 4} and len(out["output_ids"]) == 4
    assert meta["cached_tokens"] >= 35
    after = counters(first)
    assert after["num_requests_total"] - before["num_requests_total"] == 1
    assert after["cached_tokens_total"] - before["cached_tokens_total"] == meta["cached_tokens"]


def test_round_robin_alternates_and_each_replica_hits_its_own_copy(cluster):
    workers = cluster["workers"]
    for w in workers:
        urllib.request.urlopen(urllib.request.Request(w + "/flush_cache", method="POST"), timeout=10).read()
    with open(cluster["logs"] / "round_robin.log", "ab") as log:
        rr, rr_port = start_round_robin(workers, log)
    try:
        while len(router_order(rr_port)) < 2:
            time.sleep(0.2)
        before = {w: counters(w) for w in workers}
        prompt = SYSTEM + "Question: what is recursion?"
        res = ask(rr_port, [prompt] * 4)
        after = {w: counters(w) for w in workers}
    finally:
        rr.send_signal(signal.SIGINT)
        rr.wait(30)
    got = [after[w]["num_requests_total"] - before[w]["num_requests_total"] for w in workers]
    hits = [after[w]["cached_tokens_total"] - before[w]["cached_tokens_total"] for w in workers]
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in res]
    assert got == [2, 2]
    # requests 1 and 2 are each replica's first sight of the prompt; 3 and 4 hit their own copy
    assert cached[:2] == [0, 0] and min(cached[2:]) >= res[0].usage.prompt_tokens - 1
    assert sorted(hits) == sorted(cached[2:])


def test_ctrl_c_stops_the_router_and_both_servers(cluster):
    proc, base = cluster["proc"], cluster["base"]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0                  # asked to stop, and stopped: `make replicas` prints no Error 130
    assert "stopping the router and the servers" in proc.stdout.read()
    assert "Traceback" not in (cluster["logs"] / "router.log").read_text()    # the router's console
    own = [p.read_text() for p in cluster["logs"].glob("smg.*")]            # with --log-dir, its own log file,
    assert len(own) == 1 and " INFO smg::server:" in own[0]                 # INFO included
    for port in (base, base + 1, base + 2, base + 3):
        assert not http_probe.listening(port), f"port {port} still open"
