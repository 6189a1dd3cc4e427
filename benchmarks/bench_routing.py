"""The lab's routing model against the real sglang-router, on two real replicas.

    .venv/bin/python benchmarks/bench_routing.py [--groups 4 --per-group 6 --concurrency 1,4]

Starts two `core.server` replicas (the default model) behind `sglang_router` (`python -m
core.replicas`). For each policy and client concurrency it starts a fresh router over the two
servers (a router remembers every prompt it routed), flushes both caches, sends the same shared-prefix
workload (groups of prompts sharing a system prompt) through the router with the official
`openai` client, and reads each replica's `sglang:cached_tokens_total` and request counters
from its own /metrics. Beside them it prints what the lab predicts for the same texts:
`core.lab.routing.route_texts` (the router's algorithm on characters) then a replay of each
replica's share through the RadixCache at the servers' pool size. Replica i is the router's
i-th worker (GET /workers), which is the order its min-load ties follow.
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openai import OpenAI  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from core.lab.routing import RouterConfig, replay_routed, route_texts  # noqa: E402
from core.lab.workloads import TraceRequest, Workload  # noqa: E402

TOPICS = ["sorting", "hashing", "recursion", "graphs", "caching", "compilers", "networks", "databases"]
PERSONAS = ["a patient tutor for first-year students", "a terse senior engineer reviewing code",
            "a historian of computing who loves anecdotes", "an interviewer preparing practice questions",
            "a children's science-show host", "a technical writer drafting reference docs"]


def texts(groups: int, per_group: int) -> list[str]:
    """Group g's prompts share a ~60-token system prompt; arrival order interleaves the groups."""
    out = []
    for i in range(per_group):
        for g in range(groups):
            sys_prompt = (f"You are {PERSONAS[g % len(PERSONAS)]}. Answer in two short sentences, give one "
                          f"concrete example, define every term you use, and end with a question for the reader. ")
            out.append(sys_prompt + f"Question {i}: explain {TOPICS[(i + g) % len(TOPICS)]} in one line.")
    return out


def free_base(n: int) -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def counters(worker: str) -> dict[str, float]:
    want = {"sglang:cached_tokens_total": "cached", "sglang:num_requests_total": "requests"}
    out = {"cached": 0.0, "requests": 0.0}
    for fam in text_string_to_metric_families(get(worker + "/metrics").decode()):
        for s in fam.samples:
            if s.name in want:
                out[want[s.name]] = s.value
    return out


def order(router: str) -> list[str]:
    return [w["url"] for w in json.loads(get(router + "/workers"))["workers"]]


def wait_workers(router: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(order(router)) >= n:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(router)


def run(router: str, prompts: list[str], concurrency: int, max_tokens: int) -> list:
    client = OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=600)

    def one(p: str):
        return client.completions.create(model="default", prompt=p, max_tokens=max_tokens, temperature=0)
    with ThreadPoolExecutor(concurrency) as pool:      # closed loop: each worker takes the next prompt
        return list(pool.map(one, prompts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=6)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--pool-slots", type=int, default=4096)
    args = ap.parse_args()
    conc = [int(c) for c in args.concurrency.split(",")]
    prompts = texts(args.groups, args.per_group)
    from transformers import AutoTokenizer
    from core.engine.model.loader import resolve_model
    tok = AutoTokenizer.from_pretrained(resolve_model("default"))
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts]

    base = free_base(6)
    logs = Path(tempfile.mkdtemp(prefix="bench_routing_"))
    launcher = subprocess.Popen([sys.executable, "-m", "core.replicas", "--replicas", "2", "--port", str(base),
                                 "--policy", "cache_aware", "--log-dir", str(logs), "--",
                                 "--pool-slots", str(args.pool_slots)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    router_proc = None
    try:
        line = launcher.stdout.readline()
        if "behind sglang-router" not in line:
            raise RuntimeError(f"replicas did not start: {line}{launcher.stdout.read()} (logs in {logs})")
        workers = [f"http://127.0.0.1:{base + 1}", f"http://127.0.0.1:{base + 2}"]
        router = f"http://127.0.0.1:{base + 4}"
        print(f"{len(prompts)} prompts ({args.groups} groups x {args.per_group}), max_tokens {args.max_tokens}, "
              f"pool {args.pool_slots} slots per replica, 2 replicas")
        print(f"{'policy':>12} {'conc':>4} {'replica':>22}  {'requests real/lab':>17}  {'cached tokens real/lab':>22}  diff")
        worst = 0.0
        for policy in ("cache_aware", "round_robin"):
            for c in conc:
                router_proc = subprocess.Popen(
                    [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                     str(base + 4), "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port",
                     str(base + 5), "--worker-urls", *workers],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                wait_workers(router, 2)
                ordered = order(router)
                for w in workers:
                    urllib.request.urlopen(urllib.request.TraceRequest(w + "/flush_cache", method="POST"), timeout=30)
                before = {w: counters(w) for w in workers}
                res = run(router, prompts, c, args.max_tokens)
                after = {w: counters(w) for w in workers}
                router_proc.send_signal(signal.SIGINT)
                router_proc.wait(60)
                wl = Workload("bench", [TraceRequest(i, output_len=r.usage.completion_tokens) for i, r in zip(ids, res)])
                assign = route_texts(wl, prompts, 2, policy, RouterConfig(), concurrency=c)
                lab = replay_routed(wl, args.pool_slots, 2, policy, "lru", 1, assignment=assign)
                for i, url in enumerate(ordered):
                    real_c = after[url]["cached"] - before[url]["cached"]
                    real_n = after[url]["requests"] - before[url]["requests"]
                    pred = lab.per_replica[i]
                    pc = 0 if pred is None else pred.hit_tokens
                    pn = lab.requests_per_replica()[i]
                    diff = (pc - real_c) / max(real_c, 1)
                    worst = max(worst, abs(diff)) if real_c or pc else worst
                    print(f"{policy:>12} {c:>4} {url:>22}  {int(real_n):>8}/{pn:<8}  {int(real_c):>11}/{pc:<10}  "
                          f"{diff:+.1%}")
        print(f"largest per-replica difference in cached tokens: {worst:.1%}")
    finally:
        for p in (router_proc, launcher):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
