"""Does a prefix hit save real work? The engine with the radix cache, without it, and plain Hugging Face.

A shared-prefix workload on the default model (SmolLM2-135M-Instruct): G groups x P prompts, each
prompt = the group's S-token system prompt + its own Q-token question, N new tokens, greedy. Prompts
are token-id lists cut from real English text (Python standard-library docstrings), so every length
is exact. Requests of different groups arrive interleaved (g0, g1, ..., g0, g1, ...), all at once.

In one process, interleaved run by run (the machine is shared and noisy, so only side-by-side
ratios mean anything), it measures:

  (a) Engine(runner)                              the radix cache on
  (b) Engine(runner, disable_radix_cache=True)    every prompt prefilled in full
  (c) Hugging Face `model.generate`, one request at a time (stock model, attn_implementation="sdpa")
  (d) Hugging Face `model.generate`, batched (--hf-batch prompts per call; every prompt has the
      same length, so no padding changes the numbers)
  (e) the ideal prefill saving: 1 - unique tokens / prompt tokens (each system prompt once)

All requests are submitted at once ("all at once": the shared prefixes are computed in the same
step unless the scheduler's in-batch prefix sharing holds the followers back a step). It prints
output tokens/s, requests/s, the prefill time (wall time of the engine steps that computed prompt
tokens, mixed steps included), the throughput ratios, and the measured prefill saving
1 - prefill(a)/prefill(b) against (e). Then a decode comparison with Hugging Face generate, single
stream and batch 8 (greedy, same threads), side by side: decode tokens/s = extra tokens / (time to
generate N tokens - time to generate 1).

Fails (exit 1) unless every greedy output of (a) equals (b)'s and, when the engine runs fp32, Hugging
Face generate's token for token, and the measured prefill saving reaches 80 % of the ideal (issue 10);
(a)/(b) >= 3x is the throughput target of issue 3.

Then (issue 25, benchmarks/engine_sweep.py and engine_fairness.py): the context sweep (decode tokens/s
at 128 / 544 / 2,048 / 4,096 tokens of context, batch 1, and batch 8 at 544) and uncached prefill of
1,024 / 4,096 tokens, each beside HF generate fp32 and llama.cpp (llama-cpp-python on the same GGUF,
when installed: `make llamacpp`); and the fairness run through the HTTP server (a stream decoding while
a 6,000-token prompt arrives, a 2-token request 1 s later). `--sections server` (benchmarks/engine_server.py)
measures decode by context and prefill through the HTTP server instead, one server per --kv-cache-dtype value,
beside HF generate and llama.cpp in this process.

    .venv/bin/python benchmarks/bench_engine.py            # 4 x 8 prompts, 512 + 32 tokens, 16 new, 2 rounds
    .venv/bin/python benchmarks/bench_engine.py --quick    # 2 x 4 prompts, 512 + 32 tokens, 8 new, 1 round
    .venv/bin/python benchmarks/bench_engine.py --no-hf    # skip the Hugging Face baseline
    .venv/bin/python benchmarks/bench_engine.py --threads 1  # torch.set_num_threads(1) for all three
    .venv/bin/python benchmarks/bench_engine.py --sections sweep,prefill,fairness --threads 2   # issue 25's figures
    .venv/bin/python benchmarks/bench_engine.py --sections server --threads 2 --kv-cache-dtype int8,fp32
    .venv/bin/python benchmarks/bench_engine.py --dtype fp32  # the engine in another numerics (default: the server's)
"""
from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.engine.engine import Engine  # noqa: E402
from core.engine.model.loader import resolve_model
from core.engine.config import DTYPES  # noqa: E402
from core.engine.model.runner import ModelRunner  # noqa: E402
from core.engine.sampling import SamplingParams  # noqa: E402

TEXT_MODULES = ("argparse", "collections", "json", "logging", "subprocess", "threading", "unittest", "asyncio",
                "functools", "itertools", "pathlib", "dataclasses", "inspect", "typing", "email", "http.client",
                "urllib.request", "sqlite3", "tarfile", "zipfile", "shutil", "tempfile", "heapq", "bisect",
                "decimal", "fractions", "statistics", "random", "datetime", "calendar", "csv", "configparser")


def corpus_text() -> str:
    """Real English prose, offline and deterministic: standard-library docstrings."""
    parts = []
    for name in TEXT_MODULES:
        mod = importlib.import_module(name)
        objs = [mod] + [getattr(mod, a) for a in sorted(vars(mod)) if not a.startswith("_")]
        for obj in objs:
            if inspect.ismodule(obj) and obj is not mod:
                continue
            doc = inspect.getdoc(obj) if (obj is mod or getattr(obj, "__module__", None) == name) else None
            if doc and len(doc) > 80:
                parts.append(doc)
    return "\n\n".join(dict.fromkeys(parts))  # dedupe, keep order


