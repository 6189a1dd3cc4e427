"""Command line of the capacity lab.

    python -m core.lab sweep --trace data/mooncake/synthetic_trace.jsonl.gz --page-size 512 \\
        --capacities 1000p,2000p,4000p,6000p,12000p,24000p --policies lru,lfu,fifo,slru --out results/mooncake
    python -m core.lab sweep --workload generated-shared-prefix -p num_groups=16 -p order=grouped \\
        --capacities 4k,16k,64k --policies all --out results/gsp
    python -m core.lab sweep --trace data/mooncake/synthetic_trace.jsonl.gz --capacities 20GiB,40GiB,80GiB \\
        --model-config llama-3.1-8b --host-capacity 200GiB   # bytes of KV, a host tier behind the pool
    python -m core.lab size --trace data/mooncake/synthetic_trace.jsonl.gz --target 0.9   # by search
    python -m core.lab workloads          # the generators and their parameters

Every bad input is one line on stderr ("error: ...", exit 2) before any work is done, never a traceback;
Ctrl-C stops the workers at once (exit 130, nothing written); SIGTERM too (exit 143).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence

from core.cache.eviction.registry import POLICIES

if TYPE_CHECKING:
    from core.lab.units import ModelKV

DEFAULT_POLICIES = "lru,lfu,fifo,slru"


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _params(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--param {item!r}: write KEY=VALUE, for example num_groups=16")
        k, v = item.split("=", 1)
        out[k.strip()] = _value(v)
    return out


def _tokenizer(name: Optional[str]) -> tuple:
    """(text -> ids, chat template or None) of --tokenizer; (None, None) without one."""
    if not name:
        return None, None
    from transformers import AutoTokenizer  # only to read text traces; the model is never loaded

    from core.lab.chat_traces import hf_chat
    try:   # local files only: offline, a hub name the cache lacks retried for about a minute before failing
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"--tokenizer {name!r}: no tokenizer there ({type(e).__name__}); give a folder holding a "
                         f"model's tokenizer files (tokenizer.json / tokenizer_config.json), or a hub name already in "
                         f"the local Hugging Face cache") from None
    # as the engine reads text (its tokenizer's BOS, if any) and chats (its chat template, stopping where it stops)
    return (lambda text: tok(text)["input_ids"]), hf_chat(tok, _stop_ids(name))


def _stop_ids(name: str) -> set:
    """The eos_token_id of the model's generation_config.json and config.json beside its tokenizer, when there (the
    engine stops on each: Gemma's and Llama 3's end-of-turn token is not the tokenizer's EOS)."""
    from transformers import AutoConfig, GenerationConfig

    from core.engine.model.runner import eos_token_ids
    configs = []
    for source in (GenerationConfig, AutoConfig):
        try:
            configs.append(source.from_pretrained(name, local_files_only=True))
        except (OSError, ValueError, KeyError, TypeError):   # a tokenizer-only folder: the tokenizer's EOS is all there is
            pass
    return eos_token_ids(*configs)


