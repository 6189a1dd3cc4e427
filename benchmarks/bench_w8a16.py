"""int16 activations on AVX512-VNNI (w8a16_gemm) against the x16 kernels they replace on a CPU without AMX, side by
side in one process: the default model's projections alone, then the whole engine (prefill and decode), each
arithmetic in its own ModelRunner (native_int8.set_w8a16 picks it when the model is built), rounds alternating,
each keeping its best round.

    .venv/bin/python benchmarks/bench_w8a16.py --threads 2

benchmarks/README.md, "int16 activations on VNNI", records a run.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def best_time(fn, reps: int, rounds: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def section_kernels(rows: list[int]) -> None:
    import torch

    from core.engine.model import native_int8
    shapes = {"qkv": (832, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
              "lm_head": (49152, 576)}
    print("\n== one projection of the default model's shape, ms (w8a16_gemm / w8_panel_gemm / w8_gemv / torch fp32)")
    for name, (n, k) in shapes.items():
        g = torch.Generator().manual_seed(n + k)
        w = torch.randn(n, k, generator=g)
        scales = w.abs().amax(dim=1) / 127
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        pairs, panels = native_int8.pack_pairs(q), native_int8.pack_panels(q)
        matrix = native_int8.Int8Matrix(q, scales, None)
        wt = (q.float() * scales[:, None]).t().contiguous()
        for m in rows:
            if name == "lm_head" and m > 8:
                continue   # the head runs on a prompt's last row only
            x = torch.randn(m, k, generator=g)
            reps = max(3, int(2e6 / (m * n)))
            a = best_time(lambda: native_int8.w8a16_gemm(x, pairs, scales, None), reps)
            p = best_time(lambda: native_int8.w8_panel_gemm(x, panels, scales, None), reps)
            v = best_time(lambda: matrix.gemv(x), reps) if m <= 32 else float("nan")
            f = best_time(lambda: x @ wt, reps)
            print(f"  {name:8s} {m:5d} rows: {a * 1e3:8.3f} / {p * 1e3:8.3f} / {v * 1e3:8.3f} / {f * 1e3:8.3f}"
                  f"   panels / a16 {p / a:5.2f}x   fp32 / a16 {f / a:5.2f}x", flush=True)


def section_engine(rounds: int, prefill: list[int], contexts: list[int]) -> None:
    from benchmarks.bench_engine import corpus_text
    from benchmarks.engine_sweep import engine_run
    from core.engine.model import native_int8
    from core.engine.model.runner import ModelRunner
    a16 = ModelRunner("default", device="cpu", numerics="int8")
    previous = native_int8.set_w8a16(False)
    try:
        x16 = ModelRunner("default", device="cpu", numerics="int8")
    finally:
        native_int8.set_w8a16(previous)
    print(f"\n== the engine, int8: a16 model {a16.native.a16}, x16 model {x16.native.a16}; {rounds} rounds alternating")
    ids = a16.tokenizer.encode(corpus_text(), add_special_tokens=False)
    best: dict[tuple, float] = {}
    for r in range(rounds):
        for name, runner in (("a16", a16), ("x16", x16)):
            for n in prefill:
                first, _ = engine_run(runner, [ids[97 * r + 7:97 * r + 7 + n]], 2)
                best[(name, f"prefill {n} (s)")] = min(best.get((name, f"prefill {n} (s)"), 1e9), first)
            for c in contexts:
                _, rest = engine_run(runner, [ids[97 * r + 9:97 * r + 9 + c]], 33)
                key = (name, f"decode B=1 ctx {c} (tok/s)")
                best[key] = max(best.get(key, 0.0), 32 / rest)
            _, rest = engine_run(runner, [ids[97 * r + 600 * i:97 * r + 600 * i + 544] for i in range(8)], 33)
            key = (name, "decode B=8 ctx 544 (tok/s)")
            best[key] = max(best.get(key, 0.0), 8 * 32 / rest)
    for label in dict.fromkeys(k[1] for k in best):
        a, x = best[("a16", label)], best[("x16", label)]
        ratio = x / a if "(s)" in label else a / x
        print(f"  {label:28s} a16 {a:8.3f}   x16 {x:8.3f}   a16 speed-up {ratio:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,8,1024")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefill", default="1024,4096")
    ap.add_argument("--contexts", default="128,544,4096")
    ap.add_argument("--sections", default="kernels,engine")
    args = ap.parse_args()
    import torch

    from core.engine.model import native_int8, native_kernels
    torch.set_num_threads(args.threads)
    if not native_int8.w8a16_available():
        raise SystemExit("w8a16_gemm does not run here (the kernels were built without AVX512-VNNI)")
    if native_kernels.amx_available():
        print("(this CPU has AMX: int8 runs the tiles there; the engine section runs as a CPU without AMX)")
        native_kernels.set_amx(False)
    sections = args.sections.split(",")
    if "kernels" in sections:
        section_kernels([int(r) for r in args.rows.split(",")])
    if "engine" in sections:
        section_engine(args.rounds, [int(n) for n in args.prefill.split(",")],
                       [int(c) for c in args.contexts.split(",")])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
