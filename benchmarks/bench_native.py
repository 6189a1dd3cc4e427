"""The native Llama path (core/engine/model/native_llama.py) against Hugging Face, side by side, in one process.

Default model (SmolLM2-135M-Instruct), CPU. Every figure is a ratio of runs made in the same process,
interleaved round by round (the machine is shared and noisy), each configuration keeping its
fastest run. Sections (all by default, or pick with --sections):

  decode   decode tokens/s = B / fastest step, at batch 1 and 8 and several context lengths:
             HF `generate` (stock model, sdpa, fp32): steps timed by a logits processor, batch 1
               only, at --hf-contexts (HF prefill of long prompts is slow);
             native, each numerics mode: one forward per step (ForwardBatch.build included), all B
               sequences decoding, steady state, fastest step of the run; contexts are real-text
               prompts (one prefill, copied into B separate slot ranges: nothing is shared).
  engine   decode tokens/s through core.engine.Engine (scheduler, sampling, K-norm recording
             included): B / fastest engine step while B requests decode, batch 1 and 8 at
             --engine-context, the radix cache off; native modes and the engine on the HF model
             (ModelRunner impl="hf"); ratios against HF generate at batch 1.
  prefill  one uncached forward of N tokens: HF fp32 (and bf16) `model(ids, logits_to_keep=1)`
             against native modes.
  agree    greedy agreement with HF generate fp32 (EOS disabled, so every run makes exactly
             --agree-tokens tokens) over --agree-prompts real-text prompts (5 shared "system"
             prefixes x questions, 40..400 tokens): per mode, run through the Engine with the radix
             cache on and off; prints how many outputs equal HF's and the first differing
             position, and whether cache on == cache off.

    .venv/bin/python benchmarks/bench_native.py                     # everything, 2 threads (~15 min)
    .venv/bin/python benchmarks/bench_native.py --sections decode --modes int8 --contexts 544
    .venv/bin/python benchmarks/bench_native.py --sections prefill --prefill 1024
    .venv/bin/python benchmarks/bench_native.py --llama-cpp         # add llama.cpp (llama-cpp-python) decode
"""
from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_engine import corpus_text  # noqa: E402
from benchmarks.engine_sweep import StepClock  # noqa: E402
from core.engine.model import native_kernels  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.model.forward_batch import ForwardBatch  # noqa: E402
from core.engine.model.loader import resolve_model
from core.engine.model.runner import ModelRunner  # noqa: E402
from core.engine.sampling import SamplingParams  # noqa: E402

MODES = ("fp32", "bf16", "int8")


def text_ids(tokenizer) -> list[int]:
    return tokenizer.encode(corpus_text(), add_special_tokens=False)


def hf_fastest_step(hf, prompt: list[int], batch: int, n: int) -> float:
    """Fastest interval between consecutive decode steps of HF generate (greedy, fp32, KV cache)."""
    from transformers import LogitsProcessorList
    ids = torch.tensor([prompt] * batch)
    clock = StepClock()
    with torch.inference_mode():
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                    pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
    return min(b - a for a, b in zip(clock.times[1:], clock.times[2:]))   # skip the prefill step


def hf_decode_rate(hf, prompt: list[int], batch: int, n: int, rounds: int) -> float:
    """B / fastest decode step of HF generate, over `rounds` runs of n new tokens: the same measure
    as the native rows (a noisy neighbour only ever makes a step slower, so the fastest is the cleanest)."""
    return batch / min(hf_fastest_step(hf, prompt, batch, n) for _ in range(rounds))