def build_parser() -> argparse.ArgumentParser:
    from core.lab.plan_cli import CAPACITY_HELP, add_host_flags, add_size_parser, add_source, add_unit_flags
    from core.lab.route_cli import add_route_parser
    ap = argparse.ArgumentParser(prog="python -m core.lab", description=(
        "Capacity lab: replay a workload through the real RadixCache at several pool sizes and eviction "
        "policies, next to the infinite-capacity rate and the offline optimum (Belady)."))
    sub = ap.add_subparsers(dest="command", required=True)
    sw = sub.add_parser("sweep", help="replay capacities x policies; write results.csv, results.json, chart.html",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_source(sw)
    sw.add_argument("--capacities", required=True, help=CAPACITY_HELP)
    sw.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated, or 'all': {', '.join(POLICIES)}")
    sw.add_argument("--page-size", type=int, default=None,
                    help="tokens per page; default: the block size of a block trace (512 for Mooncake), else 1")
    sw.add_argument("--overlap", action="store_true",
                    help="overlap requests by timestamp: running requests hold locks and slots until they finish")
    sw.add_argument("--ms-per-output-token", type=float, default=20.0,
                    help="with --overlap: modeled decode time per output token")
    sw.add_argument("--ms-per-prompt-token", type=float, default=0.0, help="with --overlap: modeled prefill time")
    sw.add_argument("--workers", type=int, default=2,
                    help="parallel processes (1 = in this process; at most one a point and one a CPU)")
    sw.add_argument("--backend", default="local", choices=["local", "ray"],
                    help="local processes, or one Ray task per point (a private local Ray instance, or --address)")
    sw.add_argument("--address", metavar="HOST:PORT", help="with --backend ray: the Ray cluster to join")
    sw.add_argument("--no-optimal", action="store_true", help="skip the offline optimum")
    sw.add_argument("--target", type=float, default=0.9,
                    help="report the smallest capacity reaching this fraction of the infinite-capacity rate")
    sw.add_argument("--out", metavar="DIR", help="write results.csv, results.json and chart.html here")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    add_unit_flags(sw)
    add_host_flags(sw)
    add_size_parser(sub)
    add_route_parser(sub, add_source)
    sub.add_parser("workloads", help="list the workload generators and their parameters")
    return ap


def _load(args) -> "Workload":  # noqa: F821
    from core.lab.chat_traces import DEFAULT_SESSIONS
    from core.lab.traces import load_trace, order_notes
    from core.lab.workloads import make_workload
    if args.sessions is not None and not args.trace:
        raise ValueError("--sessions applies to --trace (a trace of conversations), not to --workload; the "
                         "multi-turn-chat generator takes -p num_sessions=N")
    if args.trace:
        if args.param:
            raise ValueError("--param applies to --workload, not to --trace")
        text, chat = _tokenizer(args.tokenizer)
        workload = load_trace(args.trace, args.format, text, "skip" if args.skip_bad_lines else "raise", args.limit,
                              args.block_size, chat, DEFAULT_SESSIONS if args.sessions is None else args.sessions)
        if workload.params.get("conversations"):
            print(f"{workload.params['conversations']:,} conversations of several turns: replayed "
                  f"{workload.params['sessions']} at a time, turn by turn (--sessions)")
        for note in order_notes(workload):
            print(note)
        return workload
    return make_workload(args.workload, **_params(args.param))


def _page_size(args, workload) -> int:
    """--page-size, or the default: a block trace's block size (its hash ids name whole blocks), else 1.
    A page smaller than a block only multiplies the pages (and the memory: ~25 GB for Mooncake at 1)
    while nothing below a block can be shared, so it is refused with the fix."""
    blocks = {r.block_size for r in workload.requests if r.hash_ids is not None}
    block = max(blocks) if blocks else None
    if args.page_size is None:
        if block is None:
            return 1
        print(f"page size {block} tokens: the trace's block size (one hash id per {block}-token block)")
        return block
    if block is not None and args.page_size < block:
        raise ValueError(f"--page-size {args.page_size} is smaller than this block trace's {block}-token blocks: "
                         f"each hash id stands for a whole block, so smaller pages share nothing more and cost "
                         f"{block // args.page_size}x the pages; use --page-size {block} (the default for block "
                         f"traces) or a multiple of it")
    return args.page_size


def _check_args(args) -> Optional[ModelKV]:
    """Everything that can be checked before the trace is read or any point runs; returns the model."""
    from core.lab import plan_cli
    from core.lab.sweep import check_target, parse_capacities, parse_policies, prepare_out_dir
    plan_cli.check_common_args(args)
    try:
        check_target(args.target)
    except ValueError:
        raise ValueError(f"--target must be a fraction of the infinite-capacity hit rate in (0, 1], such as 0.9; "
                         f"got {args.target}") from None
    kv = plan_cli.model_of(args)
    parse_capacities(args.capacities, args.page_size or 1, kv)
    parse_policies(args.policies)
    plan_cli.check_host_args(args, kv)
    if args.out:
        prepare_out_dir(args.out)
    return kv


def cmd_sweep(args) -> int:
    from core.lab import plan_cli
    from core.lab.page_trace import Overlap
    from core.lab.sweep import parse_capacities, parse_policies, rounding_note, run_sweep
    from core.lab.units import parse_capacity
    if args.address and args.backend != "ray":
        raise ValueError("--address names a Ray cluster; add --backend ray")
    kv = _check_args(args)                              # fail fast, before reading a trace
    workload = _load(args)
    page_size = _page_size(args, workload)
    caps = parse_capacities(args.capacities, page_size, kv)
    if args.host_capacity:      # again at the trace's page size, before the sweep (not after it, as it was)
        parse_capacity(args.host_capacity, page_size, kv)
    pols = parse_policies(args.policies)
    overlap = Overlap(args.ms_per_output_token, args.ms_per_prompt_token) if args.overlap else None
    s = workload.summary()
    print(f"workload {s['name']}: {s['requests']:,} requests, {s['prompt_tokens']:,} prompt tokens"
          + (f", {workload.skipped_lines} malformed line(s) skipped" if workload.skipped_lines else ""))
    rounded = rounding_note(args.capacities, page_size, kv)
    if rounded:
        print(f"note: {rounded}")
    bar, plain = None, None
    finished, running = [0], {}
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(caps) * (len(pols) + (0 if args.no_optimal else 1)), unit="point",
                   bar_format="{l_bar}{bar}| {n:.1f}/{total} points [{elapsed}<{remaining}]{postfix}")
    elif not args.quiet:      # a log file or a pipe: a handful of plain lines (core/lab/progress_lines.py)
        from core.lab.progress_lines import PlainProgress
        plain = PlainProgress()
    total = [0]

    def show() -> None:
        if bar is not None:
            bar.n = finished[0] + sum(running.values())
            bar.refresh()
        elif plain is not None and total[0]:
            plain.running(finished[0] + sum(running.values()), total[0])

    def progress(done: int, n: int, row: dict) -> None:
        running.pop((row["policy"], row["capacity_tokens"]), None)
        finished[0], total[0] = done, n
        label = f"{row['policy']}@{row['capacity_tokens']:,}: {row['hit_rate']:.1%}"
        if bar is not None:
            bar.total = n     # capacities where nothing fits have no optimum point
            bar.set_postfix_str(label, refresh=False)
            show()
        elif plain is not None:
            plain.finished(done, n, label)

    def point_progress(task: dict, fraction: float) -> None:
        if (bar is not None or plain is not None) and fraction < 1:
            running[(task["policy"], task["capacity_tokens"])] = fraction
            show()
    try:
        res = run_sweep(workload, caps, pols, page_size, overlap, args.workers, not args.no_optimal, progress,
                        point_progress=point_progress, backend=args.backend, ray_address=args.address)
    finally:
        if bar is not None:
            bar.close()
    plan_cli.print_sweep(args, res, kv)
    hosts = plan_cli.host_rows(args, workload, res, kv, overlap)
    if args.out:
        paths = res.save(args.out, args.target)
        plan_cli.save_extras(res, paths, kv, hosts)
        try:   # the chart builder draws with plotly, so it lives with the dashboard (core never imports plotly)
            from core.lab.chart import hit_rate_figure
            chart = paths["csv"].parent / "chart.html"
            hit_rate_figure(res, kv=kv).write_html(chart, include_plotlyjs=True)   # plotly.js inline: works offline
            paths["chart"] = chart
        except ImportError:
            pass
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def cmd_workloads(args) -> int:
    from core.lab.workloads import GENERATORS, workload_params
    for name, fn in GENERATORS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0]
        print(f"{name}: {doc}")
        print("    " + ", ".join(f"{k}={v!r}" for k, v in workload_params(name).items()))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "size":
            from core.lab.plan_cli import cmd_size
            return cmd_size(args, _load, _page_size)
        if args.command == "route":
            from core.lab.route_cli import cmd_route
            return cmd_route(args, _load, _page_size)
        return {"sweep": cmd_sweep, "workloads": cmd_workloads}[args.command](args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("interrupted: the workers were stopped and nothing was written", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a supervisor, a CI cancel): unwinds as Ctrl-C does, so the workers are stopped; exit 143.
    Before, the CLI died at once and its workers stayed blocked on their queues under PID 1."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Terminated


def _first_ctrl_c_only(signum, frame) -> None:
    """SIGINT in the CLI: the first stops the run (KeyboardInterrupt); a second one while it unwinds (a key held,
    or `timeout` forwarding the signal again) is ignored instead of raising inside the cleanup (a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def run() -> None:
    """`python -m core.lab` and the `radix-lab` command: main(), then exit with its code."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:   # not where SIGINT was left ignored
        signal.signal(signal.SIGINT, _first_ctrl_c_only)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    code = main()
    if code in (130, 143):   # Ctrl-C or SIGTERM: stop now, without seconds of interpreter teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
