"""The int8 KV pool's prompt-chunk attention on AMX-INT8 tiles (kv8_amx_block.h) against its AVX-512 kernels, side by
side in one process: did the tiles make a prefill faster, and are the outputs the same bits?

  kernel   kv8.kv8_attention alone, one layer of SmolLM2's shape (9 query heads over 3 KV heads, head_dim 64):
           N queries over M keys (the chunk's own keys among them), tiles on / off alternating, fastest of --rounds;
           the two outputs compared bit for bit
  engine   the default model's prefill of an uncached P-token prompt (Engine.submit to its first token, as
           bench_engine.py measures it), the pool attention's tiles on / off alternating (kv8.set_tiles: the
           projections keep their AMX tiles), fastest of --rounds

    .venv/bin/python benchmarks/bench_kv8_tiles.py --rounds 5 [--prefill 1024,2048,4096]

Where the CPU has no AMX-INT8 (or the kernels were built without it) both columns run the AVX-512 / AVX2 kernels
and the script says so.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.bench_revisions import sizes  # noqa: E402
from core.cache.kv_pool import KVPool  # noqa: E402
from core.engine.model import kv8  # noqa: E402

H, KVH, D = 9, 3, 64
SHAPES = [(1024, 1024), (4096, 512), (4096, 4096), (2048, 64)]   # (keys, queries): a prompt, a chunk deep in one


def fastest(fn, rounds: int) -> dict[bool, float]:
    """fn() timed with the tiles on and off alternating, fastest seconds of `rounds` each"""
    best = {True: float("inf"), False: float("inf")}
    try:
        for _ in range(rounds):
            for on in (True, False):
                kv8.set_tiles(on)
                t = time.perf_counter()
                fn()
                best[on] = min(best[on], time.perf_counter() - t)
    finally:
        kv8.set_tiles(True)
    return best


def kernel(rounds: int) -> None:
    for m, n in SHAPES:
        g = torch.Generator().manual_seed(m + n)
        pool = KVPool(1, m + 1, KVH, D, dtype=torch.int8)
        slots = torch.arange(1, m + 1)
        pool.set_kv(0, slots, torch.randn(m, KVH, D, generator=g), torch.randn(m, KVH, D, generator=g))
        parts = (pool.k_buffer[0], pool.v_buffer[0], pool.k_scale[0], pool.v_scale[0])
        q = torch.randn(n, H, D, generator=g)
        outs = {}
        for on in (True, False):
            kv8.set_tiles(on)
            outs[on] = kv8.kv8_attention(q, *parts, slots, D ** -0.5)
        kv8.set_tiles(True)
        same = torch.equal(outs[True].view(torch.int32), outs[False].view(torch.int32))
        best = fastest(lambda: kv8.kv8_attention(q, *parts, slots, D ** -0.5), rounds)
        print(f"  {n:5d} queries over {m:5d} keys: tiles {1e3 * best[True]:7.2f} ms   AVX-512 "
              f"{1e3 * best[False]:7.2f} ms   {best[False] / best[True]:.2f}x   same bits: {same}")


def engine(sizes: list[int], rounds: int) -> None:
    from benchmarks.bench_engine import corpus_text
    from benchmarks.engine_sweep import engine_run
    from core.engine.model.runner import ModelRunner
    from core.server.model_store import settle_heap
    runner = ModelRunner("default")
    ids = runner.tokenizer.encode(corpus_text(), add_special_tokens=False)
    settle_heap()
    engine_run(runner, [ids[:256]], 2)   # warm up
    for p in sizes:
        best = fastest(lambda: engine_run(runner, [ids[:p]], 1), rounds)
        print(f"  prefill {p:5d} tokens: tiles {best[True]:.3f} s   AVX-512 {best[False]:.3f} s   "
              f"{best[False] / best[True]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefill", type=sizes, default=[1024, 2048, 4096],
                    help="prompt lengths of the engine runs ('' for none)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds takes a whole number from 1")
    torch.set_num_threads(args.threads)
    if not kv8.kv8_fits(torch.device("cpu"), H, KVH, D):
        raise SystemExit("the int8 pool's kernels do not run here (AVX512-VNNI or AVX2 needed)")
    where = "AMX-INT8 tiles" if kv8.tiles_here() else "no AMX-INT8 here: both columns run the same kernels"
    print(f"kv8_attention, {args.threads} threads, fastest of {args.rounds} ({where})")
    kernel(args.rounds)
    if args.prefill:
        print("engine prefill (the default model, int8)")
        engine(args.prefill, args.rounds)


if __name__ == "__main__":
    main()
