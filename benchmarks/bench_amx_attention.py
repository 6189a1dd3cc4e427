"""A prefill's causal attention, one layer of SmolLM2's shape (9 query heads over 3 KV heads, head_dim 64): the
engine's kernel (pool_attention.amx_attention on AMX tiles, or fma_attention in AVX-512 FMAs where the CPU has no
AMX: what the int8 model runs; --kernel picks, auto as the model does) against torch's CPU flash kernel
(`F.scaled_dot_product_attention(..., is_causal=True)`, what HF generate and the fp32 model run), side by side in
one process, and each one's largest error against float64 attention.

    .venv/bin/python benchmarks/bench_amx_attention.py --threads 2 [--sizes 1024,2048,4096] [--prefix 0]
    .venv/bin/python benchmarks/bench_amx_attention.py --threads 2 --kernel fma      # the AVX-512 kernel

--prefix P: the queries come after P cached keys (a long prompt's second chunk: P = 2,048), one call over all keys.
--pool-layers L: the keys read by slot out of an L-layer pool (pages of 16 slots in random order), a different
layer each call as a model step does, so they come from memory rather than cache (`attention_pool`; torch
gathers them first, as the model's torch path does): a chunk deep into a long prompt, e.g.
`--sizes 3 --prefix 5000 --pool-layers 30`.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.bench_int8_gemm import best_ms  # noqa: E402
from core.engine.model import native_kernels, pool_attention  # noqa: E402


def torch_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    n, m = q.shape[0], k.shape[0]
    qq, kk, vv = (x.transpose(0, 1)[None] for x in (q, k, v))
    if n == m:
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def pool_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, layers: int,
            reps: int, kernel: str) -> tuple[float, float]:
    """ms per call, fastest of `reps` passes over `layers` pool layers holding k, v at slots in pages of 16 in
    random order (2x the keys' slots each): (the kernel's *_attention_pool, torch gathering the keys then
    attending)."""
    import time
    m = k.shape[0]
    g = torch.Generator().manual_seed(m)
    pages = torch.randperm(2 * m // 16 + 1, generator=g)
    slots = ((pages[:, None] * 16 + torch.arange(16)).flatten() + 1)[:m].contiguous()
    k_pool = torch.zeros(layers, 2 * m + 32, *k.shape[1:])
    v_pool = torch.zeros_like(k_pool)
    k_pool[:, slots], v_pool[:, slots] = k, v

    def ours(layer: int) -> torch.Tensor:
        return pool_attention.attention_pool(kernel, q, k_pool[layer], v_pool[layer], slots, scale)

    def gathered(layer: int) -> torch.Tensor:
        return torch_causal(q, k_pool[layer][slots], v_pool[layer][slots], scale)

    best = [float("inf"), float("inf")]
    for _ in range(reps):
        for i, fn in enumerate((ours, gathered)):
            t = time.perf_counter()
            for layer in range(layers):
                fn(layer)
            best[i] = min(best[i], (time.perf_counter() - t) / layers * 1e3)
    return best[0], best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="1024,2048,4096", help="new tokens (queries) per call")
    ap.add_argument("--prefix", type=int, default=0, help="cached keys before the queries")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pool-layers", type=int, default=0, help="read the keys by slot from a pool of this many "
                    "layers, a new layer each call (0: one contiguous K/V, reused)")
    ap.add_argument("--kernel", default="auto", choices=("auto", "amx", "fma"),
                    help="the engine's kernel to time: auto (what the int8 model runs here), amx or fma")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    kernel = pool_attention.prefill_kernel(cpu, 9, 3, 64) if args.kernel == "auto" else args.kernel
    fits = {"amx": pool_attention.amx_attention_fits, "fma": pool_attention.fma_attention_fits}
    if kernel is None or not fits[kernel](cpu, 9, 3, 64):
        raise SystemExit(f"no {kernel or 'C'} attention kernel here (kernels: {native_kernels.error() or 'built'}; "
                         f"AMX tiles: {native_kernels.amx_available()}): nothing to compare")
    heads, kv_heads, d, scale = 9, 3, 64, 0.125

    def contiguous(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if kernel == "amx":
            return pool_attention.amx_attention(q, k, v, scale)
        return pool_attention.attention_pool("fma", q, k, v, torch.arange(k.shape[0]), scale)

    where = f"keys by slot from a {args.pool_layers}-layer pool, a new layer a call" if args.pool_layers else "keys reused"
    print(f"causal attention, {heads} heads over {kv_heads} KV heads, head_dim {d}, {args.prefix} cached keys "
          f"first, {args.threads} threads, fastest of {args.reps}, {where}; error: max |out - float64| / max |v|")
    print(f"{'queries':>8} {kernel + ' ms':>8} {'torch ms':>9} {'speed-up':>9} {kernel + ' error':>10} "
          f"{'torch error':>12}")
    for n in (int(s) for s in args.sizes.split(",")):
        m = args.prefix + n
        g = torch.Generator().manual_seed(n)
        q = torch.randn(n, heads, d, generator=g) * 2
        k, v = torch.randn(m, kv_heads, d, generator=g) * 2, torch.randn(m, kv_heads, d, generator=g)
        if args.pool_layers:
            amx, ref = pool_ms(q, k, v, scale, args.pool_layers, args.reps, kernel)
        else:
            amx = best_ms(lambda: contiguous(q, k, v), args.reps)
            ref = best_ms(lambda: torch_causal(q, k, v, scale), args.reps)
        exact = torch_causal(q.double(), k.double(), v.double(), scale)
        err_amx = float((contiguous(q, k, v).double() - exact).abs().max() / v.abs().max())
        err_ref = float((torch_causal(q, k, v, scale).double() - exact).abs().max() / v.abs().max())
        print(f"{n:>8} {amx:>8.2f} {ref:>9.2f} {ref / amx:>8.2f}x {err_amx:>10.1e} {err_ref:>12.1e}")


if __name__ == "__main__":
    main()
