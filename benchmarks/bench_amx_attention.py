"""A prefill's causal attention, one layer of SmolLM2's shape (9 query heads over 3 KV heads, head_dim 64): the
engine's AMX kernel (native_kernels.amx_attention, what the int8 model runs) against torch's CPU flash kernel
(`F.scaled_dot_product_attention(..., is_causal=True)`, what HF generate and the fp32 model run), side by side in
one process, and each one's largest error against float64 attention.

    .venv/bin/python benchmarks/bench_amx_attention.py --threads 2 [--sizes 1024,2048,4096] [--prefix 0]

--prefix P: the queries come after P cached keys (a long prompt's second chunk: P = 2,048), one call over all keys.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.bench_int8_gemm import best_ms  # noqa: E402
from core.engine.model import native_kernels  # noqa: E402


def torch_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    n, m = q.shape[0], k.shape[0]
    qq, kk, vv = (x.transpose(0, 1)[None] for x in (q, k, v))
    if n == m:
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="1024,2048,4096", help="new tokens (queries) per call")
    ap.add_argument("--prefix", type=int, default=0, help="cached keys before the queries")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native_kernels.amx_attention_fits(torch.device("cpu"), 9, 3, 64):
        raise SystemExit(f"no AMX attention here (kernels: {native_kernels.error() or 'built'}; AMX tiles: "
                         f"{native_kernels.amx_available()}): nothing to compare")
    heads, kv_heads, d, scale = 9, 3, 64, 0.125
    print(f"causal attention, {heads} heads over {kv_heads} KV heads, head_dim {d}, {args.prefix} cached keys "
          f"first, {args.threads} threads, fastest of {args.reps}; error: max |out - float64| / max |v|")
    print(f"{'queries':>8} {'AMX ms':>8} {'torch ms':>9} {'speed-up':>9} {'AMX error':>10} {'torch error':>12}")
    for n in (int(s) for s in args.sizes.split(",")):
        m = args.prefix + n
        g = torch.Generator().manual_seed(n)
        q = torch.randn(n, heads, d, generator=g) * 2
        k, v = torch.randn(m, kv_heads, d, generator=g) * 2, torch.randn(m, kv_heads, d, generator=g)
        amx = best_ms(lambda: native_kernels.amx_attention(q, k, v, scale), args.reps)
        ref = best_ms(lambda: torch_causal(q, k, v, scale), args.reps)
        exact = torch_causal(q.double(), k.double(), v.double(), scale)
        err_amx = float((native_kernels.amx_attention(q, k, v, scale).double() - exact).abs().max() / v.abs().max())
        err_ref = float((torch_causal(q, k, v, scale).double() - exact).abs().max() / v.abs().max())
        print(f"{n:>8} {amx:>8.2f} {ref:>9.2f} {ref / amx:>8.2f}x {err_amx:>10.1e} {err_ref:>12.1e}")


if __name__ == "__main__":
    main()
