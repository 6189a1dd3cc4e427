"""The native kernels of two revisions in one engine process, step by step: did a change to the C kernels make the
engine faster?

bench_revisions.py runs each revision in its own process and keeps each one's fastest round; on a shared box whose
speed moves by 1.5x from one minute to the next, a 5 % change drowns in that. Here one process holds both builds of
the native module (the working tree's and `--base`'s C sources, compiled with the same flags) and the engine
switches between them every `--every` decode steps, so both see the same minutes of the box. Only the C sources may
differ: the Python of core/ must be the same at both revisions (else use bench_revisions.py).

  decode C       a C-token prompt (radix cache off) for each C, then their decode steps, the builds taking turns
                 and each context `--every` steps a turn: each build's median step (ms), head / base as the ratio
                 of the medians (speed, > 1: faster), and each build's flatness (its median step at the shortest
                 context over its median step at the longest: issue 25's tok/s at 4,096 / at 128)
  prefill N      uncached N-token prompts, submit to first token, the builds alternating request by request: each
                 build's median (s) and the ratio

A decode's tokens are checked against the same prompt decoded by the working tree's build alone (its first 64
tokens): where a change keeps the kernels' bits they are the same, and a difference is printed.

    .venv/bin/python benchmarks/bench_kernels_ab.py --base 3d2d39a --decode 128,4096 --steps 600
    .venv/bin/python benchmarks/bench_kernels_ab.py --base HEAD --march haswell   # the AVX2 kernels
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.bench_engine import corpus_text  # noqa: E402
from benchmarks.bench_revisions import sizes  # noqa: E402
from benchmarks.engine_sweep import engine_run  # noqa: E402
from core.engine.engine import Engine  # noqa: E402
from core.engine.model import native_kernels  # noqa: E402
from core.engine.model.runner import ModelRunner  # noqa: E402
from core.engine.sampling import SamplingParams  # noqa: E402
from core.server.model_store import settle_heap  # noqa: E402

KERNELS = "core/engine/model"


def python_differs(rev: str) -> str:
    """The Python files of core/ that differ between `rev` and the working tree ("" where none does)."""
    res = subprocess.run(["git", "-C", str(ROOT), "diff", "--name-only", rev, "--", "core", ":(exclude)*.c",
                          ":(exclude)*.h"], capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"git cannot compare with {rev!r} ({res.stderr.strip()}); give a commit, tag or branch")
    return res.stdout.strip()


def sources_at(rev: str, folder: Path) -> Path:
    """`rev`'s copies of the C kernels' sources and headers (those the working tree has) written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in native_kernels.SOURCES + native_kernels.HEADERS:
        res = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{KERNELS}/{f.name}"], capture_output=True)
        if res.returncode:
            raise SystemExit(f"{rev} has no {KERNELS}/{f.name}: its kernels are not this tree's; use "
                             f"bench_revisions.py")
        (folder / f.name).write_bytes(res.stdout)
    return folder


def build_at(rev: str, folder: Path):
    """The native module compiled from `rev`'s C sources (native_kernels' flags), loaded beside the working tree's."""
    sources_at(rev, folder)
    out = folder / f"base{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    try:
        native_kernels.compile_module([folder / f.name for f in native_kernels.SOURCES], out)
    except RuntimeError as exc:
        raise SystemExit(f"{rev}'s kernels did not build here: {exc}")
    return native_kernels.load_module(out)


def decode_ab(runner: ModelRunner, ids: list[int], builds: dict, contexts: list[int], steps: int,
              every: int) -> tuple[dict, dict]:
    """Each build's decode step times (s) at each context ({(build, context): [s]}) and each context's tokens: one
    request of each context length decoding `steps` tokens, the builds taking turns and, within a turn, the contexts
    `every` steps each, so every (build, context) sees the same minutes of the box."""
    handles = {}
    for c in contexts:
        engine = Engine(runner, pool_slots=c + steps + 64, disable_radix_cache=True, max_running_requests=1)
        handle = engine.submit(ids[:c], SamplingParams(max_new_tokens=steps, ignore_eos=True))
        while not handle.partial_ids():
            engine.step()
        for _ in range(5):
            engine.step()
        handles[c] = (engine, handle)
    times = {(name, c): [] for name in builds for c in contexts}
    while not all(handle.done() for _, handle in handles.values()):
        for name, module in builds.items():
            native_kernels.use_module(module)
            for c, (engine, handle) in handles.items():
                for _ in range(every):
                    if handle.done():
                        break
                    start = time.perf_counter()
                    engine.step()
                    times[name, c].append(time.perf_counter() - start)
    return times, {c: handle.partial_ids() for c, (_, handle) in handles.items()}


