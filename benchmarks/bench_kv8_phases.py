"""Where a decode step's int8-pool attention spends its time: `kv8_decode` (kv8_attention.c) compiled into a small
C program, once whole and once without each phase of a block (the scores `block_dots`, the softmax steps
`block_weights`, the weighted V sums `block_values`, and all three), so that each phase's cost is the difference.

Why: the decode attention at 4,096 tokens of context is what keeps decode from being flat in context (issue 25).
This says which phase to work on, and whether the keys coming from memory cost more than the arithmetic:

  L2     one request of 576 and of 1,088 keys, called again and again (its K/V stay in L2): the cost of the 512 keys
         between them, per key and query head ("key-row"), one thread;
  L3     30 layers of 1,024 keys (12 MB);   DRAM  30 layers of 4,096 keys (47 MB, past a 32 MB L3), as a decode step
         reads them, beside a plain read of the same bytes the same way (the pace the memory allows). In the engine the
         weights stream between two layers' attention, so its K/V come from DRAM all the more.

The shape is SmolLM2-135M's (9 query heads, 3 KV heads, head dim 64), batch 1, slots in one run. Cycles are
measured, not assumed: a chain of dependent multiplies gives the nanoseconds of a cycle. The variants alternate, each
keeping its fastest round (a busy neighbour only ever slows a run). A phase left out leaves wrong outputs: only the
times mean anything.

    .venv/bin/python benchmarks/bench_kv8_phases.py --rounds 3

With `--base REV` the whole kernel of another git revision is timed beside the working tree's instead, both in one
process taking turns, in L2, over 30 layers (in L3 here, or not), and after a weights-sized stream on 1 and 2
threads: a change to the kernel seen without the rest of the engine, with its outputs compared bit for bit.
`--march haswell` builds the AVX2 kernels (on a CPU with AVX-512 too).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_kernels_ab import sources_at  # noqa: E402
from benchmarks.cycle_clock import CLOCK_C  # noqa: E402
from core.engine.model import native_kernels  # noqa: E402

INF = float("inf")
KERNELS = ROOT / "core" / "engine" / "model"
# each phase's call in head_block (kv8_attention.c), and what stands in for it when left out
PHASES = {
    "DOTS": ("        block_dots(q, qsum, n, b, transposed, (keys + 15) / 16 * 16, D, b->dots);\n", ""),
    "WEIGHTS": ("        block_weights(b->dots, qc, b, seen, n, D, mx + r0, sum + r0, o + (int64_t)r0 * D, b->wq, ws, "
                "corr, need);\n", "        for (int r = 0; r < n; r++) { need[r] = 1; ws[r] = 1e-9f; corr[r] = 1.f; }\n"),
    "VALUES": ("        block_values(b->wq, n, b, transposed, pairs, D, b->acc);\n", ""),
}
VARIANTS = {"whole": [], "without dots": ["DOTS"], "without weights": ["WEIGHTS"], "without values": ["VALUES"],
            "without all three": ["DOTS", "WEIGHTS", "VALUES"]}

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kv8_attention.c"
CLOCK
int main(int argc, char **argv) {   /* n keys, L layers, seconds: the fastest pass over the L layers, in seconds */
    if (argc == 2) {   /* the seconds of a cycle, over argv[1] cycles of dependent multiplies */
        printf("%.6e\n", seconds_a_cycle(atol(argv[1])));
        return 0;
    }
    const int n = atoi(argv[1]), L = atoi(argv[2]), H = 9, KVH = 3, D = 64;
    const double secs = atof(argv[3]);
    const size_t rows = (size_t)(n + 1) * KVH;
    int8_t *k = malloc(rows * D * L), *v = malloc(rows * D * L);
    float *ks = malloc(sizeof(float) * rows * L), *vs = malloc(sizeof(float) * rows * L);
    int64_t *slots = malloc(sizeof(int64_t) * n), lens = n;
    srand(1);
    for (size_t i = 0; i < rows * D * L; i++) { k[i] = rand() % 255 - 127; v[i] = rand() % 255 - 127; }
    for (size_t i = 0; i < rows * L; i++) { ks[i] = 0.01f + (rand() % 100) * 1e-4f; vs[i] = 0.01f; }
    for (int i = 0; i < n; i++) slots[i] = i + 1;
    float q[9 * 64], out[9 * 64];
    for (int i = 0; i < 9 * 64; i++) q[i] = (rand() % 2000 - 1000) * 1e-3f;
    if (argc == 5) {   /* "read": the fastest plain pass over the same K and V bytes (the memory's pace) */
        const size_t bytes = rows * D * L;
        double best = 1e9, t0 = now();
        long sum = 0;
        while (now() - t0 < secs) {
            const double t = now();
            #pragma omp parallel for reduction(+ : sum) schedule(static)
            for (size_t c = 0; c < bytes / 4096; c++) {
                __m256i a = _mm256_setzero_si256();
                for (size_t i = c * 4096; i < c * 4096 + 4096; i += 32)
                    a = _mm256_add_epi8(_mm256_add_epi8(a, _mm256_loadu_si256((const __m256i *)(k + i))),
                                        _mm256_loadu_si256((const __m256i *)(v + i)));
                sum += _mm256_extract_epi8(a, 0);
            }
            const double e = now() - t;
            best = e < best ? e : best;
        }
        printf("%.6e %ld\n", best, sum);
        return 0;
    }
    const int reps = (int)(2e5 / ((double)n * L)) + 1;
    double best = 1e9, t0 = now();
    while (now() - t0 < secs) {
        const double t = now();
        for (int r = 0; r < reps; r++)
            for (int l = 0; l < L; l++)
                kv8_decode(q, 0, k + rows * D * l, v + rows * D * l, ks + rows * l, vs + rows * l, slots, n, &lens,
                           out, 0, 1, H, KVH, D, 0.125f);
        const double e = (now() - t) / reps;
        best = e < best ? e : best;
    }
    printf("%.6e\n", best);
    return 0;
}
"""


