"""The planner's parts of `python -m core.lab`: model-aware units and the host tier on `sweep`, and the
`size` subcommand (smallest pool reaching a share of the infinite-capacity rate, by search).

    python -m core.lab size --trace data.jsonl --page-size 512 --target 0.9 --model-config llama-3.1-8b
    python -m core.lab sweep ... --capacities 20GiB,40GiB,80GiB --model-config llama-3.1-8b \\
        --host-capacity 200GiB --write-policy write_through
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional

from core.cache.eviction.registry import is_stateful
from core.lab.chat_traces import DEFAULT_SESSIONS
from core.lab.host_tier import (
    DEFAULT_BANDWIDTH_GBPS,
    DEFAULT_PREFILL_TOKENS_PER_S,
    WRITE_POLICIES,
    check_write_policy,
    host_tier_refusal,
    replay_with_host,
)
from core.lab.page_trace import NO_HITS_NOTE
from core.lab.traces import MOONCAKE_BLOCK
from core.lab.units import ModelKV, add_bytes_columns, fmt_capacity, load_model_config, parse_capacity, shipped_models

CAPACITY_HELP = ("comma-separated pool sizes: bytes of KV memory with --model-config (80GiB, 40GB), tokens "
                 "(3072000; k = 1,000 tokens, M = 1,000,000 tokens, G = 1,000,000,000 tokens: 3M, 512k) or "
                 "pages (6000p)")


def add_unit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-config", metavar="PATH_OR_NAME",
                   help="a Hugging Face config.json (or its folder) or a shipped name "
                        f"({', '.join(shipped_models())}): sizes KV in bytes, capacities may be given in GiB/GB")
    p.add_argument("--kv-dtype", metavar="DTYPE", help="KV cache dtype instead of the config's torch_dtype "
                                                       "(fp8, bf16, fp16, fp32)")


def add_host_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host-capacity", metavar="SIZE",
                   help="a host-memory tier behind the pool, as SGLang's HiCache (tokens, pages or GiB with "
                        "--model-config); reports device hits, host hits and misses per point")
    p.add_argument("--write-policy", default="write_through", choices=list(WRITE_POLICIES),
                   help="with --host-capacity: when pages are copied to host (SGLang's --hicache-write-policy)")
    p.add_argument("--host-bandwidth", type=float, default=DEFAULT_BANDWIDTH_GBPS, metavar="GB_PER_S",
                   help="with --host-capacity and --model-config: effective host-to-device bandwidth, GB/s "
                        "(PCIe 4.0 x16 ~25)")
    p.add_argument("--prefill-rate", type=float, default=DEFAULT_PREFILL_TOKENS_PER_S, metavar="TOKENS_PER_S",
                   help="with --host-capacity and --model-config: prefill throughput for the TTFT estimate "
                        "; the default is an 8B model on one H100-class GPU, order of magnitude: measure yours")


def model_of(args) -> Optional[ModelKV]:
    if getattr(args, "model_config", None):
        return load_model_config(args.model_config, args.kv_dtype)
    if getattr(args, "kv_dtype", None):
        raise ValueError("--kv-dtype needs --model-config (the dtype only changes bytes per token)")
    return None


def check_host_args(args, kv: Optional[ModelKV]) -> None:
    """The host-tier flags, checked before any work (the page size is checked again once known)."""
    if not args.host_capacity:
        return
    check_write_policy(args.write_policy)
    parse_capacity(args.host_capacity, args.page_size or 1, kv)
    for flag, v in (("--host-bandwidth", args.host_bandwidth), ("--prefill-rate", args.prefill_rate)):
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{flag} must be a positive number, got {v}")


def print_sweep(args, res, kv: Optional[ModelKV]) -> None:
    """The sweep's table with bytes, and the smallest swept capacities spelled in tokens and GiB."""
    import pandas as pd
    df = add_bytes_columns(res.table(), kv)
    cols = ["policy", "capacity_tokens"] + (["capacity_gib"] if kv else []) + [
        "capacity_pages", "hit_rate", "optimal_hit_rate", "gap_to_optimal", "evictions", "evicted_tokens",
        "rejected", "seconds"]
    with pd.option_context("display.max_rows", 500, "display.width", 180):
        print(df[cols].to_string(index=False, float_format="%.4f", na_rep=""))
    if kv is not None:
        print(kv.describe())
    print(f"\ninfinite-capacity hit rate: {res.infinite_hit_rate:.4f}   "
          f"({res.distinct_pages:,} distinct pages of {res.page_size}; sweep {res.seconds:.1f} s)")
    for note in (res.nothing_fits_note(), res.capped_note()):
        if note:
            print(f"note: {note}")
    print(f"smallest swept capacity reaching {args.target:.0%} of it (python -m core.lab size searches between "
          f"the swept points):")
    why = f" ({NO_HITS_NOTE})" if res.infinite_hit_rate <= 0 else ""
    for name, cap in res.capacity_to_reach(args.target).items():
        print(f"  {name:>9}: {'not reached' + why if cap is None else fmt_capacity(cap, res.page_size, kv)}")


