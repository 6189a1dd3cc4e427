"""Serving benchmark: the server over HTTP, driven by the official `openai` client.

Question: what does the radix cache buy a multi-turn chat workload with shared system prompts,
at concurrency 1, 4 and 16? Two servers run side by side (`python -m core.server`, one with
`--disable-radix-cache`); each workload runs against one at a time, alternating, from a flushed
cache, so both see the same machine load. A conversation's turns are sequential (each turn
sends the whole history back, as chat clients do); `concurrency` conversations run at once.
Prints TTFT and inter-token latency p50/p99, output tok/s and the cached share of prompt tokens.

    .venv/bin/python benchmarks/bench_serving.py [--conversations 16 --turns 3 --max-tokens 16]
    .venv/bin/python benchmarks/bench_serving.py --url http://127.0.0.1:30000   # one running server
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = [
    "You are a patient support engineer for a cloud database. Answer briefly and precisely. Ask for the "
    "error message, the client version and the query when they are missing. Never invent settings that do "
    "not exist; when unsure, say so and point to the documentation. Prefer concrete commands over prose, "
    "and keep every answer under five sentences unless the user asks for more detail.",
    "You are a friendly tutor for high-school physics. Explain with one everyday example, then the formula, "
    "then a one-line check the student can do at home. Use SI units throughout. If a question is outside "
    "physics, answer in one sentence and steer back to the lesson. Encourage the student to try first.",
]
QUESTIONS = ["Why is my query slow?", "How do I add an index?", "What does this timeout mean?",
             "Can I resize the instance?", "Why does a ball fall?", "What is momentum?", "How do lenses work?",
             "Why is the sky blue?", "What is friction?", "How do I back up my data?", "What is a replica?",
             "Explain energy conservation."]


@dataclass
class Sample:
    ttft: float
    gaps: list[float]
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Run:
    wall: float = 0.0
    samples: list[Sample] = field(default_factory=list)


def conversation(i: int, turns: int) -> tuple[str, list[str]]:
    return SYSTEMS[i % len(SYSTEMS)], [QUESTIONS[(i * 5 + t) % len(QUESTIONS)] + f" (case {i})" for t in range(turns)]


def chat_turn(client: openai.OpenAI, model: str, messages: list[dict], max_tokens: int) -> tuple[Sample, str]:
    start = time.perf_counter()
    first, last, gaps, text, usage = None, None, [], [], None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        if ch.choices and ch.choices[0].delta.content:
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
            text.append(ch.choices[0].delta.content)
    return Sample(ttft=(first or time.perf_counter()) - start, gaps=gaps, completion_tokens=usage.completion_tokens,
                  prompt_tokens=usage.prompt_tokens,
                  cached_tokens=usage.prompt_tokens_details.cached_tokens), "".join(text)


def run_workload(url: str, model: str, conversations: int, turns: int, max_tokens: int, concurrency: int) -> Run:
    req = urllib.request.Request(f"{url}/flush_cache", method="POST")
    urllib.request.urlopen(req, timeout=60).read()
    run = Run()

    def one(i: int) -> list[Sample]:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        system, questions = conversation(i, turns)
        messages, out = [{"role": "system", "content": system}], []
        for q in questions:
            messages.append({"role": "user", "content": q})
            s, answer = chat_turn(client, model, messages, max_tokens)
            messages.append({"role": "assistant", "content": answer})
            out.append(s)
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for got in pool.map(one, range(conversations)):
            run.samples.extend(got)
    run.wall = time.perf_counter() - start
    return run


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def summary(run: Run) -> dict[str, float]:
    ttft = [s.ttft for s in run.samples]
    gaps = [g for s in run.samples for g in s.gaps]
    out_tok = sum(s.completion_tokens for s in run.samples)
    return {"ttft_p50": pct(ttft, 50) * 1e3, "ttft_p99": pct(ttft, 99) * 1e3, "itl_p50": pct(gaps, 50) * 1e3,
            "itl_p99": pct(gaps, 99) * 1e3, "tok_s": out_tok / run.wall,
            "cached": sum(s.cached_tokens for s in run.samples) / max(1, sum(s.prompt_tokens for s in run.samples)),
            "requests": len(run.samples), "wall": run.wall}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(flags: list[str]) -> tuple[subprocess.Popen, str]:
    """`python -m core.server` on a free port with `flags`; (process, url) once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "core.server", "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {' '.join(cmd)}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


def start_server(extra: list[str], args) -> tuple[subprocess.Popen, str]:
    return serve(["--model", args.model, "--log-level", "warning", "--pool-slots", str(args.pool_slots),
                  "--max-running-requests", "16", *extra])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--pool-slots", type=int, default=8192)
    ap.add_argument("--url", default=None, help="benchmark one running server instead of starting two")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    procs = []
    try:
        if args.url:
            sides = {"server": args.url}
        else:
            on, url_on = start_server([], args)
            procs.append(on)
            off, url_off = start_server(["--disable-radix-cache"], args)
            procs.append(off)
            sides = {"radix on": url_on, "radix off": url_off}
        model = openai.OpenAI(base_url=f"{next(iter(sides.values()))}/v1", api_key="none").models.list().data[0].id
        print(f"workload: {args.conversations} conversations x {args.turns} turns, {len(SYSTEMS)} shared system "
              f"prompts, {args.max_tokens} output tokens per turn (ignore_eos), greedy; model {model}", flush=True)
        rows = []
        for c in levels:
            for name, url in sides.items():
                s = summary(run_workload(url, model, args.conversations, args.turns, args.max_tokens, c))
                rows.append((c, name, s))
                print(f"  concurrency {c:>2} {name:<9} done in {s['wall']:.1f} s", flush=True)
        print()
        print("| concurrency | cache | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s | cached share |")
        print("|---|---|---|---|---|---|---|---|")
        for c, name, s in rows:
            print(f"| {c} | {name} | {s['ttft_p50']:.0f} | {s['ttft_p99']:.0f} | {s['itl_p50']:.0f} | "
                  f"{s['itl_p99']:.0f} | {s['tok_s']:.1f} | {s['cached']:.1%} |")
        if len(sides) == 2:
            print()
            for c in levels:
                on_s = next(s for cc, n, s in rows if cc == c and n == "radix on")
                off_s = next(s for cc, n, s in rows if cc == c and n == "radix off")
                print(f"concurrency {c}: TTFT p50 off/on {off_s['ttft_p50'] / on_s['ttft_p50']:.2f}x, "
                      f"output tok/s on/off {on_s['tok_s'] / off_s['tok_s']:.2f}x")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
