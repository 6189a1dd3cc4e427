"""Command line of the capacity lab.

    python -m core.lab sweep --trace ../shared/data/mooncake/synthetic_trace.jsonl --page-size 512 \\
        --capacities 1000p,2000p,4000p,6000p,12000p,24000p --policies lru,lfu,fifo,slru --out results/mooncake
    python -m core.lab sweep --workload generated-shared-prefix -p num_groups=16 -p order=grouped \\
        --capacities 4k,16k,64k --policies all --out results/gsp
    python -m core.lab workloads          # the generators and their parameters
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence

from core.eviction import POLICIES

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


def _tokenizer(name: Optional[str]):
    if not name:
        return None
    from transformers import AutoTokenizer   # only to read text traces; the model is never loaded
    tok = AutoTokenizer.from_pretrained(name)
    return lambda text: tok(text, add_special_tokens=False)["input_ids"]


def _add_source(sw: argparse.ArgumentParser) -> None:
    """Where the requests come from: a trace file or a generated workload (sweep and route share it)."""
    from core.lab.workloads import GENERATORS
    src = sw.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="PATH", help="a Mooncake JSONL trace or a plain JSONL of token ids / texts")
    src.add_argument("--workload", metavar="NAME", choices=list(GENERATORS),
                     help=f"a generated workload: {', '.join(GENERATORS)} (parameters: python -m core.lab workloads)")
    sw.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                    help="a generator parameter, repeatable (e.g. -p num_groups=16 -p order=grouped)")
    sw.add_argument("--format", default="auto", choices=["auto", "mooncake", "jsonl"], help="trace format")
    sw.add_argument("--tokenizer", metavar="NAME_OR_PATH",
                    help="Hugging Face tokenizer for text traces (only the tokenizer is loaded)")
    sw.add_argument("--skip-bad-lines", action="store_true",
                    help="skip malformed trace lines and count them instead of stopping at the first")
    sw.add_argument("--limit", type=int, help="read only the first N requests of the trace")


def build_parser() -> argparse.ArgumentParser:
    from core.lab.workloads import GENERATORS
    ap = argparse.ArgumentParser(prog="python -m core.lab", description=(
        "Capacity lab: replay a workload through the real RadixCache at several pool sizes and eviction "
        "policies, next to the infinite-capacity rate and the offline optimum (Belady)."))
    sub = ap.add_subparsers(dest="command", required=True)
    sw = sub.add_parser("sweep", help="replay capacities x policies; write results.csv, results.json, chart.html",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_source(sw)
    sw.add_argument("--capacities", required=True,
                    help="comma-separated pool sizes: tokens (3072000, 3M, 512k) or pages (6000p)")
    sw.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated, or 'all': {', '.join(POLICIES)}")
    sw.add_argument("--page-size", type=int, default=1, help="tokens per page (512 for Mooncake block traces)")
    sw.add_argument("--overlap", action="store_true",
                    help="overlap requests by timestamp: running requests hold locks and slots until they finish")
    sw.add_argument("--ms-per-output-token", type=float, default=20.0,
                    help="with --overlap: modeled decode time per output token")
    sw.add_argument("--ms-per-prompt-token", type=float, default=0.0, help="with --overlap: modeled prefill time")
    sw.add_argument("--workers", type=int, default=2, help="parallel processes (1 = in this process)")
    sw.add_argument("--backend", default="local", choices=["local", "ray"],
                    help="local processes, or one Ray task per point (a local Ray instance, or --address)")
    sw.add_argument("--address", metavar="HOST:PORT", help="with --backend ray: the Ray cluster to join")
    sw.add_argument("--no-optimal", action="store_true", help="skip the offline optimum")
    sw.add_argument("--target", type=float, default=0.9,
                    help="report the smallest capacity reaching this fraction of the infinite-capacity rate")
    sw.add_argument("--out", metavar="DIR", help="write results.csv, results.json and chart.html here")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    from core.lab.route_cli import add_route_parser
    add_route_parser(sub, _add_source)
    sub.add_parser("workloads", help="list the workload generators and their parameters")
    return ap


def _load(args) -> "Workload":  # noqa: F821
    from core.lab.traces import load_trace
    from core.lab.workloads import make_workload
    if args.trace:
        if args.param:
            raise ValueError("--param applies to --workload, not to --trace")
        return load_trace(args.trace, args.format, _tokenizer(args.tokenizer),
                          "skip" if args.skip_bad_lines else "raise", args.limit)
    return make_workload(args.workload, **_params(args.param))


def cmd_sweep(args) -> int:
    from core.lab.pages import Overlap
    from core.lab.sweep import parse_capacities, parse_policies, run_sweep
    if args.address and args.backend != "ray":
        raise ValueError("--address names a Ray cluster; add --backend ray")
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    caps = parse_capacities(args.capacities, args.page_size)     # fail fast, before reading a trace
    pols = parse_policies(args.policies)
    workload = _load(args)
    overlap = Overlap(args.ms_per_output_token, args.ms_per_prompt_token) if args.overlap else None
    s = workload.summary()
    print(f"workload {s['name']}: {s['requests']:,} requests, {s['prompt_tokens']:,} prompt tokens"
          + (f", {workload.skipped_lines} malformed line(s) skipped" if workload.skipped_lines else ""))
    bar = None
    if not args.quiet:
        from tqdm import tqdm
        bar = tqdm(total=len(caps) * (len(pols) + (0 if args.no_optimal else 1)), unit="point")

    def progress(done: int, total: int, row: dict) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{row['policy']}@{row['capacity_tokens']:,}: {row['hit_rate']:.1%}")
    try:
        res = run_sweep(workload, caps, pols, args.page_size, overlap, args.workers, not args.no_optimal, progress,
                        backend=args.backend, ray_address=args.address)
    finally:
        if bar is not None:
            bar.close()
    import pandas as pd
    df = res.table()
    with pd.option_context("display.max_rows", 500, "display.width", 160):
        print(df[["policy", "capacity_tokens", "capacity_pages", "hit_rate", "optimal_hit_rate", "gap_to_optimal",
                  "evictions", "evicted_tokens", "rejected", "seconds"]].to_string(index=False, float_format="%.4f"))
    print(f"\ninfinite-capacity hit rate: {res.infinite_hit_rate:.4f}   "
          f"({res.distinct_pages:,} distinct pages of {res.page_size}; sweep {res.seconds:.1f} s)")
    print(f"smallest swept capacity reaching {args.target:.0%} of it:")
    for name, cap in res.capacity_to_reach(args.target).items():
        where = "not reached" if cap is None else f"{cap:,} tokens ({cap // res.page_size:,} pages)"
        print(f"  {name:>9}: {where}")
    if args.out:
        paths = res.save(args.out)
        try:   # the chart builder draws with plotly, so it lives with the dashboard (core never imports plotly)
            from radixui.lab_plot import hit_rate_figure
            chart = paths["csv"].parent / "chart.html"
            hit_rate_figure(res).write_html(chart, include_plotlyjs="cdn")
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
        if args.command == "route":
            from core.lab.route_cli import cmd_route
            return cmd_route(args, _load)
        return {"sweep": cmd_sweep, "workloads": cmd_workloads}[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
