"""The int8 projections of a prefill on SmolLM2-135M's shapes, side by side in one process: the FMA kernel
(`w8_gemv`, what decode rows run), the AMX kernel (`w8_amx_gemm`: each row's x16 as two bf16, the same exact
products), the weight-panel kernel a CPU without AMX runs for prefill rows (`w8_panel_gemm`, the same products),
and torch's fp32 matmul on the dequantized weights (MKL: what Hugging Face fp32 runs). Also
oneDNN's bf16 matmul on one bf16 per activation, for scale only: it rounds x to 8 bits and its output, so it is
not the same arithmetic (the 42/50 cache on == off of benchmarks/README.md). Milliseconds, fastest of --reps; each
shape's weights as the model holds them. Then the projections of one decode step (30 layers of SmolLM2's shapes
and its int8 LM head, one row of x, 134 MB of weights that no cache holds) with `w8_gemv` prefetching the weight
rows 4 KB ahead and without, alternating; a step's projections at 1..32 rows on each kernel (`--only step-rows`:
that section alone); then one whole uncached prefill of the default model with the AMX
kernel, as a CPU without AMX runs it (`set_amx(False)`: weight panels) and with every row through the FMA kernel
(AMX_MIN_ROWS raised), the same process.

    .venv/bin/python benchmarks/bench_int8_gemm.py --threads 2
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def best_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def decode_step(g, reps: int) -> None:
    """A decode step's int8 projections (30 layers + LM head, one row), weight prefetch on and off, alternating."""
    import torch
    from core.engine.model import native_int8
    layers = [[(torch.randint(-127, 128, shape, dtype=torch.int8, generator=g), torch.rand(shape[0], generator=g))
               for shape in SHAPES.values()] for _ in range(30)]
    layers.append([(torch.randint(-127, 128, (49152, 576), dtype=torch.int8, generator=g), torch.rand(49152))])
    xs = {k: torch.randn(1, k, generator=g) for k in (576, 1536)}
    nbytes = sum(w.numel() for layer in layers for w, _ in layer)

    def step() -> None:
        for layer in layers:
            for w, s in layer:
                native_int8.w8_gemv(xs[w.shape[1]], w, s, None)

    best = {4096: float("inf"), 0: float("inf")}
    for _ in range(3):
        for ahead in best:
            native_int8.set_w8_prefetch(ahead)
            best[ahead] = min(best[ahead], best_ms(step, reps))
    native_int8.set_w8_prefetch(4096)
    print(f"\ndecode step's projections ({nbytes / 1e6:.0f} MB of int8 weights, one row), ms (fastest):")
    print(f"  prefetch 4 KB ahead {best[4096]:.2f} ({nbytes / best[4096] / 1e6:.1f} GB/s), none {best[0]:.2f} "
          f"({nbytes / best[0] / 1e6:.1f} GB/s): {best[0] / best[4096]:.2f}x")


def decode_batches(g, reps: int) -> None:
    """A decode step's layer projections (30 layers of SmolLM2's shapes) for 1..8 rows, `w8_gemv` with one channel
    at a time up to 8 rows (what it ran before) against blocks of 4 channels x 4 rows from 3 rows (w8_row_max 2,
    the default), alternating."""
    import torch
    from core.engine.model import native_int8
    mats = [[native_int8.Int8Matrix(torch.randint(-127, 128, shape, dtype=torch.int8, generator=g).contiguous(),
                                    torch.rand(shape[0], generator=g).contiguous(), None) for shape in SHAPES.values()]
            for _ in range(30)]
    print("\ndecode batches: 30 layers' projections, ms (fastest), w8_row_max 8 vs 2 (default)")
    default = native_int8.set_w8_row_max(2)
    try:
        for m in range(1, 9):
            xs = {k: torch.randn(m, k, generator=g) for k in (576, 1536)}

            def step() -> None:
                for layer in mats:
                    for mat in layer:
                        mat.gemv(xs[mat.k])
            best = {8: float("inf"), 2: float("inf")}
            for _ in range(3):
                for row_max in best:
                    native_int8.set_w8_row_max(row_max)
                    best[row_max] = min(best[row_max], best_ms(step, reps))
            print(f"  {m} rows: row_max 8 {best[8]:.2f}, row_max 2 {best[2]:.2f}: {best[8] / best[2]:.2f}x", flush=True)
    finally:
        native_int8.set_w8_row_max(default)


