"""Capacity lab: replay workloads through the real RadixCache at many pool sizes and eviction
policies, next to the infinite-capacity hit rate and the offline optimum (Belady).

    from core.lab import load_mooncake, run_sweep
    res = run_sweep(load_mooncake(MOONCAKE_SYNTHETIC), ["1000p", "6000p"], ["lru", "lfu"], page_size=512)

    from core.lab import load_model_config, replay_with_host, size     # the planner: GiB, search, host tier

CLI: python -m core.lab sweep --help, python -m core.lab size --help. The chart builder is core.lab.chart (core never imports plotly).
"""
from core.lab.host_tier import HostTierResult, replay_with_host
from core.lab.optimal import BoundResult, Bounds, capacity_pages, infinite_hit_rate, optimal_hit_rate
from core.lab.page_trace import Overlap, PageTrace, page_trace, request_pages
from core.lab.replay import HostTier, ReplayResult, pool_pages_needed, replay
from core.lab.size import SizeAnswer, size
from core.lab.sweep import SweepResult, parse_capacities, parse_policies, run_sweep
from core.lab.traces import MOONCAKE_SYNTHETIC, load_jsonl, load_mooncake, load_trace
from core.lab.units import ModelKV, load_model_config, parse_capacity
from core.lab.workloads import (
                                GENERATORS,
                                TraceRequest,
                                Workload,
                                concat,
                                few_shot,
                                generated_shared_prefix,
                                make_workload,
                                multi_turn_chat,
                                tree_of_thought,
                                workload_params,
)

__all__ = [
    "BoundResult", "Bounds", "capacity_pages", "infinite_hit_rate", "optimal_hit_rate",
    "Overlap", "PageTrace", "page_trace", "request_pages", "HostTier", "ReplayResult", "pool_pages_needed", "replay",
    "HostTierResult", "replay_with_host", "SizeAnswer", "size", "ModelKV", "load_model_config",
    "SweepResult", "parse_capacities", "parse_capacity", "parse_policies", "run_sweep",
    "MOONCAKE_SYNTHETIC", "load_jsonl", "load_mooncake", "load_trace",
    "GENERATORS", "TraceRequest", "Workload", "concat", "few_shot", "generated_shared_prefix", "make_workload",
    "multi_turn_chat", "tree_of_thought", "workload_params",
]