class NativeDecode:
    """B sequences of `ctx` tokens in one pool, decoding one token per step through native.forward."""

    def __init__(self, native, prompt: list[int], batch: int, steps: int) -> None:
        self.native, self.batch, self.steps = native, batch, steps
        ctx = len(prompt)
        self.ctx = ctx
        per = ctx + steps + 8
        self.pool = native.make_pool(batch * per + 16)
        self.slots = [torch.arange(1 + b * per, 1 + (b + 1) * per) for b in range(batch)]
        native.forward(ForwardBatch.build([(torch.tensor(prompt), [], self.slots[0][:ctx])]), self.pool)
        for b in range(1, batch):   # same context, separate slots: every sequence reads its own K/V
            for buf in (self.pool.k_buffer, self.pool.v_buffer):
                buf[:, self.slots[b][:ctx]] = buf[:, self.slots[0][:ctx]]

    def fastest_step(self) -> float:
        best = float("inf")
        tok = [5] * self.batch
        for s in range(self.steps):
            t0 = time.perf_counter()
            batch = ForwardBatch.build([([tok[b]], self.slots[b][:self.ctx + s], self.slots[b][self.ctx + s:self.ctx + s + 1])
                                        for b in range(self.batch)])
            logits = self.native.forward(batch, self.pool)
            tok = logits.argmax(-1).tolist()
            best = min(best, time.perf_counter() - t0)
        return best


def section_decode(args, tokenizer, hf, runners) -> dict:
    ids = text_ids(tokenizer)
    results: dict = {}
    print(f"\n== decode tokens/s = B / fastest step ({torch.get_num_threads()} threads; native: {args.steps} steps x "
          f"{args.rounds} rounds; HF generate: {args.hf_tokens} new tokens x {args.rounds} runs)")
    for ctx in args.contexts:
        prompt = ids[1000:1000 + ctx]
        for batch in args.batches:
            states = {m: NativeDecode(r.native, prompt, batch, args.steps) for m, r in runners.items()}
            best = {m: float("inf") for m in states}
            for _ in range(args.rounds):
                for m, st in states.items():
                    best[m] = min(best[m], st.fastest_step())
            for m in states:
                results[("native", m, batch, ctx)] = batch / best[m]
            del states
            gc.collect()
            if hf is not None and batch == 1 and ctx in args.hf_contexts:
                results[("hf", "fp32", batch, ctx)] = hf_decode_rate(hf, prompt, batch, args.hf_tokens, args.rounds)
            row = "  ".join(f"{m} {results[('native', m, batch, ctx)]:6.1f}" for m in runners)
            hf_rate = results.get(("hf", "fp32", 1, ctx))
            extra = f"   HF generate (B=1) {hf_rate:5.1f}" if hf_rate else ""
            print(f"ctx {ctx:5d}  B={batch}:  {row}{extra}", flush=True)
    # ratios
    base_ctx = args.hf_contexts[0] if args.hf_contexts else None
    base = results.get(("hf", "fp32", 1, base_ctx))
    if base:
        print(f"\nratios against HF generate, batch 1, {base_ctx}-token context ({base:.1f} tok/s):")
        for m in runners:
            parts = [f"B={b} ctx {c}: {results[('native', m, b, c)] / base:5.2f}x"
                     for c in args.contexts for b in args.batches if ("native", m, b, c) in results]
            print(f"  {m:5s} " + "   ".join(parts))
    if 128 in args.contexts and 4096 in args.contexts and 1 in args.batches:
        print("flatness, batch 1: tok/s at 4096 / tok/s at 128: " + "  ".join(
            f"{m} {results[('native', m, 1, 4096)] / results[('native', m, 1, 128)]:.0%}" for m in runners))
    return results