def build_prompts(tokenizer, groups: int, per_group: int, system_tokens: int,
                  question_tokens: int) -> list[tuple[int, list[int]]]:
    """(group, token ids) per prompt, interleaved by group; every prompt has exactly S + Q tokens."""
    ids = tokenizer.encode(corpus_text(), add_special_tokens=False)
    need = groups * system_tokens + groups * per_group * question_tokens
    if len(ids) < need:
        raise SystemExit(f"the text corpus has {len(ids)} tokens, {need} needed; use smaller sizes")
    systems = [ids[g * system_tokens:(g + 1) * system_tokens] for g in range(groups)]
    base = groups * system_tokens
    prompts = []
    for i in range(per_group):
        for g in range(groups):
            q = base + (i * groups + g) * question_tokens
            prompts.append((g, systems[g] + ids[q:q + question_tokens]))
    return prompts


def run_engine(runner: ModelRunner, prompts: list[list[int]], params: SamplingParams, pool_slots: int,
               disable: bool, max_prefill_tokens: int) -> dict:
    engine = Engine(runner, pool_slots=pool_slots, disable_radix_cache=disable,
                    max_prefill_tokens=max_prefill_tokens, max_running_requests=len(prompts))
    handles = [engine.submit(p, params) for p in prompts]
    prefill_time = decode_time = 0.0
    steps = prefill_steps = 0
    start = time.perf_counter()
    while not all(h.done() for h in handles):
        before = engine.metrics.prefill_computed
        t0 = time.perf_counter()
        if not engine.step():
            raise RuntimeError("engine idle with unfinished requests")
        dt = time.perf_counter() - t0
        steps += 1
        if engine.metrics.prefill_computed > before:  # this step computed prompt tokens
            prefill_time += dt
            prefill_steps += 1
        else:
            decode_time += dt
    wall = time.perf_counter() - start
    done = [h.result() for h in handles]
    m = engine.metrics
    engine.check_invariants()
    out = dict(wall=wall, prefill_time=prefill_time, decode_time=decode_time, steps=steps,
               prefill_steps=prefill_steps, outputs=[c.token_ids for c in done],
               out_tokens=sum(len(c.token_ids) for c in done), prompt_tokens=m.prompt_tokens,
               cached_tokens=m.cached_tokens, prefill_computed=m.prefill_computed,
               ttft=statistics.mean(c.ttft for c in done))
    del engine, handles
    gc.collect()
    return out


def run_hf(model, prompts: list[list[int]], new_tokens: int) -> dict:
    outs = []
    start = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            outs.append(g[0, len(p):].tolist())
    wall = time.perf_counter() - start
    return dict(wall=wall, outputs=outs, out_tokens=sum(len(o) for o in outs))


def run_hf_batched(model, prompts: list[list[int]], new_tokens: int, batch: int) -> dict:
    outs = []
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            group = prompts[i:i + batch]
            if len({len(p) for p in group}) != 1:
                raise SystemExit("batched HF generate needs equal-length prompts (no padding)")
            ids = torch.tensor(group, device=model.device)
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            outs.extend(row[len(group[0]):].tolist() for row in g)
    wall = time.perf_counter() - start
    return dict(wall=wall, outputs=outs, out_tokens=sum(len(o) for o in outs))


