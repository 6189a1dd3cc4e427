"""The engine at two git revisions, side by side: did a change to the engine make it faster?

Each revision runs in its own process (so each imports its own code and builds its own native kernels, keyed by
their sources), from a `git worktree` of it in a temporary folder; the working tree itself (uncommitted edits
included) is the `--head` by default. The processes alternate round by round on the same threads, and each
measurement keeps its fastest round (a noisy neighbour only ever makes a run slower), because on a shared machine
two runs minutes apart differ by more than most kernel changes gain. Measured as `bench_engine.py` measures the
engine (`engine_sweep.engine_run`: `Engine.submit` + `step`, radix cache off, the heap frozen after loading as the
server freezes it):

  prefill N      seconds from submit to the first token of an uncached N-token prompt
  decode C       batch-1 tokens/s after a C-token prompt (33 new tokens); with --batch B, B prompts of C tokens
                 decoded together (tokens/s of all B)

    .venv/bin/python benchmarks/bench_revisions.py --base 74b494e --prefill 1024,4096 --rounds 4
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads({threads})
from core.engine.model.runner import ModelRunner
from benchmarks.bench_engine import corpus_text
from benchmarks.engine_sweep import engine_run
from core.server.model_store import settle_heap
runner = ModelRunner("default")
ids = runner.tokenizer.encode(corpus_text(), add_special_tokens=False)
settle_heap()   # the heap frozen as the server freezes it
engine_run(runner, [ids[:256]], 2)   # warm up (builds the kernels on a first run)
out = {{}}
for n in {prefill}:
    out[f"prefill {{n}}"] = min(engine_run(runner, [ids[:n]], 2)[0] for _ in range(2))
for c in {contexts}:
    prompts = [ids[i:i + c] for i in range({batch})]   # B prompts of c tokens, each its own (the cache is off)
    out[f"decode {{c}}" + (f" x {{len(prompts)}}" if len(prompts) > 1 else "")] = \
        len(prompts) * 32 / min(engine_run(runner, prompts, 33)[1] for _ in range(2))
print(json.dumps(out))
"""


def worktree(rev: str, folder: Path) -> Path:
    """A checkout of `rev` in `folder` (git worktree, detached), or SystemExit saying what to give instead."""
    res = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(folder), rev],
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"git cannot check out {rev!r} here ({res.stderr.strip()}); give a commit, tag or branch "
                         f"of this repository")
    return folder


def measure(root: Path, args: argparse.Namespace) -> dict[str, float]:
    """One round of every measurement, in a fresh process on `root`'s code."""
    code = CHILD.format(root=str(root), threads=args.threads, prefill=args.prefill, contexts=args.decode,
                        batch=args.batch)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"the engine at {root} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def sizes(text: str) -> list[int]:
    """"1024,4096" -> [1024, 4096] (positive token counts)"""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"give token counts separated by commas, e.g. 1024,4096; got {text!r}")
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"token counts must be positive, got {text!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the revision to compare against (default HEAD~1)")
    ap.add_argument("--head", default=None, help="the revision measured (default: the working tree as it is)")
    ap.add_argument("--prefill", type=sizes, default=[1024, 4096], help="prompt lengths (default 1024,4096)")
    ap.add_argument("--decode", type=sizes, default=[], help="decode contexts, e.g. 128,4096 (default none)")
    ap.add_argument("--batch", type=int, default=1, help="prompts decoded together (default 1)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.rounds < 1 or args.threads < 1 or args.batch < 1 or not (args.prefill or args.decode):
        ap.error("give --rounds, --threads and --batch of at least 1, and at least one --prefill or --decode size")
    with tempfile.TemporaryDirectory(prefix="bench-revisions-") as tmp:
        trees: dict[str, Path] = {}
        try:
            trees[args.base] = worktree(args.base, Path(tmp) / "base")
            trees[args.head or "working tree"] = worktree(args.head, Path(tmp) / "head") if args.head else ROOT
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            names = list(trees)
            for r in range(args.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    runs[name].append(measure(trees[name], args))
                    print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[name][-1].items()),
                          flush=True)
        finally:
            for name, path in trees.items():
                if path != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                                   capture_output=True)
    base, head = names
    print(f"\n{'':24s}{base:>14s}{head:>14s}   head / base (speed)")
    for key in runs[base][0]:
        pick, label = (min, f"{key} tokens, s") if key.startswith("prefill") else (max, f"{key} ctx, tok/s")
        b, h = pick(run[key] for run in runs[base]), pick(run[key] for run in runs[head])
        print(f"{label:24s}{b:>14.3f}{h:>14.3f}   {(b / h if pick is min else h / b):.3f}x")

if __name__ == "__main__":
    main()
