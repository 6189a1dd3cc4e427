"""bench_engine.py's server section: decode and prefill through the HTTP server, as the issue's held-out check measures
them, beside Hugging Face `generate` and llama.cpp in this process (issue 25).

One `python -m core.server` per KV pool dtype asked for (its defaults otherwise; radix cache off, so every prompt is
really prefilled), driven by the `openai` client with streamed completions of token-id prompts (`ignore_eos`):
decode tok/s = (chunks - 1) / (last chunk - first chunk), prefill = send to first chunk. The servers idle while HF
and llama.cpp run here, and every configuration runs once per round, rounds alternating their order; each keeps its
fastest round (a noisy neighbour only ever makes a run slower).
"""
from __future__ import annotations

import subprocess
from typing import Callable, Optional

import torch

from benchmarks.engine_fairness import stream_times
from benchmarks.engine_sweep import fastest, hf_run, llama_cpp_model, llama_cpp_run, ratio


def server_run(client, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """(send to first token, first token to last) of one streamed completion."""
    sent, times = stream_times(client, prompt, new_tokens)
    if len(times) < 2:
        raise RuntimeError(f"the server streamed {len(times)} chunks for {new_tokens} tokens")
    return times[0] - sent, (times[-1] - times[0]) * (new_tokens - 1) / (len(times) - 1)


def start(kv: str, threads: int, pool_slots: int):
    """A server with this KV pool dtype and an OpenAI client on it: (process, client)."""
    from openai import OpenAI

    from benchmarks.bench_serving import serve
    proc, url = serve(["--log-level", "warning", "--pool-slots", str(pool_slots), "--disable-radix-cache",
                       "--torch-threads", str(threads), "--kv-cache-dtype", kv])
    return proc, OpenAI(base_url=f"{url}/v1", api_key="none", timeout=900, max_retries=0)


def section_server(args, hf, ids: list[int]) -> None:
    contexts = [int(x) for x in args.contexts.split(",") if x]
    sizes = [int(x) for x in args.prefill.split(",") if x]
    kvs = [k for k in args.kv_cache_dtype.split(",") if k] or ["auto"]
    threads = torch.get_num_threads()
    servers = {}
    try:
        for kv in kvs:
            servers[f"server[kv {kv}]"] = start(kv, threads, max(contexts + sizes) + args.sweep_tokens + 256)
        llm = llama_cpp_model(threads, max(contexts + sizes) + args.sweep_tokens + 64)
        for _, client in servers.values():
            server_run(client, ids[:64], 4)                                  # warm up
        rounds = max(2, args.rounds)
        cols = list(servers) + (["HF generate"] if hf is not None else []) + (["llama.cpp"] if llm is not None else [])
        print(f"\n== through the server: decode tokens/s at batch 1, {args.sweep_tokens} new tokens, {threads} threads,"
              f" fastest of {rounds}")
        print(f"{'':12s}" + "".join(f"{c:>22s}" for c in cols))
        rates: dict = {}
        for ctx in contexts:
            prompt = ids[2000:2000 + ctx]
            runs = _runs(servers, hf, llm, prompt, args.sweep_tokens)
            for name, (_pre, dec) in fastest(rounds, runs).items():
                rates[(name, ctx)] = (args.sweep_tokens - 1) / dec
            print(f"{f'ctx {ctx}':12s}" + "".join(f"{rates[(c, ctx)]:22.1f}" for c in cols), flush=True)
        lo, hi = min(contexts), max(contexts)
        for c in cols:
            print(f"{c}: flatness (tok/s at {hi} / at {lo}) {ratio(rates[(c, hi)], rates[(c, lo)])}"
                  + ("" if c not in servers else
                     f";  at 544: / HF generate {ratio(rates.get((c, 544)), rates.get(('HF generate', 544)))}, "
                     f"/ llama.cpp {ratio(rates.get((c, 544)), rates.get(('llama.cpp', 544)))}"))
        print(f"\n== through the server: prefill (send to first token), uncached, fastest of {rounds}")
        for n in sizes:
            best = fastest(rounds, _runs(servers, hf, llm, ids[:n], 2))
            print(f"{n:5d} tokens:  " + "   ".join(f"{k} {v[0]:.3f} s" for k, v in best.items()))
            for s in servers:
                print(f"  {s}: / HF generate fp32 {ratio(best.get('HF generate', (None,))[0], best[s][0])} (goal >= "
                      f"2x), / llama.cpp {ratio(best.get('llama.cpp', (None,))[0], best[s][0])} (goal >= 4x)",
                      flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _runs(servers: dict, hf, llm: Optional[object], prompt: list[int],
          new_tokens: int) -> dict[str, Callable[[], tuple[float, float]]]:
    runs: dict[str, Callable[[], tuple[float, float]]] = {
        name: (lambda c=client: server_run(c, prompt, new_tokens)) for name, (_, client) in servers.items()}
    if hf is not None:
        runs["HF generate"] = lambda: hf_run(hf, [prompt], new_tokens)
    if llm is not None:
        runs["llama.cpp"] = lambda: llama_cpp_run(llm, prompt, new_tokens)
    return runs