def step_rows(g, reps: int) -> None:
    """Where AMX_MIN_ROWS and PANEL_MIN_ROWS come from: a step's layer projections (30 layers of SmolLM2's
    shapes) for 1..32 rows on the FMA kernel (every row its own pass of int8 -> fp32 work), on the AMX tiles (two
    bf16 per x: a flat price up to 32 rows) and on weight panels (no AMX), alternating."""
    import torch
    from core.engine.model import native_int8
    layers = [[torch.randint(-127, 128, shape, dtype=torch.int8, generator=g) for shape in SHAPES.values()]
              for _ in range(30)]
    mats = [[(native_int8.Int8Matrix(w.contiguous(), torch.rand(w.shape[0], generator=g).contiguous(), None),
              native_int8.pack_amx(w), native_int8.pack_panels(w)) for w in layer] for layer in layers]
    print("\nstep rows: 30 layers' projections, ms (fastest): FMA (w8_gemv) vs AMX tiles vs weight panels")
    for m in (1, 4, 8, 10, 12, 16, 24, 32):
        xs = {k: torch.randn(m, k, generator=g) for k in (576, 1536)}
        runs = {
            "FMA": lambda: [mat.gemv(xs[mat.k]) for layer in mats for mat, _, _ in layer],
            "AMX": lambda: [native_int8.w8_amx_gemm(xs[mat.k], tiles, mat.scales, None)
                            for layer in mats for mat, tiles, _ in layer],
            "panels": lambda: [native_int8.w8_panel_gemm(xs[mat.k], panels, mat.scales, None)
                               for layer in mats for mat, _, panels in layer]}
        best = {name: float("inf") for name in runs}
        for _ in range(3):
            for name, fn in runs.items():
                best[name] = min(best[name], best_ms(fn, reps))
        print(f"  {m:2d} rows: FMA {best['FMA']:6.2f}  AMX {best['AMX']:6.2f}  panels {best['panels']:6.2f}   "
              f"FMA / AMX {best['FMA'] / best['AMX']:.2f}x  FMA / panels {best['FMA'] / best['panels']:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="32,256,1024,2048")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--prefill", default="1024,2048", help="uncached prompt sizes of the whole-model run")
    ap.add_argument("--only", choices=["step-rows"], help="run one section alone")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    from core.engine.model import native_int8, native_kernels, native_linear
    from core.engine.model.forward_batch import ForwardBatch
    from core.engine.model.runner import ModelRunner
    if not native_kernels.amx_available():
        sys.exit(f"no AMX here (kernels: {native_kernels.error() or 'built without AMX'}); nothing to compare")
    g = torch.Generator().manual_seed(0)
    if args.only == "step-rows":
        step_rows(g, args.reps)
        return
    print(f"int8 projections, {args.threads} threads, ms (fastest of {args.reps}); ratios against the FMA kernel")
    print(f"{'shape':>8} {'rows':>5} {'FMA w8_gemv':>12} {'AMX x2':>8} {'panels':>7} {'MKL fp32':>9} {'bf16 x1':>8}  "
          f"{'AMX speed-up':>12} {'AMX vs MKL':>10} {'panels vs MKL':>13}")
    for name, (n, k) in SHAPES.items():
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        s = torch.rand(n, generator=g) * 0.01
        packed, dense, w16 = native_int8.pack_amx(w), (w.float() * s[:, None]).t().contiguous(), w.bfloat16()
        panels = native_int8.pack_panels(w)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, generator=g)
            fma = best_ms(lambda: native_int8.w8_gemv(x, w, s, None), args.reps)
            amx = best_ms(lambda: native_int8.w8_amx_gemm(x, packed, s, None), args.reps)
            pan = best_ms(lambda: native_int8.w8_panel_gemm(x, panels, s, None), args.reps)
            mkl = best_ms(lambda: x @ dense, args.reps)
            b16 = best_ms(lambda: F.linear(x.bfloat16(), w16), args.reps)
            print(f"{name:>8} {m:5d} {fma:12.2f} {amx:8.2f} {pan:7.2f} {mkl:9.2f} {b16:8.2f}  {fma / amx:11.2f}x "
                  f"{mkl / amx:9.2f}x {mkl / pan:12.2f}x", flush=True)
    decode_step(g, args.reps)
    decode_batches(g, args.reps)
    step_rows(g, args.reps)
    native = ModelRunner("default", device="cpu", impl="native", numerics="int8").native
    print("\nwhole uncached prefill of the default model (int8), s, fastest of 3, alternating")
    for n in (int(v) for v in args.prefill.split(",")):
        ids = torch.randint(100, 40000, (n,), generator=g).tolist()
        pool = native.make_pool(n + 8)
        batch = ForwardBatch.build([(ids, [], torch.arange(1, n + 1))])
        best = {"AMX": float("inf"), "panels": float("inf"), "FMA": float("inf")}
        for _ in range(3):
            for mode, rows, amx in (("AMX", native_linear.AMX_MIN_ROWS, True),
                                    ("panels", native_linear.AMX_MIN_ROWS, False), ("FMA", 10 ** 9, True)):
                saved = native_linear.AMX_MIN_ROWS, native_linear.PANEL_MIN_ROWS
                native_linear.AMX_MIN_ROWS = native_linear.PANEL_MIN_ROWS = rows
                was = native_kernels.set_amx(amx)
                try:
                    t = time.perf_counter()
                    native.forward(batch, pool)
                    best[mode] = min(best[mode], time.perf_counter() - t)
                finally:
                    native_linear.AMX_MIN_ROWS, native_linear.PANEL_MIN_ROWS = saved
                    native_kernels.set_amx(was)
        print(f"{n:5d} tokens: AMX {best['AMX']:.2f} s, panels (no AMX) {best['panels']:.2f} s, FMA {best['FMA']:.2f} s; "
              f"FMA / AMX {best['FMA'] / best['AMX']:.2f}x, FMA / panels {best['FMA'] / best['panels']:.2f}x")


if __name__ == "__main__":
    main()