def decode_rates(runner: ModelRunner, hf, prompts: list[list[int]], new_tokens: int, rounds: int) -> None:
    """Decode tokens/s of the engine and of HF generate, single stream and batch 8, side by side."""
    print()
    print(f"decode, greedy, {len(prompts[0])}-token prompts, {new_tokens} new tokens, {torch.get_num_threads()} "
          f"threads:  tokens/s = (tokens(N) - tokens(1)) / (fastest time(N) - fastest time(1)) of {max(2, rounds)} runs")
    print(f"{'':20s}{'engine tok/s':>14s}{'HF generate tok/s':>19s}{'engine / HF':>13s}")
    for batch in (1, 8):
        group = prompts[:batch]

        def engine_time(n: int) -> float:
            e = Engine(runner, pool_slots=batch * (len(group[0]) + n) + 64, disable_radix_cache=True,
                       max_running_requests=batch)
            t0 = time.perf_counter()
            e.generate(group, SamplingParams(max_new_tokens=n, ignore_eos=True))
            return time.perf_counter() - t0

        def hf_time(n: int) -> float:
            t0 = time.perf_counter()
            run_hf_batched(hf, group, n, batch)
            return time.perf_counter() - t0

        times = {("engine", 1): [], ("engine", new_tokens): [], ("hf", 1): [], ("hf", new_tokens): []}
        for r in range(max(2, rounds)):   # alternate the order; keep each configuration's fastest run
            pairs = (("engine", engine_time), ("hf", hf_time))
            for kind, fn in (pairs if r % 2 == 0 else pairs[::-1]):
                for n in (1, new_tokens):
                    times[(kind, n)].append(fn(n))
        rate = {kind: batch * (new_tokens - 1) / max(1e-9, min(times[(kind, new_tokens)]) - min(times[(kind, 1)]))
                for kind in ("engine", "hf")}
        noisy = [k for k in ("engine", "hf")
                 if min(times[(k, new_tokens)]) - min(times[(k, 1)]) < 0.05 * min(times[(k, new_tokens)])]
        if noisy:  # the prefill in time(1) swamped the decode difference: no figure rather than a wrong one
            print(f"{f'batch {batch}':20s}  too noisy to measure ({', '.join(noisy)}); raise --decode-tokens")
            continue
        eng, h = rate["engine"], rate["hf"]
        print(f"{f'batch {batch}':20s}{eng:14.1f}{h:19.1f}{eng / h:12.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 groups x 4 prompts, 512 + 32 tokens, 8 new, 1 round")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--question-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=None, help="interleaved repetitions; medians are reported "
                    "(default 2, 1 with --quick)")
    ap.add_argument("--max-prefill-tokens", type=int, default=2048, help="the engine's per-step token budget")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave torch's default)")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face model.generate baselines")
    ap.add_argument("--hf-batch", type=int, default=8, help="prompts per batched HF generate call (default 8)")
    ap.add_argument("--decode-tokens", type=int, default=32, help="new tokens in the decode comparison")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the engine and HF run")
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto", help="the engine's numerics: auto (what the server picks), fp32, "
                    "bf16, int8; outputs must equal HF generate's only in fp32. A comma list (e.g. auto,fp32) runs "
                    "the sweep and prefill with one engine per value, side by side; the workload and fairness "
                    "sections take the first")
    ap.add_argument("--sections", default="workload,sweep,prefill,fairness",
                    help="comma-separated: workload (the shared-prefix run), sweep (decode tokens/s by context, "
                    "with llama.cpp when installed), prefill (uncached 1,024 / 4,096 tokens), fairness (server), "
                    "server (decode by context and prefill through the HTTP server, one server per "
                    "--kv-cache-dtype value, beside HF generate and llama.cpp)")
    ap.add_argument("--kv-cache-dtype", default="auto", help="the engine's KV pool dtype (auto, fp32, bf16, int8); a comma "
                    "list runs the sweep and prefill with one engine per value, side by side (e.g. auto,bf16)")
    ap.add_argument("--contexts", default="128,544,2048,4096", help="the sweep's contexts (batch 1)")
    ap.add_argument("--sweep-tokens", type=int, default=33, help="new tokens per sweep run")
    ap.add_argument("--prefill", default="1024,4096", help="uncached prompt sizes of the prefill run")
    ap.add_argument("--fair-tokens", type=int, default=400, help="new tokens of the fairness run's stream")
    ap.add_argument("--fair-solo-last", action="store_true", help="the fairness run's loaded stream first, on a "
                    "server that has decoded nothing but a warm-up, and the solo stream after it")
    ap.add_argument("--long-tokens", type=int, default=6000, help="the fairness run's long uncached prompt")
    ap.add_argument("--long-prompts", type=int, default=1, help="how many such prompts arrive together (2: two "
                    "users paste documents at once; the short request must still be served between their chunks)")
    ap.add_argument("--cuda-graph", default="on", choices=("on", "off", "both"),
                    help="on CUDA: decode steps replay captured CUDA graphs (on), launch every kernel (off), or both "
                    "side by side in the sweep and prefill")
    ap.add_argument("--server-args", default="", help="extra `python -m core.server` flags for the fairness run")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.per_group, args.new_tokens = 2, 4, 8
        args.rounds = 1 if args.rounds is None else args.rounds
    args.rounds = 2 if args.rounds is None else args.rounds
    if args.threads:
        torch.set_num_threads(args.threads)

    sections = set(args.sections.split(","))
    unknown = sections - {"workload", "sweep", "prefill", "fairness", "server"}
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; pick from workload, sweep, prefill, fairness, server")
    t0 = time.perf_counter()
    kvs = [k for k in args.kv_cache_dtype.split(",") if k] or ["auto"]
    dtypes = [d for d in args.dtype.split(",") if d] or ["auto"]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise SystemExit(f"--dtype {','.join(bad)}: choose from {', '.join(DTYPES)} (a comma list for several)")
    graphs = {"on": [True], "off": [False], "both": [True, False]}[args.cuda_graph]
    runner, *others = [ModelRunner(args.model, device=args.device, numerics=n, kv_cache_dtype=k, cuda_graph=g)
                       for n in dtypes for g in graphs for k in kvs]
    hf = None
    if not args.no_hf:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32,
                                                  attn_implementation="sdpa").eval().to(runner.device)
    print(f"model {args.model} on {runner.device}: engine {runner.impl} path, {runner.numerics}; HF generate fp32; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; loaded in {time.perf_counter() - t0:.1f} s")
    ok = True
    if "workload" in sections:
        ok = section_workload(args, runner, hf) and ok
    ids = runner.tokenizer.encode(corpus_text(), add_special_tokens=False)
    if sections & {"sweep", "prefill"}:
        from benchmarks import engine_sweep
        ok = engine_sweep.section_speed(args, [runner] + others, hf, ids, sections) and ok
    if "server" in sections:
        from benchmarks import engine_server
        engine_server.section_server(args, hf, ids)
    if "fairness" in sections:
        from benchmarks import engine_fairness
        ok = engine_fairness.section_fairness(args, ids, dtypes[0], kvs[0]) and ok
    if not ok:
        sys.exit(1)