def copy_kernel(folder: Path, leave_out: list[str], kernels: Path = KERNELS) -> None:
    """kv8_attention.c, w8_x16.c and the headers from `kernels` (the working tree's, or another revision's copies)
    into a new `folder`, with the `leave_out` phases replaced by their stand-ins."""
    folder.mkdir()
    for f in [kernels / "kv8_attention.c", kernels / "w8_x16.c", *kernels.glob("*.h")]:
        text = f.read_text()
        if f.name == "kv8_attention.c":
            for phase in leave_out:
                call, stand_in = PHASES[phase]
                if text.count(call) != 1:
                    raise SystemExit(f"kv8_attention.c no longer has head_block's {phase} call as this script knows "
                                     f"it; update PHASES")
                text = text.replace(call, stand_in)
        (folder / f.name).write_text(text)


def build(folder: Path, leave_out: list[str]) -> Path:
    """The harness over a copy of the kernel with the `leave_out` phases replaced by their stand-ins."""
    copy_kernel(folder, leave_out)
    (folder / "harness.c").write_text(HARNESS.replace("CLOCK", CLOCK_C, 1))
    flags = [f for f in native_kernels.FLAGS if f not in ("-shared", "-fPIC")]
    subprocess.run([native_kernels.compiler(), *flags, "-D_GNU_SOURCE", "harness.c", "w8_x16.c", "-o", "harness",
                    "-lm"], cwd=folder, check=True)
    return folder / "harness"


