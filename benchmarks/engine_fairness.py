"""bench_engine.py's fairness run, through the HTTP server as clients see it (issue 25).

One `python -m core.server` (its defaults: the model path and numerics it picks, the step budget), driven by
the `openai` client with streamed completions:

1. solo: one stream (a 128-token prompt, --fair-tokens new tokens) alone; its inter-token latencies (ITL);
2. loaded: the same kind of stream (another prompt, so nothing is cached), and once it has made 8 tokens a
   6,000-token uncached prompt arrives (max_tokens 2); 1 s later a 2-token request arrives.
   With --fair-solo-last, 2 runs before 1, on a server that has decoded only a warm-up (as a client that starts
   measuring on a fresh server sees it).

It prints the stream's ITL p50/p99 solo and while the long prompt was being prefilled (from its send to its first
token), the ratio of the p99s (goal <= 3x), and the 2-token request's time to first token (goal <= 2 s).
A scheduler that gives a long prefill the whole step stalls the stream for the whole prefill, and the short
request waits behind it.
"""
from __future__ import annotations

import statistics
import subprocess
import threading
import time

import torch


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def stream_times(client, prompt: list[int], max_tokens: int, on_token=None) -> tuple[float, list[float]]:
    """(send time, arrival time of each content chunk) of one streamed completion."""
    sent = time.perf_counter()
    times: list[float] = []
    stream = client.completions.create(model="default", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
            if on_token is not None:
                on_token(len(times))
    return sent, times


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def fairness(ids: list[int], server_args: list[str], stream_tokens: int, long_tokens: int,
             solo_last: bool = False, long_prompts: int = 1) -> dict:
    """The two runs on one server; `solo_last` runs the loaded one first, on a server that has decoded nothing but
    the warm-up (the engine's decode-step estimate then rests on the loaded stream's first steps alone).
    `long_prompts`: that many long uncached prompts arrive together (several users pasting documents at once)."""
    from openai import OpenAI

    from benchmarks.bench_serving import serve
    proc, url = serve(["--log-level", "warning", "--pool-slots", "16384", *server_args])
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
        stream_times(client, ids[:16], 4)                                   # warm up

        def solo_run() -> list[float]:
            return stream_times(client, ids[100:228], stream_tokens)[1]

        solo = [] if solo_last else solo_run()
        long_prompts_ids = [ids[5000 + i * long_tokens:5000 + (i + 1) * long_tokens] for i in range(long_prompts)]
        if any(len(p) < long_tokens for p in long_prompts_ids):
            raise SystemExit(f"the text corpus has {len(ids):,} tokens: too few for {long_prompts} prompts of "
                             f"{long_tokens:,}; lower --long-tokens or --long-prompts")
        marks: dict[str, float] = {}
        started = threading.Event()

        def long_request(i: int) -> None:
            marks[f"long_sent{i}"], t = stream_times(client, long_prompts_ids[i], 2)
            marks[f"long_first{i}"] = t[0]

        def short_request() -> None:
            marks["short_sent"], t = stream_times(client, ids[60:72], 2)
            marks["short_first"] = t[0]

        def on_token(n: int) -> None:
            if n == 8:
                started.set()

        result: dict = {}
        runner = threading.Thread(target=lambda: result.update(
            zip(("sent", "times"), stream_times(client, ids[300:428], stream_tokens, on_token))))
        runner.start()
        started.wait(120)
        t_longs = [threading.Thread(target=long_request, args=(i,)) for i in range(long_prompts)]
        for t in t_longs:
            t.start()
        time.sleep(1.0)
        t_short = threading.Thread(target=short_request)
        t_short.start()
        for t in (t_short, *t_longs, runner):
            t.join(600)
        marks["long_sent"] = min(marks[f"long_sent{i}"] for i in range(long_prompts))
        marks["long_first"] = max(marks[f"long_first{i}"] for i in range(long_prompts))
        loaded = result["times"]
        window = [b - a for a, b in zip(loaded, loaded[1:]) if a >= marks["long_sent"] and b <= marks["long_first"]]
        if solo_last:
            solo = solo_run()
        return dict(solo=gaps(solo), loaded_window=window, loaded_all=gaps(loaded),
                    stream_ended_first=marks["long_first"] > loaded[-1],
                    long_prefill=marks["long_first"] - marks["long_sent"],
                    short_ttft=marks["short_first"] - marks["short_sent"])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def section_fairness(args, ids: list[int], dtype: str, kv: str) -> bool:
    """bench_engine.py's fairness section: one server on its defaults plus the run's numerics, threads and
    --server-args; False when a goal is missed."""
    server_args = args.server_args.split() + ["--torch-threads", str(torch.get_num_threads())]
    if dtype != "auto":
        server_args += ["--dtype", dtype]
    if kv != "auto":
        server_args += ["--kv-cache-dtype", kv]
    if args.cuda_graph == "off":
        server_args += ["--disable-cuda-graph"]
    r = fairness(ids, server_args, args.fair_tokens, args.long_tokens, args.fair_solo_last, args.long_prompts)
    return report(r, args.long_tokens, args.long_prompts)


def report(r: dict, long_tokens: int, long_prompts: int = 1) -> bool:
    solo, win = r["solo"], r["loaded_window"]
    ms = lambda x: f"{x * 1e3:.0f} ms"   # noqa: E731
    arrive = (f"a {long_tokens:,}-token uncached prompt arrives" if long_prompts == 1 else
              f"{long_prompts} uncached prompts of {long_tokens:,} tokens arrive together")
    print(f"\n== fairness through the server: one stream decoding, {arrive}, a 2-token request 1 s later")
    print(f"stream ITL solo:                  p50 {ms(statistics.median(solo))}  p99 {ms(percentile(solo, 99))}  "
          f"({len(solo)} gaps)")
    if len(win) < 20:
        print(f"only {len(win)} stream gaps overlapped the long prefill: raise --fair-tokens")
        return False
    p99_ratio = percentile(win, 99) / percentile(solo, 99)
    # a stream that ends first is measured over the part of the prefill it overlapped
    overlap = "; the stream ended first" if r.get("stream_ended_first") else ""
    print(f"stream ITL during the long prefill: p50 {ms(statistics.median(win))}  p99 {ms(percentile(win, 99))}  "
          f"max {ms(max(win))}  ({len(win)} gaps{overlap}; the prefill took {r['long_prefill']:.1f} s)")
    ok_itl = p99_ratio <= 3
    ok_ttft = r["short_ttft"] <= 2
    print(f"p99 ITL loaded / solo: {p99_ratio:.2f}x (goal <= 3x) {'PASS' if ok_itl else 'MISS'};  "
          f"2-token request's first token after {r['short_ttft']:.2f} s (goal <= 2 s) {'PASS' if ok_ttft else 'MISS'}")
    return ok_itl and ok_ttft