def section_workload(args, runner: ModelRunner, hf) -> bool:
    """The shared-prefix workload: cache on vs off vs HF generate; False when an exactness or saving check fails."""
    t0 = time.perf_counter()
    tagged = build_prompts(runner.tokenizer, args.groups, args.per_group, args.system_tokens, args.question_tokens)
    prompts = [p for _, p in tagged]
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    n = len(prompts)
    pool_slots = n * (args.system_tokens + args.question_tokens + args.new_tokens) + 64  # no sharing needed
    print(f"workload: {args.groups} groups x {args.per_group} prompts = {n} requests, "
          f"{args.system_tokens}-token system prompt + {args.question_tokens}-token question, "
          f"{args.new_tokens} new tokens, greedy; pool {pool_slots} slots, "
          f"max_prefill_tokens {args.max_prefill_tokens}, {args.rounds} round(s)")

    # warm up every path once (allocator, kernels, lazy imports) on a different, small workload
    warm = [p[:64] for p in prompts[:4]]
    run_engine(runner, warm, SamplingParams(max_new_tokens=2, ignore_eos=True), 512, False, args.max_prefill_tokens)
    run_engine(runner, warm, SamplingParams(max_new_tokens=2, ignore_eos=True), 512, True, args.max_prefill_tokens)
    if hf is not None:
        run_hf(hf, warm[:1], 2)

    results: dict[str, list[dict]] = {"on": [], "off": [], "hf": [], "hfb": []}
    for r in range(args.rounds):
        order = ["on", "off", "hf", "hfb"] if r % 2 == 0 else ["hfb", "hf", "off", "on"]
        for kind in order:
            if kind == "hf":
                if hf is not None:
                    results["hf"].append(run_hf(hf, prompts, args.new_tokens))
            elif kind == "hfb":
                if hf is not None:
                    results["hfb"].append(run_hf_batched(hf, prompts, args.new_tokens, args.hf_batch))
            else:
                results[kind].append(run_engine(runner, prompts, params, pool_slots, kind == "off",
                                                args.max_prefill_tokens))
        line = [f"round {r + 1}:"]
        for kind in ("on", "off", "hf", "hfb"):
            if results[kind]:
                x = results[kind][-1]
                extra = f" (prefill {x['prefill_time']:.2f} s)" if "prefill_time" in x else ""
                line.append(f"{kind} {x['wall']:.2f} s{extra}")
        print("  ".join(line), flush=True)

    on, off, hfr, hfb = results["on"], results["off"], results["hf"], results["hfb"]
    med = lambda runs, key: statistics.median(x[key] for x in runs)  # noqa: E731

    # exactness: greedy outputs of the cache-on and cache-off engines agree token for token
    same = all(a["outputs"] == b["outputs"] for a in on for b in off)
    hf_same = sum(o1 == o2 for o1, o2 in zip(on[0]["outputs"], hfr[0]["outputs"])) if hfr else None
    off_same = sum(o1 == o2 for o1, o2 in zip(off[0]["outputs"], hfr[0]["outputs"])) if hfr else None
    hfb_same = sum(o1 == o2 for o1, o2 in zip(on[0]["outputs"], hfb[0]["outputs"])) if hfb else None

    rows = [("(a) engine, radix cache", on), ("(b) engine, cache disabled", off)]
    if hfr:
        rows.append(("(c) HF generate, one at a time", hfr))
        rows.append((f"(d) HF generate, batch {args.hf_batch}", hfb))
    print()
    print(f"{'':34s}{'wall s':>8s}{'out tok/s':>11s}{'req/s':>8s}{'prefill s':>11s}{'decode s':>10s}"
          f"{'prefill tok':>13s}{'steps':>7s}")
    for name, runs in rows:
        wall = med(runs, "wall")
        out_tok = runs[0]["out_tokens"]
        pf = f"{med(runs, 'prefill_time'):11.2f}" if "prefill_time" in runs[0] else f"{'-':>11s}"
        dc = f"{med(runs, 'decode_time'):10.2f}" if "decode_time" in runs[0] else f"{'-':>10s}"
        ptok = f"{runs[0]['prefill_computed']:13d}" if "prefill_computed" in runs[0] else f"{'-':>13s}"
        st = f"{runs[0]['steps']:7d}" if "steps" in runs[0] else f"{'-':>7s}"
        print(f"{name:34s}{wall:8.2f}{out_tok / wall:11.1f}{n / wall:8.2f}{pf}{dc}{ptok}{st}")

    # per-round ratios (each round runs the variants back to back), then their median
    speedup = statistics.median(b["wall"] / a["wall"] for a, b in zip(on, off))
    saving = statistics.median(1 - a["prefill_time"] / b["prefill_time"] for a, b in zip(on, off))
    ideal = on[0]["cached_tokens"] / on[0]["prompt_tokens"]
    best = 1 - (args.groups * args.system_tokens + n * args.question_tokens) / (n * (args.system_tokens
                                                                                    + args.question_tokens))
    print()
    print(f"throughput, cache on / cache off:      {speedup:5.2f}x   (target >= 3x)   "
          f"{'PASS' if speedup >= 3 else 'MISS'}")
    print(f"prefill tokens skipped (ideal saving):  {on[0]['cached_tokens']} / {on[0]['prompt_tokens']} = "
          f"{ideal:.1%}   (best possible for this workload {best:.1%})")
    saving_ok = saving / best >= 0.8
    print(f"prefill time saved (measured):          {saving:.1%} = {saving / best:.0%} of the ideal {best:.1%}   "
          f"(target >= 80%)   {'PASS' if saving_ok else 'FAIL'}")
    if hfr:
        print(f"throughput, cache on / HF one at a time: {statistics.median(h['wall'] / a['wall'] for a, h in zip(on, hfr)):5.2f}x"
              f";  cache off / HF one at a time: {statistics.median(h['wall'] / b['wall'] for b, h in zip(off, hfr)):5.2f}x")
        print(f"throughput, cache on / HF batch {args.hf_batch}:      "
              f"{statistics.median(h['wall'] / a['wall'] for a, h in zip(on, hfb)):5.2f}x"
              f";  cache off / HF batch {args.hf_batch}: {statistics.median(h['wall'] / b['wall'] for b, h in zip(off, hfb)):5.2f}x")
    print(f"mean TTFT: cache on {statistics.median(x['ttft'] for x in on):.2f} s, "
          f"cache off {statistics.median(x['ttft'] for x in off):.2f} s")
    print(f"greedy outputs, cache on == cache off: {'yes' if same else 'NO'}"
          + (f";  equal to HF generate one at a time: cache on {hf_same}/{n}, cache off {off_same}/{n}"
             f";  to HF batched (information): {hfb_same}/{n}" if hfr else ""))
    # outputs must equal fp32 HF generate's only when the engine runs fp32; in bf16/int8 cache on == off
    exact = same and (not hfr or runner.numerics != "fp32" or hf_same == off_same == n)
    if hf is not None:
        decode_rates(runner, hf, prompts[:8],
                     args.decode_tokens, max(1, args.rounds))
    if not exact:
        print("FAIL: some greedy output differs from Hugging Face generate (or cache on from cache off)")
    print(f"(workload section took {time.perf_counter() - t0:.0f} s)")
    return exact and saving_ok


if __name__ == "__main__":
    main()