def same_tokens(runner: ModelRunner, ids: list[int], head, context: int, tokens: list[int]) -> str:
    """Whether the working tree's build alone decodes the first 64 of `tokens` from the same prompt."""
    native_kernels.use_module(head)
    engine = Engine(runner, pool_slots=context + 128, disable_radix_cache=True, max_running_requests=1)
    n = min(64, len(tokens))
    handle = engine.submit(ids[:context], SamplingParams(max_new_tokens=n, ignore_eos=True))
    while not handle.done():
        engine.step()
    alone = handle.partial_ids()
    differ = [i for i in range(n) if alone[i] != tokens[i]]
    return f"the same {n} tokens as the head alone" if not differ else f"TOKENS DIFFER from token {differ[0]}"


def prefill_ab(runner: ModelRunner, ids: list[int], builds: dict, n: int, rounds: int) -> dict:
    """Each build's seconds from submit to first token of an uncached `n`-token prompt, alternating request by
    request."""
    names, times = list(builds), {name: [] for name in builds}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            native_kernels.use_module(builds[name])
            times[name].append(engine_run(runner, [ids[:n]], 1)[0])   # as bench_engine.py times a prefill
    return times


def report(label: str, times: dict, unit: float, unit_name: str) -> None:
    base, head = (statistics.median(t) for t in times.values())
    names = list(times)
    print(f"{label:18s} {names[0]} {base * unit:8.2f} {unit_name}   {names[1]} {head * unit:8.2f} {unit_name}   "
          f"head / base {base / head:.3f}x   ({len(times[names[0]])} + {len(times[names[1]])})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the revision whose C kernels to compare against")
    ap.add_argument("--decode", type=sizes, default=[128, 4096], help="decode contexts (default 128,4096)")
    ap.add_argument("--prefill", type=sizes, default=[], help="prompt lengths (default none)")
    ap.add_argument("--steps", type=int, default=400, help="decode steps a context (default 400)")
    ap.add_argument("--every", type=int, default=4, help="decode steps before switching builds (default 4)")
    ap.add_argument("--rounds", type=int, default=6, help="prefill requests a build (default 6)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--python-differs-ok", action="store_true",
                    help="run although core/'s Python differs from --base's (where you know the C kernels' calls "
                         "did not change)")
    ap.add_argument("--march", default="native", help="both builds' -march (e.g. haswell: the AVX2 kernels on a CPU "
                                                      "with AVX-512; default native)")
    args = ap.parse_args()
    if min(args.steps, args.every, args.rounds, args.threads) < 1:
        ap.error("give --steps, --every, --rounds and --threads of at least 1")
    differs = python_differs(args.base)
    if differs and not args.python_differs_ok:
        raise SystemExit(f"the Python of core/ differs from {args.base} ({differs.replace(chr(10), ', ')}): this "
                         f"benchmark swaps the C kernels alone; use benchmarks/bench_revisions.py (or "
                         f"--python-differs-ok where the kernels' calls did not change)")
    torch.set_num_threads(args.threads)
    native_kernels.FLAGS[native_kernels.FLAGS.index("-march=native")] = f"-march={args.march}"   # before a build
    runner = ModelRunner("default")
    ids = runner.tokenizer.encode(corpus_text(), add_special_tokens=False)
    settle_heap()
    head = native_kernels.built()
    with tempfile.TemporaryDirectory(prefix="bench-kernels-ab-") as tmp:
        builds = {args.base: build_at(args.base, Path(tmp)), "working tree": head}
        try:
            for n in args.prefill:
                report(f"prefill {n}", prefill_ab(runner, ids, builds, n, args.rounds), 1, "s ")
            if args.decode:
                times, tokens = decode_ab(runner, ids, builds, args.decode, args.steps, args.every)
                for c in args.decode:
                    report(f"decode at {c}", {name: times[name, c] for name in builds}, 1e3, "ms")
                    print(f"{'':18s} {same_tokens(runner, ids, head, c, tokens[c])}", flush=True)
                if len(args.decode) > 1:   # the step at the shortest context over the step at the longest
                    short, long = min(args.decode), max(args.decode)
                    print(f"flatness (step at {short} / step at {long}): " + ",  ".join(
                        f"{name} {statistics.median(times[name, short]) / statistics.median(times[name, long]):.3f}"
                        for name in builds), flush=True)
        finally:
            native_kernels.use_module(head)


if __name__ == "__main__":
    main()
