"""bench_engine.py's context sweep and prefill runs: the engine, Hugging Face `generate` and llama.cpp, side by side.

All three run in this process on the same threads, interleaved round by round, each configuration keeping its
fastest round (a noisy neighbour only ever makes a run slower). Each runs as its users run it:

- the engine: `Engine.submit` + `Engine.step` (scheduler, sampler, radix bookkeeping included), radix cache off
  so every prompt is really prefilled, its step budget the server's default (a prompt past 2,048 tokens is
  prefilled in 2,048-token chunks, as `python -m core.server` does);
- Hugging Face: `model.generate`, greedy, KV cache, the stock model in fp32 with sdpa attention;
- llama.cpp: llama-cpp-python's `Llama.generate` on the GGUF the default model ships as (Q4_1), greedy, after
  `reset()` so nothing is reused (only when llama-cpp-python is installed: `make llamacpp`).

Decode tokens/s = tokens after the first / time from the first token to the last (batch B: B x that); prefill =
time from submit to the first token of an uncached prompt.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from core.engine.engine import Engine
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams


class StepClock:
    """A logits processor that records when HF generate reached each step (the first call follows the prefill)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def engine_run(runner: ModelRunner, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(seconds to the first token of every request, seconds from there to the last token) through the engine."""
    engine = Engine(runner, pool_slots=sum(len(p) + new_tokens for p in prompts) + 64, disable_radix_cache=True,
                    max_running_requests=len(prompts))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    handles = [engine.submit(p, params) for p in prompts]
    first = None
    while not all(h.done() for h in handles):
        engine.step()
        if first is None and all(h.partial_ids() for h in handles):
            first = time.perf_counter()
    end = time.perf_counter()
    return first - start, end - first


def hf_run(hf, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """The same two times for HF generate on equal-length prompts (one batch, no padding)."""
    from transformers import LogitsProcessorList
    ids = torch.tensor(prompts, device=hf.device)
    clock = StepClock()
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
    end = time.perf_counter()
    return clock.times[0] - start, end - clock.times[0]


def llama_cpp_model(threads: int, n_ctx: int):
    """llama-cpp-python's Llama on the default model's GGUF, or None when llama-cpp-python is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        print(f"\n(llama-cpp-python does not import ({exc}), so no llama.cpp column: `make llamacpp` builds it)")
        return None
    from core.engine.model.loader import default_gguf
    return Llama(model_path=str(default_gguf()), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                 n_batch=512, verbose=False)


def llama_cpp_run(llm, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """The same two times for llama.cpp, one stream (its Python API serves one sequence at a time)."""
    llm.reset()
    start = time.perf_counter()
    first = None
    for i, _tok in enumerate(llm.generate(prompt, temp=0.0, top_k=1, reset=True)):
        if i == 0:
            first = time.perf_counter()
        if i + 1 == new_tokens:
            break
    end = time.perf_counter()
    return first - start, end - first


def fastest(rounds: int, runs: dict[str, Callable[[], tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Each run's fastest (prefill, decode) times over `rounds`, alternating the order round by round."""
    best: dict[str, list[float]] = {}
    names = list(runs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            pre, dec = runs[name]()
            b = best.setdefault(name, [float("inf"), float("inf")])
            b[0], b[1] = min(b[0], pre), min(b[1], dec)
    return {k: (v[0], v[1]) for k, v in best.items()}


def context_sweep(runners: dict[str, ModelRunner], hf, llm, ids: list[int], contexts: list[int], new_tokens: int,
                  rounds: int, batch8_context: int) -> dict:
    """Decode tokens/s per context at batch 1, and at batch 8 for `batch8_context`; returns {(who, B, ctx): tok/s}."""
    rates: dict = {}
    cols = list(runners) + (["HF generate"] if hf is not None else []) + (["llama.cpp"] if llm is not None else [])
    print(f"\n== decode tokens/s, greedy, {new_tokens} new tokens, {torch.get_num_threads()} threads, fastest of "
          f"{rounds} (tokens after the first / time from the first token to the last)")
    print(f"{'':16s}" + "".join(f"{c:>20s}" for c in cols))
    shapes = [(1, c) for c in contexts] + [(8, batch8_context)]
    for batch, ctx in shapes:
        prompts = [ids[2000 + b * ctx: 2000 + (b + 1) * ctx] for b in range(batch)]
        runs: dict[str, Callable[[], tuple[float, float]]] = {
            f"engine[{m}]": (lambda r=r: engine_run(r, prompts, new_tokens)) for m, r in runners.items()}
        if hf is not None:
            runs["HF generate"] = lambda: hf_run(hf, prompts, new_tokens)
        if llm is not None and batch == 1:
            runs["llama.cpp"] = lambda: llama_cpp_run(llm, prompts[0], new_tokens)
        best = fastest(rounds, runs)
        for name, (_pre, dec) in best.items():
            rates[(name, batch, ctx)] = batch * (new_tokens - 1) / dec
        row = "".join(f"{rates[(n, batch, ctx)]:20.1f}" if (n, batch, ctx) in rates else f"{'-':>20s}"
                      for n in [f"engine[{m}]" for m in runners] + cols[len(runners):])
        print(f"{f'B={batch} ctx {ctx}':16s}{row}", flush=True)
    return rates


def prefill_times(runners: dict[str, ModelRunner], hf, llm, ids: list[int], sizes: list[int],
                  rounds: int) -> dict:
    """Seconds from submit to the first token of an uncached prompt; returns {(who, n): seconds}."""
    out: dict = {}
    print(f"\n== prefill: submit to first token, uncached, fastest of {rounds}; prompt tokens/s in brackets")
    for n in sizes:
        prompt = ids[:n]
        runs: dict[str, Callable[[], tuple[float, float]]] = {
            f"engine[{m}]": (lambda r=r: engine_run(r, [prompt], 2)) for m, r in runners.items()}
        if hf is not None:
            runs["HF generate"] = lambda: hf_run(hf, [prompt], 2)
        if llm is not None:
            runs["llama.cpp"] = lambda: llama_cpp_run(llm, prompt, 2)
        best = fastest(rounds, runs)
        for name, (pre, _dec) in best.items():
            out[(name, n)] = pre
        print(f"{n:5d} tokens:  " + "   ".join(f"{k} {v[0]:.3f} s ({n / v[0]:,.0f})" for k, v in best.items()),
              flush=True)
    return out


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def engine_name(runner: ModelRunner) -> str:
    """The sweep's column for one engine: its numerics, its KV pool's dtype where that differs, and on CUDA
    whether its decode steps replay CUDA graphs."""
    same = runner.kv_cache_dtype == runner.numerics and runner.numerics != "int8"   # int8's pool: int8 or fp32
    name = runner.numerics if same else f"{runner.numerics}, kv {runner.kv_cache_dtype}"
    if runner.device.type == "cuda" and runner.impl == "native":
        name += ", graphs" if runner.cuda_graph else ", eager"
    return name


def section_speed(args, engines: list[ModelRunner], hf, ids: list[int], sections: set) -> bool:
    """The context sweep and the prefill run, with llama.cpp beside them when llama-cpp-python is installed."""
    contexts = [int(x) for x in args.contexts.split(",") if x]
    sizes = [int(x) for x in args.prefill.split(",") if x]
    llm = llama_cpp_model(torch.get_num_threads(), max(contexts + sizes) + args.sweep_tokens + 64)
    runners = {engine_name(r): r for r in engines}
    warm = ids[:64]
    for runner in engines:
        engine_run(runner, [warm], 4)
    if hf is not None:
        hf_run(hf, [warm], 4)
    if llm is not None:
        llama_cpp_run(llm, warm, 4)
    r = ratio
    if "sweep" in sections:
        rates = context_sweep(runners, hf, llm, ids, contexts, args.sweep_tokens, max(2, args.rounds),
                                           544)
        hf544, llama544 = rates.get(("HF generate", 1, 544)), rates.get(("llama.cpp", 1, 544))
        lo, hi = min(contexts), max(contexts)
        for m in runners:
            name = f"engine[{m}]"
            e544, e8 = rates.get((name, 1, 544)), rates.get((name, 8, 544))
            print(f"{name}: batch 1 at 544: engine / HF generate {r(e544, hf544)} (goal >= 3x), engine / llama.cpp "
                  f"{r(e544, llama544)} (goal >= 1x);  batch 8 engine / HF generate batch 1 {r(e8, hf544)} "
                  f"(goal >= 5x);  flatness: tok/s at {hi} / at {lo}: "
                  f"{r(rates.get((name, 1, hi)), rates.get((name, 1, lo)))} (goal >= 0.70x)")
        print(f"flatness of the peers: HF generate {r(rates.get(('HF generate', 1, hi)), rates.get(('HF generate', 1, lo)))}"
              f";  llama.cpp {r(rates.get(('llama.cpp', 1, hi)), rates.get(('llama.cpp', 1, lo)))}")
    if "prefill" in sections:
        times = prefill_times(runners, hf, llm, ids, sizes, max(2, args.rounds))
        for n in sizes:
            for m in runners:
                e = times.get((f"engine[{m}]", n))
                print(f"{n} tokens: engine[{m}] speed-up over HF generate fp32 {r(times.get(('HF generate', n)), e)} "
                      f"(goal >= 2x), over llama.cpp {r(times.get(('llama.cpp', n)), e)} (goal >= 4x)")
    return True