def engine_decode_rate(runner, prompts: list[list[int]], n: int, rounds: int) -> float:
    """B / fastest engine step while all B requests decode (scheduler, sampling, K-norm recording
    included), radix cache off, over `rounds` runs of n new tokens."""
    best = float("inf")
    for _ in range(rounds):
        e = Engine(runner, pool_slots=len(prompts) * (len(prompts[0]) + n) + 64, disable_radix_cache=True,
                   max_running_requests=len(prompts), max_prefill_tokens=len(prompts) * len(prompts[0]))
        handles = [e.submit(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p in prompts]
        e.step()                                     # every prompt prefilled in this step
        while not all(h.done() for h in handles):
            t0 = time.perf_counter()
            e.step()
            best = min(best, time.perf_counter() - t0)
    return len(prompts) / best


def section_engine(args, tokenizer, hf, runners, hf_runner) -> None:
    ids = text_ids(tokenizer)
    ctx = args.engine_context
    prompts = [ids[2000 + i * ctx: 2000 + (i + 1) * ctx] for i in range(8)]
    print(f"\n== Engine decode tokens/s, {ctx}-token prompts, {args.engine_tokens} new tokens, radix cache off: "
          f"B / fastest engine step, {args.rounds} runs")
    all_runners = dict(runners)
    if hf_runner is not None:
        all_runners["hf-hook fp32"] = hf_runner
    base = hf_decode_rate(hf, prompts[0], 1, args.engine_tokens, args.rounds) if hf is not None else None
    if base:
        print(f"HF generate fp32, batch 1: {base:.1f} tok/s")
    for batch in (1, 8):
        for name, r in all_runners.items():
            rate = engine_decode_rate(r, prompts[:batch], args.engine_tokens, args.rounds)
            ratio = f"  ({rate / base:.2f}x HF generate B=1)" if base else ""
            print(f"  B={batch}  engine[{name:12s}] {rate:6.1f} tok/s{ratio}", flush=True)


def section_prefill(args, tokenizer, hf, hf_bf16, runners) -> None:
    ids = text_ids(tokenizer)
    print(f"\n== prefill, one uncached forward (fastest of {args.rounds}), seconds and speed-up over HF fp32")
    for n in args.prefill:
        prompt = torch.tensor(ids[:n])
        best: dict = {}

        def keep(name: str, dt: float) -> None:
            best[name] = min(best.get(name, float("inf")), dt)

        for _ in range(args.rounds):
            if hf is not None:
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    hf(prompt[None], logits_to_keep=1)
                    keep("HF fp32", time.perf_counter() - t0)
                    if hf_bf16 is not None:
                        t0 = time.perf_counter()
                        hf_bf16(prompt[None], logits_to_keep=1)
                        keep("HF bf16", time.perf_counter() - t0)
            for m, r in runners.items():
                pool = r.native.make_pool(n + 16)
                t0 = time.perf_counter()
                r.native.forward(ForwardBatch.build([(prompt, [], torch.arange(1, n + 1))]), pool)
                keep(m, time.perf_counter() - t0)
                del pool
        base = best.get("HF fp32")
        print(f"{n:5d} tokens: " + "  ".join(
            f"{k} {v:.2f}s" + (f" ({base / v:.2f}x)" if base else "") for k, v in best.items()), flush=True)


def agreement_prompts(tokenizer, count: int) -> list[list[int]]:
    ids = text_ids(tokenizer)
    systems = [ids[i * 400: i * 400 + 40 + 70 * i] for i in range(5)]          # 40..320 tokens
    prompts = []
    base = 5 * 400
    for j in range(count):
        q = 8 + (j * 7) % 80
        prompts.append(systems[j % 5] + ids[base: base + q])
        base += q
    return prompts


def section_agree(args, tokenizer, hf, runners) -> None:
    prompts = agreement_prompts(tokenizer, args.agree_prompts)
    n = args.agree_tokens
    ref_model = copy.deepcopy(hf)
    ref_model.generation_config.eos_token_id = None   # no EOS: min_new_tokens would otherwise mask it
    print(f"\n== greedy agreement with HF generate fp32: {len(prompts)} prompts "
          f"({min(map(len, prompts))}..{max(map(len, prompts))} tokens, 5 shared prefixes), {n} new tokens")
    t0 = time.perf_counter()
    ref = []
    with torch.inference_mode():
        for p in prompts:
            out = ref_model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=0)
            ref.append(out[0, len(p):].tolist())
    print(f"  (HF generate took {time.perf_counter() - t0:.0f} s)")
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    pool = sum(len(p) + n for p in prompts) + 64
    for m, r in runners.items():
        outs = {}
        for disable in (False, True):
            e = Engine(r, pool_slots=pool, disable_radix_cache=disable, max_running_requests=16)
            outs[disable] = [c.token_ids for c in e.generate(prompts, params)]
        on = outs[False]
        first = [next((i for i in range(n) if o[i] != x[i]), n) for o, x in zip(on, ref)]
        diverged = sorted(f for f in first if f < n)
        same_cache = sum(a == b for a, b in zip(outs[False], outs[True]))
        print(f"  {m:5s}: {sum(f == n for f in first):3d}/{len(prompts)} identical to HF; first differing token "
              f"of the others at {diverged if len(diverged) <= 12 else diverged[:12] + ['...']}; "
              f"mean first-diff position {statistics.mean(first):.1f}/{n}; cache on == off: {same_cache}/{len(prompts)}",
              flush=True)