def run(exe: Path, *args: object, threads: int = 1) -> float:
    out = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, check=True,
                         env={"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"})
    return float(out.stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--base", help="time the whole kernel of this git revision beside the working tree's instead, in "
                                   "one process: did a change to kv8_attention.c make it faster, and where?")
    ap.add_argument("--passes", type=int, default=100, help="--base: passes over the layers a kernel and regime")
    ap.add_argument("--march", default="native", help="the harnesses' -march (e.g. haswell: the AVX2 kernels on a CPU "
                                                      "with AVX-512)")
    args = ap.parse_args()
    native_kernels.FLAGS[native_kernels.FLAGS.index("-march=native")] = f"-march={args.march}"
    with tempfile.TemporaryDirectory() as tmp:
        if args.base:
            side_by_side(Path(tmp), args.base, args.passes)
            return
        exes = {name: build(Path(tmp) / f"v{i}", out) for i, (name, out) in enumerate(VARIANTS.items())}
        best: dict = {}
        for _ in range(args.rounds):
            best["cycle"] = min([best.get("cycle", INF)] + [run(exes["whole"], 300_000_000) for _ in range(3)])
            for name, exe in exes.items():
                for n in (576, 1088):
                    best[(name, n)] = min(best.get((name, n), INF), run(exe, n, 1, args.seconds))
            for regime, n, threads in (("L3", 1024, 1), ("DRAM", 4096, 1), ("DRAM, 2 threads", 4096, 2)):
                best[regime] = min(best.get(regime, INF), run(exes["whole"], n, 30, args.seconds, threads=threads))
            for threads in (1, 2):
                best[("read", threads)] = min(best.get(("read", threads), INF),
                                              run(exes["whole"], 4096, 30, args.seconds, "read", threads=threads))
        cycle = best["cycle"]
        print(f"a cycle: {cycle * 1e9:.3f} ns ({1 / cycle / 1e9:.2f} GHz); one thread unless said")
        for name in VARIANTS:
            best[(name, "L2")] = (best[(name, 1088)] - best[(name, 576)]) / (512 * 9) / cycle
        print(f"\nK/V in L2, cycles a key-row:{'kernel':>13s}{'phase':>8s}")
        whole = best[("whole", "L2")]
        for name in VARIANTS:
            c = best[(name, "L2")]
            print(f"  {name:30s}{c:8.2f}" + ("" if name == "whole" else f"{whole - c:8.2f}"))
        print("\nthe whole kernel, 30 layers:")
        for regime, n, threads in (("L3", 1024, 1), ("DRAM", 4096, 1), ("DRAM, 2 threads", 4096, 2)):
            t = best[regime]
            print(f"  {regime:16s} {n:5d} keys: {t * 1e3:6.2f} ms, {t * threads / (n * 9 * 30) / cycle:5.1f} cycles "
                  f"a key-row (per thread), K/V read at {2 * n * 3 * 64 * 30 / t / 1e9:5.1f} GB/s")
        for threads in (1, 2):
            print(f"  a plain read of the same 4,096 keys' K/V, {threads} thread{'s' * (threads > 1)}: "
                  f"{2 * 4097 * 3 * 64 * 30 / best[('read', threads)] / 1e9:5.1f} GB/s")


