"""Would int8 activations (W8A8) keep the radix cache exact? Greedy agreement with HF generate fp32, and cache on ==
cache off through the Engine, over `bench_native.agreement_prompts` (32 new tokens), for weight-only int8 (the CPU
default) and for activations fake-quantised to int8 before the same kernel (one scale per row, and per block of 32):
the numerics an integer (VNNI) GEMM would have. benchmarks/README.md, "Numerics", records the result.

    .venv/bin/python benchmarks/bench_w8a8_agree.py --prompts 50
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def fake_quant_rows(x):
    import torch
    s = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127
    return torch.round(x / s).clamp(-127, 127) * s


def fake_quant_blocks(x, block: int = 32):
    import torch
    xs = x.reshape(x.shape[0], -1, block)
    s = xs.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127
    return (torch.round(xs / s).clamp(-127, 127) * s).reshape(x.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.bench_native import agreement_prompts
    from core.engine.engine import Engine
    from core.engine.model import native_linear
    from core.engine.model.loader import resolve_model
    from core.engine.model.runner import ModelRunner
    from core.engine.sampling import SamplingParams
    torch.set_num_threads(args.threads)
    n = args.tokens
    path = resolve_model("default")
    prompts = agreement_prompts(AutoTokenizer.from_pretrained(path), args.prompts)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    hf.generation_config.eos_token_id = None
    with torch.inference_mode():
        ref = [hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
               for p in prompts]
    runner = ModelRunner("default", device="cpu", impl="native", numerics="int8")
    original = native_linear.Linear.__call__
    modes = {"weight-only int8": None, "W8A8, a scale per row": fake_quant_rows,
             "W8A8, a scale per 32": fake_quant_blocks}
    try:
        for name, fq in modes.items():
            native_linear.Linear.__call__ = original if fq is None else (lambda self, x, fq=fq: original(self, fq(x)))
            outs = {}
            for disable in (False, True):
                e = Engine(runner, pool_slots=sum(len(p) + n for p in prompts) + 64, disable_radix_cache=disable,
                           max_running_requests=16)
                outs[disable] = [c.token_ids for c in e.generate(prompts, SamplingParams(max_new_tokens=n,
                                                                                          ignore_eos=True))]
            first = [next((i for i in range(n) if o[i] != x[i]), n) for o, x in zip(outs[False], ref)]
            same = sum(a == b for a, b in zip(outs[False], outs[True]))
            print(f"{name:24s}: {sum(f == n for f in first)}/{len(prompts)} identical to HF fp32; mean first "
                  f"difference {statistics.mean(first):.1f}/{n}; cache on == off {same}/{len(prompts)}", flush=True)
    finally:
        native_linear.Linear.__call__ = original


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