def section_llama_cpp(args, tokenizer) -> None:
    try:
        from llama_cpp import Llama
    except ImportError:
        print("\n(llama-cpp-python is not installed: no llama.cpp figures)")
        return
    from core.engine.model.loader import default_gguf
    llm = Llama(model_path=str(default_gguf()), n_ctx=max(args.contexts) + 64, n_threads=torch.get_num_threads(),
                verbose=False)
    ids = text_ids(tokenizer)
    print("\n== llama.cpp (same GGUF, Q4_1), batch 1 decode tokens/s")
    for ctx in args.contexts:
        prompt = ids[1000:1000 + ctx]
        best = float("inf")
        for _ in range(args.rounds):
            llm.reset()
            llm.eval(prompt)
            tok = 5
            for _ in range(args.steps):
                t0 = time.perf_counter()
                llm.eval([tok])
                best = min(best, time.perf_counter() - t0)
        print(f"ctx {ctx:5d}  B=1: {1 / best:6.1f} tok/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="decode,engine,prefill,agree")
    ap.add_argument("--modes", default=",".join(MODES), help="numerics, comma-separated: fp32, bf16, int8; "
                    "MODE/KV picks the KV pool dtype too (int8/bf16: int8 weights, fp32 activations, bf16 KV; "
                    "a bare MODE takes kv_cache_dtype auto)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="128,544,2048,4096")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--hf-contexts", default="544", help="contexts of the HF generate decode baseline (batch 1)")
    ap.add_argument("--hf-tokens", type=int, default=33, help="new tokens per HF generate run")
    ap.add_argument("--steps", type=int, default=12, help="native decode steps per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engine-context", type=int, default=544)
    ap.add_argument("--engine-tokens", type=int, default=33)
    ap.add_argument("--prefill", default="1024,4096")
    ap.add_argument("--agree-prompts", type=int, default=50)
    ap.add_argument("--agree-tokens", type=int, default=32)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--llama-cpp", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    args.contexts, args.batches, args.hf_contexts, args.prefill = (ints(args.contexts), ints(args.batches),
                                                                  ints(args.hf_contexts), ints(args.prefill))
    sections = set(args.sections.split(","))
    modes = [m for m in args.modes.split(",") if m]

    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    path = resolve_model("default")
    runners = {m: ModelRunner("default", device="cpu", impl="native", numerics=m.split("/")[0],
                              kv_cache_dtype=(m.split("/") + ["auto"])[1]) for m in modes}
    tokenizer = next(iter(runners.values())).tokenizer
    hf = None if args.no_hf else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                     attn_implementation="sdpa").eval()
    print(f"SmolLM2-135M-Instruct, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"native kernels: {'on' if native_kernels.available() else 'off (' + str(native_kernels.error()) + ')'}; "
          f"loaded in {time.perf_counter() - t0:.1f} s")
    for m, r in runners.items():
        print(f"  native {m}: weights {r.native.weight_bytes() / 2**20:.0f} MiB, KV pool {r.native.kv_dtype}")

    if "decode" in sections:
        section_decode(args, tokenizer, hf, runners)
    if "engine" in sections:
        hf_runner = ModelRunner("default", device="cpu", impl="hf")
        section_engine(args, tokenizer, hf, runners, hf_runner)
        del hf_runner
    if "prefill" in sections:
        hf_bf16 = None if hf is None else AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
        section_prefill(args, tokenizer, hf, hf_bf16, runners)
        del hf_bf16
    if "agree" in sections and hf is not None:
        section_agree(args, tokenizer, hf, runners)
    if args.llama_cpp:
        section_llama_cpp(args, tokenizer)


if __name__ == "__main__":
    main()
