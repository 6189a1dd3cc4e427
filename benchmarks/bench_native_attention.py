"""Decode attention over the KV pool ([slots, kv_heads, head_dim] per layer): is the gather the
bottleneck at long context, and what helps? One layer of SmolLM2's shape (9 query heads, 3 KV heads,
head_dim 64), one query per request, side by side in one process (fastest of --rounds):

  gather+sdpa     index_select of the request's slots (a fresh tensor each call) + SDPA
  prealloc+sdpa   index_select(out=) into a buffer reused across calls + SDPA (what core/native_layers
                  does when the C kernel is unavailable)
  C kernel        core/engine/model/decode_attention.c decode_attention: reads rows straight from the pool by slot,
                  no copy (what NativeLlama uses on CPU)

Slots are "contiguous" (one run, as a fresh pool hands them out) or "scattered" (a random
permutation of a 70,000-slot pool: the worst case, every row a cache and TLB miss).
GB/s = K and V bytes the request(s) attend to / time.

    .venv/bin/python benchmarks/bench_native_attention.py --threads 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.engine.model import native_kernels  # noqa: E402
from core.engine.model.native_layers import decode_chunks  # noqa: E402

H, KVH, D = 9, 3, 64
POOL = 70_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--contexts", default="128,544,2048,4096")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--layouts", default="contiguous,scattered")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native_kernels.available():
        raise SystemExit(f"native kernels unavailable: {native_kernels.error()}")
    print(f"{args.threads} threads; microseconds per call (fastest of {args.rounds}), GB/s of the C kernel")
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        kb = torch.randn(POOL, KVH, D, dtype=dtype)
        vb = torch.randn(POOL, KVH, D, dtype=dtype)
        for layout in args.layouts.split(","):
            for r in [int(b) for b in args.batches.split(",")]:
                for L in [int(c) for c in args.contexts.split(",")]:
                    slots = (torch.arange(r * L) + 1 if layout == "contiguous"
                             else torch.randperm(POOL - 1)[: r * L] + 1)
                    q = torch.randn(r, H, D, dtype=dtype)
                    kbuf, vbuf = torch.empty(r * L, KVH, D, dtype=dtype), torch.empty(r * L, KVH, D, dtype=dtype)

                    def sdpa(k, v):
                        return F.scaled_dot_product_attention(q[:, :, None], k.view(r, L, KVH, D).transpose(1, 2),
                                                              v.view(r, L, KVH, D).transpose(1, 2),
                                                              enable_gqa=True, scale=D ** -0.5)

                    def fresh():
                        return sdpa(kb.index_select(0, slots), vb.index_select(0, slots))

                    def prealloc():
                        return sdpa(torch.index_select(kb, 0, slots, out=kbuf), torch.index_select(vb, 0, slots, out=vbuf))

                    table = slots.view(r, L)
                    first = torch.zeros(r, dtype=torch.int64)
                    lens = torch.full((r,), L, dtype=torch.int64)
                    row_chunks, nch = decode_chunks(lens, args.threads)
                    scratch = torch.empty(r * KVH * nch * (H // KVH) * (D + 2))
                    out = torch.empty(r, H, D, dtype=dtype)

                    def kernel():
                        return native_kernels.decode_attention(q, kb, vb, table, first, lens, D ** -0.5, 0, nch,
                                                               scratch, out, row_chunks=row_chunks)

                    ref = fresh().reshape(r, H, D).float()
                    err = (kernel().float() - ref).abs().max().item()
                    fns = {"gather+sdpa": fresh, "prealloc+sdpa": prealloc, "C kernel": kernel}
                    best = {k: float("inf") for k in fns}
                    n = max(2, 4000 // L)
                    for _ in range(args.rounds):
                        for k, f in fns.items():
                            t0 = time.perf_counter()
                            for _ in range(n):
                                f()
                            best[k] = min(best[k], (time.perf_counter() - t0) / n)
                    gbs = 2 * r * L * KVH * D * kb.element_size() / best["C kernel"] / 1e9
                    print(f"{str(dtype)[6:]:8s} {layout:10s} B={r} L={L:5d}  " +
                          "  ".join(f"{k} {v * 1e6:7.0f}" for k, v in best.items()) +
                          f"   C {gbs:5.1f} GB/s  (max |diff| {err:.0e})", flush=True)


if __name__ == "__main__":
    main()
