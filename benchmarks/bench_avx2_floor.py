"""How fast prefill's projections can be on an AVX2 CPU without AVX-512 (AMD Zen 2 and 3, Intel before Ice Lake): the
products a cycle a core that the instructions themselves allow, beside what `w8a16_gemm` (the int8 model's exact
int16 x int8 projections) and torch's fp32 GEMM (Hugging Face's projections) reach on the default model's shapes.

Why: issue 25 asks prefill for 2x HF fp32, and on this CPU class the int8 model's prefill stays near 1.5x. Without
VPDPWSSD (AVX512-VNNI) an exact int16 product sum is VPMADDWD (16 products, each pair summed) then VPADDD into the
sum. This says whether a better register blocking of `a16_block` could still pay, or whether the instruction mix
itself is the bound:

  fp32 FMA, registers      12 independent VFMADD231PS: the fp32 peak HF's GEMM aims at (8 products each)
  fp32 FMA, GEMM loop      a 6 x 16 fp32 register block: 2 weight loads, 6 broadcasts, 12 FMAs
  madd + add, registers    12 VPMADDWD, each added into its sum by VPADDD: the exact int16 floor (16 products each)
  a16_block's loop         the same, plus its 2 weight widenings (VPMOVSXBW) and 6 broadcasts, as compiled
  pre-widened 2 x 32       weights widened once into L1 and loaded (4 loads), 2 rows x 32 channels: 8 VPMADDWD,
                           2 broadcasts (a blocking tried on 2026-12-06; it has fewer instructions a product)
  int8 activations         VPMADDUBSW (32 products) widened by VPMADDWD with ones, then VPADDD: W8A8's loop where
                           one side is unsigned (its pair sums then overflow int16 unless one side has 7 bits)
  int8, signed (VPSIGNB)   the same with the weights' signs moved onto the activations first (|w| x sign(w) x),
                           the exact form for two signed int8 sides (llama.cpp's q8 dot products on AVX2)
  8 VPMADDWD alone / with 6 FMAs beside (independent; products counted for the VPMADDWD only): whether the
                           integer multiplies and the fp32 FMAs share pipes (the attention's softmax runs its exp on
                           FMAs between the VPMADDWD of its scores and V sums)

The loops are inline assembly (what is measured is exactly those instructions), 20 M iterations, fastest of the
rounds; a cycle is measured by a chain of dependent multiplies. The kernels run on one thread on [1,024 rows, K] x
[N, K]^T for the default model's projections, each keeping its fastest round, alternating.

    .venv/bin/python benchmarks/bench_avx2_floor.py --rounds 3
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cycle_clock import CLOCK_C  # noqa: E402
from core.engine.model import native_kernels  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}   # N, K (SmolLM2-135M)


def _madd_add(w: int, x: int, acc: int) -> str:
    """acc += VPMADDWD(w, x), through ymm15 (the compiled kernel's temporary)"""
    return f"vpmaddwd %%ymm{x}, %%ymm{w}, %%ymm15\n\tvpaddd %%ymm15, %%ymm{acc}, %%ymm{acc}\n\t"


def _loops() -> dict[str, tuple[str, int]]:
    """name -> (the loop body in AT&T assembly, products an iteration); %1 points at 4 KB of readable bytes"""
    fma_regs = "".join(f"vfmadd231ps %%ymm14, %%ymm15, %%ymm{i}\n\t" for i in range(12))
    fma_gemm = "vmovups (%1), %%ymm12\n\tvmovups 32(%1), %%ymm13\n\t" + "".join(
        f"vbroadcastss {64 + 4 * r}(%1), %%ymm14\n\tvfmadd231ps %%ymm14, %%ymm12, %%ymm{2 * r}\n\t"
        f"vfmadd231ps %%ymm14, %%ymm13, %%ymm{2 * r + 1}\n\t" for r in range(6))
    madd_regs = "".join(_madd_add(12 + (i % 2), 14, i) for i in range(12))
    a16 = "vpmovsxbw (%1), %%ymm12\n\tvpmovsxbw 16(%1), %%ymm13\n\t" + "".join(
        f"vpbroadcastd {64 + 4 * r}(%1), %%ymm14\n\t" + _madd_add(12, 14, 2 * r) + _madd_add(13, 14, 2 * r + 1)
        for r in range(6))
    wide = "".join(f"vmovdqa {32 * h}(%1), %%ymm{8 + h}\n\t" for h in range(4)) + "".join(
        f"vpbroadcastd {256 + 4 * r}(%1), %%ymm12\n\t" + "".join(_madd_add(8 + h, 12, 4 * r + h) for h in range(4))
        for r in range(2))
    int8 = "".join(f"vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\tvpmaddwd %%ymm13, %%ymm15, %%ymm15\n\t"
                   f"vpaddd %%ymm15, %%ymm{i}, %%ymm{i}\n\t" for i in range(12))
    signed = "".join(f"vpsignb %%ymm{12 + (i % 2)}, %%ymm14, %%ymm15\n\tvpmaddubsw %%ymm15, %%ymm12, %%ymm15\n\t"
                     f"vpmaddwd %%ymm13, %%ymm15, %%ymm15\n\tvpaddd %%ymm15, %%ymm{i}, %%ymm{i}\n\t" for i in range(12))
    madd8 = "".join(f"vpmaddwd %%ymm14, %%ymm12, %%ymm{i}\n\t" for i in range(8))
    beside = "".join(f"vpmaddwd %%ymm14, %%ymm12, %%ymm{i}\n\t" + (f"vfmadd231ps %%ymm14, %%ymm15, %%ymm{8 + i}\n\t"
                                                                  if i < 6 else "") for i in range(8))
    return {"fp32 FMA, registers": (fma_regs, 12 * 8), "fp32 FMA, GEMM loop": (fma_gemm, 12 * 8),
            "madd + add, registers": (madd_regs, 12 * 16), "a16_block's loop": (a16, 12 * 16),
            "pre-widened 2 x 32": (wide, 8 * 16), "int8 activations": (int8, 12 * 32),
            "int8, signed (VPSIGNB)": (signed, 12 * 32), "8 VPMADDWD alone": (madd8, 8 * 16),
            "8 VPMADDWD, 6 FMAs beside": (beside, 8 * 16)}


PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
CLOCK
static char buf[4096] __attribute__((aligned(64)));
int main(int argc, char **argv) {   /* argv[1]: a loop's number, or "cycle"; prints seconds an iteration */
    if (!strcmp(argv[1], "cycle")) {
        printf("%.6e\n", seconds_a_cycle(640000000));
        return 0;
    }
    long it = 20000000;
    memset(buf, 1, sizeof buf);
    const double t = now();
    switch (atoi(argv[1])) {
LOOPS
    }
    printf("%.6e\n", (now() - t) / 20000000);
    return 0;
}
"""


def _c_string(body: str) -> str:
    """assembly text as the inside of a C string literal"""
    return body.replace("\n", "\\n").replace("\t", "\\t")


def build(folder: Path) -> tuple[Path, list[str]]:
    """The loops' program, compiled with the kernels' compiler; returns it and the loops' names in order."""
    loops = _loops()
    cases = "".join(f'    case {i}: __asm__ volatile("1:\\n\\t{_c_string(body)}dec %0\\n\\tjnz 1b" '
                    f': "+r"(it) : "r"(buf) : "memory"); break;\n' for i, (body, _) in enumerate(loops.values()))
    src = folder / "floor.c"
    src.write_text(PROGRAM.replace("CLOCK", CLOCK_C, 1).replace("LOOPS", cases))
    exe = folder / "floor"
    res = subprocess.run([native_kernels.compiler(), "-O2", "-mavx2", "-mfma", str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"the loops did not compile: {res.stderr.strip()[:2000]}")
    return exe, list(loops)


def run(exe: Path, arg: str) -> float:
    """seconds an iteration of loop `arg` (or a cycle, for "cycle"), as the program prints them"""
    return float(subprocess.run([str(exe), arg], capture_output=True, text=True, check=True).stdout)


def kernel_times(rounds: int) -> dict[str, tuple[float, float, int]]:
    """shape -> (w8a16_gemm seconds, torch fp32 seconds, products), one thread, fastest of alternating rounds"""
    import time

    import torch

    from core.cache.kv_pool import quantize_int8
    from core.engine.model import native_int8
    torch.set_num_threads(1)
    out = {}
    for name, (n, k) in SHAPES.items():
        g = torch.Generator().manual_seed(n + k)
        q, scales = quantize_int8(torch.randn(n, k, generator=g))   # one scale a row, as the model's weights
        pairs, wt = native_int8.pack_pairs(q), (q.float() * scales[:, None]).t().contiguous()
        x = torch.randn(1024, k, generator=g)
        runs = {"a16": lambda: native_int8.w8a16_gemm(x, pairs, scales, None), "fp32": lambda: x @ wt}
        best = {key: float("inf") for key in runs}
        for r in range(rounds):
            for key in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                runs[key]()
                start = time.perf_counter()
                runs[key]()
                best[key] = min(best[key], time.perf_counter() - start)
        out[name] = (best["a16"], best["fp32"], 1024 * n * k)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    flags = set(native_kernels.cpu_flags().split())
    if not {"avx2", "fma"} <= flags:
        raise SystemExit("this CPU has no AVX2 + FMA: nothing to measure here")
    if "avx512f" in flags:
        print("(this CPU has AVX-512: w8a16_gemm runs its VNNI or FMA build here, not the AVX2 loop measured below)")
    with tempfile.TemporaryDirectory() as tmp:
        exe, names = build(Path(tmp))
        products = [p for _, p in _loops().values()]
        cycle, best = float("inf"), {name: float("inf") for name in names}
        for _ in range(args.rounds):
            cycle = min(cycle, run(exe, "cycle"))
            for i, name in enumerate(names):
                best[name] = min(best[name], run(exe, str(i)))
    print(f"a cycle: {cycle * 1e9:.3f} ns ({1e-9 / cycle:.2f} GHz); fastest of {args.rounds} rounds, one thread\n")
    print(f"{'loop':28s} {'cycles/iter':>12s} {'products/cycle':>15s}")
    rate = {}
    for name, p in zip(names, products):
        rate[name] = p / (best[name] / cycle)
        print(f"{name:28s} {best[name] / cycle:12.2f} {rate[name]:15.1f}")
    floor, peak = rate["madd + add, registers"], rate["fp32 FMA, registers"]
    print(f"\nexact int16 floor / fp32 FMA peak: {floor / peak:.2f}x  (the most exact int16 projections can gain over "
          f"fp32 ones running at the FMA peak)")
    a16_loop = rate["a16_block's loop"]
    print(f"a16_block's loop / floor: {a16_loop / floor:.2f};  pre-widened "
          f"2 x 32 / floor: {rate['pre-widened 2 x 32'] / floor:.2f};  int8 activations / floor: "
          f"{rate['int8 activations'] / floor:.2f};  signed: {rate['int8, signed (VPSIGNB)'] / floor:.2f}")
    print(f"VPMADDWD with 6 FMAs beside, of its rate alone: "
          f"{rate['8 VPMADDWD, 6 FMAs beside'] / rate['8 VPMADDWD alone']:.2f} (1: separate pipes; 0.57: all shared)")
    print("\n== the kernels on [1,024, K] x [N, K]^T, one thread, products a cycle (fastest of alternating rounds)")
    print(f"{'shape':10s} {'w8a16_gemm':>11s} {'torch fp32':>11s} {'a16 / fp32':>11s} {'a16 / floor':>12s} "
          f"{'fp32 / FMA peak':>16s}")
    total = [0.0, 0.0, 0]
    for name, (a, f, p) in kernel_times(args.rounds).items():
        ra, rf = p / (a / cycle), p / (f / cycle)
        total = [total[0] + a, total[1] + f, total[2] + p]
        print(f"{name:10s} {ra:11.1f} {rf:11.1f} {f / a:10.2f}x {ra / floor:12.2f} {rf / peak:16.2f}")
    ra, rf = total[2] / (total[0] / cycle), total[2] / (total[1] / cycle)
    print(f"{'all four':10s} {ra:11.1f} {rf:11.1f} {total[1] / total[0]:10.2f}x {ra / floor:12.2f} {rf / peak:16.2f}")


if __name__ == "__main__":
    main()
