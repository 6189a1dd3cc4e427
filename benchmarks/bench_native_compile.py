"""Does torch.compile pay for the native decode step on CPU? (core/engine/model/native_llama.py, default model)

The candidate is NativeLlama.decode_step_fn(): the whole decode step as one pure torch function of
tensors (fp32: embedding, 30 layers, the pool write, attention over pool slots, LM head), the same
function CUDA graphs capture; the C kernels would be graph breaks, so it uses torch ops only.
With --attention sum (default), attention is `k_cache[slots]` feeding a broadcast multiply + sum,
which inductor can fuse into one loop over the pool rows; --attention sdpa keeps aten SDPA. Side by side, in one process, batch 1 and 8:

  eager torch      NativeLlama.forward with the C kernels switched off (torch fallbacks)
  eager + C        NativeLlama.forward as shipped (C decode attention, fused norms)
  compiled         torch.compile(decode_step, dynamic=True) for each --compile-modes entry

It prints the first-call (compile) time, then the fastest step at each context, and the number of
recompilations seen when the context length changes (dynamic shapes should need none after the
first one or two).

    .venv/bin/python benchmarks/bench_native_compile.py --threads 1 --contexts 128,544,2048
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.engine.model import native_kernels  # noqa: E402
from core.engine.model.forward_batch import ForwardBatch  # noqa: E402
from core.engine.model.loader import resolve_model  # noqa: E402
from core.engine.model.native_llama import NativeLlama  # noqa: E402


class Seqs:
    def __init__(self, native, prompt, batch, steps):
        ctx = len(prompt)
        per = ctx + steps + 4
        self.ctx, self.batch, self.per = ctx, batch, per
        self.pool = native.make_pool(batch * per + 8)
        self.slots = torch.stack([torch.arange(1 + b * per, 1 + (b + 1) * per) for b in range(batch)])
        native.forward(ForwardBatch.build([(torch.tensor(prompt), [], self.slots[0, :ctx])]), self.pool)
        for b in range(1, batch):
            for buf in (self.pool.k_buffer, self.pool.v_buffer):
                buf[:, self.slots[b, :ctx]] = buf[:, self.slots[0, :ctx]]


def time_eager(native, st: Seqs, steps: int) -> float:
    best = float("inf")
    for s in range(steps):
        n = st.ctx + s
        t0 = time.perf_counter()
        native.forward(ForwardBatch.build([([5], st.slots[b, :n], st.slots[b, n:n + 1]) for b in range(st.batch)]),
                       st.pool)
        best = min(best, time.perf_counter() - t0)
    return best


def time_compiled(fn, st: Seqs, steps: int) -> float:
    best = float("inf")
    ids = torch.full((st.batch,), 5, dtype=torch.int64)
    for s in range(steps):
        n = st.ctx + s
        t0 = time.perf_counter()
        with torch.inference_mode():
            fn(ids, torch.full((st.batch,), n, dtype=torch.int64), st.slots[:, n].contiguous(),
               st.slots[:, :n + 1].contiguous(), torch.full((st.batch,), n + 1, dtype=torch.int64),
               st.pool.k_buffer, st.pool.v_buffer)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="128,544,2048")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--compile-modes", default="default,max-autotune-no-cudagraphs")
    ap.add_argument("--attention", default="sum", choices=["sum", "sdpa"],
                    help="decode_step_fn attention: 'sum' (inductor can fuse the gather) or 'sdpa'")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    from torch._dynamo.utils import counters
    hf = AutoModelForCausalLM.from_pretrained(resolve_model("default"), dtype=torch.float32).eval()
    native = NativeLlama.from_hf(hf, "fp32")
    step = native.decode_step_fn(args.attention)
    from benchmarks.bench_engine import corpus_text
    from transformers import AutoTokenizer
    text = AutoTokenizer.from_pretrained(resolve_model("default")).encode(corpus_text(), add_special_tokens=False)
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    compiled = {}
    for mode in [m for m in args.compile_modes.split(",") if m]:
        torch._dynamo.reset()
        fn = torch.compile(step, dynamic=True, mode=None if mode == "default" else mode)
        st = Seqs(native, text[:64], 1, 2)
        t0 = time.perf_counter()
        time_compiled(fn, st, 1)
        first = time.perf_counter() - t0
        compiled[mode] = (fn, first)
        print(f"compile [{mode}]: first call {first:.1f} s", flush=True)
    print(f"\nfastest decode step, ms ({args.threads} threads, {args.steps} steps each; tok/s = B / step)")
    print(f"{'':14s}" + "".join(f"{name:>16s}" for name in ["eager torch", "eager + C"] + list(compiled)))
    for ctx in contexts:
        for b in batches:
            st = Seqs(native, text[1000:1000 + ctx], b, args.steps)
            row = []
            previous = native_kernels.set_enabled(False)
            try:
                row.append(time_eager(native, st, args.steps))
            finally:
                native_kernels.set_enabled(previous)
            row.append(time_eager(native, st, args.steps))
            for mode, (fn, _) in compiled.items():
                before = counters["stats"]["unique_graphs"]
                row.append(time_compiled(fn, st, args.steps))
                new_graphs = counters["stats"]["unique_graphs"] - before
                if new_graphs:
                    print(f"  ({mode}: {new_graphs} new graph(s) compiled at ctx {ctx}, B={b})")
            print(f"ctx {ctx:5d} B={b}  " + "".join(f"{t * 1e3:13.1f} ms" for t in row), flush=True)
    # check the compiled step computes the same logits as the eager one
    st = Seqs(native, text[:100], 1, 2)
    pool_copy = (st.pool.k_buffer.clone(), st.pool.v_buffer.clone())
    eager = native.forward(ForwardBatch.build([([5], st.slots[0, :100], st.slots[0, 100:101])]), st.pool)
    st.pool.k_buffer.copy_(pool_copy[0])
    st.pool.v_buffer.copy_(pool_copy[1])
    for mode, (fn, _) in compiled.items():
        with torch.inference_mode():
            got = fn(torch.tensor([5]), torch.tensor([100]), st.slots[:, 100].contiguous(),
                     st.slots[:, :101].contiguous(), torch.tensor([101]), st.pool.k_buffer, st.pool.v_buffer)
        print(f"[{mode}] max |logits - eager| = {(got - eager).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