def host_rows(args, workload, res, kv: Optional[ModelKV], overlap) -> Optional[list[dict]]:
    """With --host-capacity: one host-tier replay per swept (policy, capacity), printed and returned."""
    if not args.host_capacity:
        return None
    ps = res.page_size
    host = parse_capacity(args.host_capacity, ps, kv)
    stateful = [p for p in res.policies if ps > 1 and is_stateful(p)]
    if stateful:
        print(f"\nnote: {host_tier_refusal(stateful, ps)}")
    rows = []
    for pol in (p for p in res.policies if p not in stateful):
        for cap in res.capacities:
            r = replay_with_host(workload, cap, host, pol, ps, overlap, args.write_policy)
            row = r.summary()
            if kv is not None:
                row.update(r.ttft(kv, args.prefill_rate, args.host_bandwidth))
            rows.append(row)
    if not rows:
        return rows
    import pandas as pd
    df = pd.DataFrame(rows)
    ttft = [c for c in df.columns if c.startswith("ttft_")]
    df[ttft] = df[ttft].astype(float)           # None (no request served) prints blank
    print(f"\nwith a host tier of {fmt_capacity(host, ps, kv)} ({args.write_policy}):")
    cols = ["policy", "device_tokens", "device_hit_rate", "host_hit_rate", "hit_rate", "miss_tokens", "rejected"]
    if kv is not None:
        cols += ["prefill_seconds_saved", "ttft_p50_device_only", "ttft_p50_with_host", "ttft_p99_device_only",
                 "ttft_p99_with_host"]
        print(f"(TTFT per request alone: prefill at {args.prefill_rate:,.0f} tokens/s, host hits loaded at "
              f"{args.host_bandwidth:g} GB/s, serially)")
    with pd.option_context("display.max_rows", 500, "display.width", 200):
        print(df[cols].to_string(index=False, float_format="%.4f", na_rep=""))
    return rows


def save_extras(res, paths: dict, kv: Optional[ModelKV], hosts: Optional[list[dict]]) -> None:
    """results.csv gains the bytes columns, results.json the model and the host-tier rows. The CSV is written
    again from the sweep's table, not reread (rereading it turned the integer columns with gaps, such as the
    optimum's empty evictions, into floats: 48.0)."""
    if kv is not None:
        add_bytes_columns(res.table(), kv).to_csv(paths["csv"], index=False)
    data = json.loads(Path(paths["json"]).read_text())
    data["model"] = None if kv is None else kv.to_dict()
    data["host_tier"] = hosts
    Path(paths["json"]).write_text(json.dumps(data, indent=2))


def check_common_args(args) -> None:
    """The flags sweep, size and route share, checked before any trace is read."""
    workers = getattr(args, "workers", 1)
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if args.page_size is not None and args.page_size < 1:
        raise ValueError(f"--page-size must be a positive number of tokens per page (512 for Mooncake traces), "
                         f"got {args.page_size}")
    if args.sessions is not None and args.sessions < 1:
        raise ValueError(f"--sessions must be at least 1 (conversations in progress at once), got {args.sessions}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be a positive number of requests to read, got {args.limit} "
                         f"(leave it out to read the whole trace)")
    for flag in ("ms_per_output_token", "ms_per_prompt_token"):   # else Overlap named its own field, late
        v = getattr(args, flag, None)
        if v is not None and (not math.isfinite(v) or v < 0):
            raise ValueError(f"--{flag.replace('_', '-')} must be a non-negative number of milliseconds, got {v}")
    concurrency = getattr(args, "concurrency", None)
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1 (requests in flight), got {concurrency}")


