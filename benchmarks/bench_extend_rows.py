"""A decode plus an n-token extend deep into a prompt, one forward of the default model (int8): the extend's
new tokens as rows of the C kernel (each prefix key read once for all of them, from the pool) against the
gather + SDPA path it replaced (ROW_KERNEL_MAX_QUERIES = 0). What the fairness step budget pays per token.

    .venv/bin/python benchmarks/bench_extend_rows.py --prefix 1500 --threads 2
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=1500)
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    from core.engine.model import native_layers
    from core.engine.model.forward_batch import ForwardBatch
    from core.engine.model.runner import ModelRunner
    native = ModelRunner("default", device="cpu", impl="native", numerics="int8").native
    p = args.prefix
    pool = native.make_pool(p + 900)
    ids = torch.randint(1, 40000, (p + 700,), generator=torch.Generator().manual_seed(0)).tolist()
    long_slots, dec_slots = torch.arange(1, p + 50), torch.arange(p + 100, p + 500)
    native.forward(ForwardBatch.build([(ids[:p], [], long_slots[:p])]), pool)
    native.forward(ForwardBatch.build([(ids[:300], [], dec_slots[:300])]), pool)
    decode = ([5], dec_slots[:300], dec_slots[300:301])

    def best_ms(batch: ForwardBatch) -> float:
        native.forward(batch, pool)
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            native.forward(batch, pool)
            times.append(time.perf_counter() - t)
        return min(times) * 1000

    kernel_max = native_layers.ROW_KERNEL_MAX_QUERIES
    print(f"decode alone: {best_ms(ForwardBatch.build([decode])):.1f} ms")
    for n in map(int, args.tokens.split(",")):
        batch = ForwardBatch.build([decode, (ids[p:p + n], long_slots[:p], long_slots[p:p + n])])
        row = best_ms(batch)
        native_layers.ROW_KERNEL_MAX_QUERIES = 0
        try:
            gather = best_ms(batch)
        finally:
            native_layers.ROW_KERNEL_MAX_QUERIES = kernel_max
        print(f"decode + {n:2d}-token extend at prefix {p}: kernel rows {row:6.1f} ms, gather + SDPA {gather:6.1f} ms "
              f"({gather / row:.2f}x)")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