# --base: both kernels as shared libraries, opened side by side in one process (dlopen, each its own symbols) and
# called in turns, a pass over the layers each: the same minutes for both, where separate processes a minute apart
# read 0.90x and 1.15x for one change on a noisy box. "after a stream": 134 MB read between passes (the int8 weights
# a decode step reads between two layers' attention), so the K/V do not start in L2.
AB_HARNESS = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef int (*decode_fn)(const float *, int64_t, const int8_t *, const int8_t *, const float *, const float *,
                         const int64_t *, int64_t, const int64_t *, float *, int64_t, int, int, int, int, float);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { const double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {   /* base.so tree.so keys layers passes stream(0/1): medians, and whether the bits match */
    decode_fn f[2];
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h || !(f[i] = (decode_fn)dlsym(h, "kv8_decode"))) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    }
    const int n = atoi(argv[3]), L = atoi(argv[4]), passes = atoi(argv[5]), stream = atoi(argv[6]), H = 9, KVH = 3, D = 64;
    const size_t rows = (size_t)(n + 1) * KVH, wbytes = (size_t)134 << 20;
    int8_t *k = malloc(rows * D * L), *v = malloc(rows * D * L), *w = malloc(wbytes);
    float *ks = malloc(sizeof(float) * rows * L), *vs = malloc(sizeof(float) * rows * L);
    int64_t *slots = malloc(sizeof(int64_t) * n), lens = n;
    double *t = malloc(sizeof(double) * 2 * passes);
    srand(1);
    for (size_t i = 0; i < rows * D * L; i++) { k[i] = rand() % 255 - 127; v[i] = rand() % 255 - 127; }
    for (size_t i = 0; i < rows * L; i++) { ks[i] = 0.01f + (rand() % 100) * 1e-4f; vs[i] = 0.01f + (rand() % 50) * 1e-4f; }
    for (int i = 0; i < n; i++) slots[i] = i + 1;
    memset(w, 1, wbytes);
    float q[9 * 64], out[2][9 * 64];
    for (int i = 0; i < 9 * 64; i++) q[i] = (rand() % 2000 - 1000) * 1e-3f;
    long sink = 0;
    for (int p = 0; p < passes; p++)
        for (int i = 0; i < 2; i++) {
            if (stream) {
                #pragma omp parallel for reduction(+ : sink)
                for (size_t c = 0; c < wbytes; c += 64) sink += w[c];
            }
            const double t0 = now();
            for (int l = 0; l < L; l++)
                f[i](q, 0, k + rows * D * l, v + rows * D * l, ks + rows * l, vs + rows * l, slots, n, &lens, out[i], 0, 1,
                     H, KVH, D, 0.125f);
            t[i * passes + p] = now() - t0;
        }
    for (int i = 0; i < 2; i++) qsort(t + i * passes, passes, sizeof(double), cmp);
    printf("%.6e %.6e %d %ld\n", t[passes / 2], t[passes + passes / 2], !memcmp(out[0], out[1], sizeof out[0]), sink & 0);
    return 0;
}
"""
# regime -> (keys, layers, threads, stream) of the side-by-side timing (--base)
AB_REGIMES = {"1,088 keys, in L2": (1088, 1, 1, 0), "30 x 1,024 keys": (1024, 30, 1, 0),
              "30 x 4,096 keys": (4096, 30, 1, 0), "30 x 4,096 keys, after a stream": (4096, 30, 1, 1),
              "the same, 2 threads": (4096, 30, 2, 1)}


def shared_kernel(folder: Path, kernels: Path) -> Path:
    """kv8_attention.c (with w8_x16.c's amx_ready) from `kernels` as a shared library in `folder`."""
    copy_kernel(folder, [], kernels)
    subprocess.run([native_kernels.compiler(), *native_kernels.FLAGS, "-D_GNU_SOURCE", "kv8_attention.c", "w8_x16.c",
                    "-o", "kv8.so", "-lm"], cwd=folder, check=True)
    return folder / "kv8.so"


def side_by_side(tmp: Path, rev: str, passes: int) -> None:
    """--base: `rev`'s whole kernel and the working tree's in one process, in turns, in each AB_REGIMES regime."""
    base = shared_kernel(tmp / "base", sources_at(rev, tmp / "base_sources"))
    tree = shared_kernel(tmp / "tree", KERNELS)
    (tmp / "ab.c").write_text(AB_HARNESS)
    flags = [f for f in native_kernels.FLAGS if f not in ("-shared", "-fPIC")]
    subprocess.run([native_kernels.compiler(), *flags, "ab.c", "-o", "ab", "-ldl"], cwd=tmp, check=True)
    print(f"a decode row's attention (9 query heads, 3 KV heads, head dim 64), {rev}'s kernel and the working "
          f"tree's in turns, medians of {passes} passes:")
    for regime, (n, layers, threads, stream) in AB_REGIMES.items():
        reps = max(passes, int(4e6 / (n * layers)) if not stream else passes)
        out = subprocess.run([str(tmp / "ab"), str(base), str(tree), str(n), str(layers), str(reps), str(stream)],
                             capture_output=True, text=True, check=True,
                             env={"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}).stdout.split()
        b, t = float(out[0]), float(out[1])
        print(f"  {regime:32s} {rev} {b * 1e3:7.3f} ms   working tree {t * 1e3:7.3f} ms   {b / t:.3f}x"
              + ("" if out[2] == "1" else "   OUTPUTS DIFFER"))


if __name__ == "__main__":
    main()