# ----- size ----------------------------------------------------------------------------------------
def add_source(p: argparse.ArgumentParser) -> None:
    """The workload flags, as `sweep` has them (read by core.lab.__main__._load)."""
    from core.lab.workloads import GENERATORS
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="PATH", help="a Mooncake JSONL trace, or JSONL (or a JSON array) of token "
                                                      "ids, texts or chats (OpenAI messages, ShareGPT)")
    src.add_argument("--workload", metavar="NAME", choices=list(GENERATORS),
                     help=f"a generated workload: {', '.join(GENERATORS)} (parameters: python -m core.lab workloads)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a generator parameter, repeatable (e.g. -p num_groups=16 -p order=grouped)")
    p.add_argument("--format", default="auto", choices=["auto", "mooncake", "jsonl"], help="trace format")
    p.add_argument("--tokenizer", metavar="NAME_OR_PATH",
                   help="Hugging Face tokenizer for text traces (and its chat template for chats)")
    p.add_argument("--sessions", type=int, default=None,
                   help="conversations in progress at once when a trace holds whole conversations: their turns "
                        f"replay in turn (1: each conversation to its end; default {DEFAULT_SESSIONS})")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed trace lines and count them")
    p.add_argument("--block-size", type=int, default=MOONCAKE_BLOCK,
                   help="tokens a hash id stands for in a Mooncake-format trace (Alibaba's blksz_16 traces: 16)")
    p.add_argument("--limit", type=int, help="read only the first N requests of the trace")


def add_size_parser(sub) -> None:
    sz = sub.add_parser("size", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                        help="the smallest pool reaching a share of the infinite-capacity hit rate, per policy and "
                             "for the optimum, found by search (within 1 %%)")
    add_source(sz)
    sz.add_argument("--target", type=float, default=0.9, help="fraction of the infinite-capacity hit rate to reach")
    sz.add_argument("--policies", default="lru,lfu,fifo,slru", help="comma-separated, or 'all'")
    sz.add_argument("--page-size", type=int, default=None,
                    help="tokens per page; default: the block size of a block trace (512 for Mooncake), else 1")
    sz.add_argument("--overlap", action="store_true", help="overlap requests by timestamp (see sweep --help)")
    sz.add_argument("--ms-per-output-token", type=float, default=20.0, help="with --overlap: modeled decode time")
    sz.add_argument("--tolerance", type=float, default=0.01, help="relative width of the answer's bracket")
    sz.add_argument("--workers", type=int, default=2,
                    help="policies searched in parallel processes (at most one a CPU)")
    sz.add_argument("--out", metavar="DIR", help="write size.json here")
    add_unit_flags(sz)


def cmd_size(args, load, page_size_of) -> int:
    """`size`: checks every flag before the trace is read (as `sweep` does), then searches per policy.
    load(args) reads the workload; page_size_of(args, workload) resolves --page-size (a block trace's
    block size by default)."""
    from core.lab.page_trace import Overlap
    from core.lab.size import check_goal, size
    from core.lab.sweep import parse_policies, prepare_out_dir
    check_common_args(args)
    check_goal(args.target, args.tolerance)
    kv = model_of(args)
    pols = parse_policies(args.policies)
    out = prepare_out_dir(args.out) if args.out else None
    workload = load(args)
    page_size = page_size_of(args, workload)
    overlap = Overlap(args.ms_per_output_token) if args.overlap else None
    s = workload.summary()
    print(f"workload {s['name']}: {s['requests']:,} requests, {s['prompt_tokens']:,} prompt tokens")
    answers = size(workload, pols, args.target, page_size, overlap, args.tolerance, args.workers)
    inf = answers[0].goal_hit_tokens / args.target / answers[0].prompt_tokens
    print(f"infinite-capacity hit rate {inf:.4f}; smallest pool reaching {args.target:.0%} of it "
          f"({args.target * inf:.4f}), within {args.tolerance:.0%}:")
    for a in answers:
        print("  " + a.describe(kv))
    if kv is not None:
        print(kv.describe())
    if out is not None:
        path = out / "size.json"
        path.write_text(json.dumps({"workload": s, "target": args.target, "page_size": page_size,
                                    "infinite_hit_rate": inf, "model": None if kv is None else kv.to_dict(),
                                    "answers": [a.to_dict(kv) for a in answers]}, indent=2, default=str))
        print(f"wrote {path}")
    return 0
