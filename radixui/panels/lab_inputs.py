"""What the Capacity lab page reads from its widgets, as plain functions (no Streamlit, testable):
preset workloads with small defaults, uploaded traces, and the sweep's capacities and policies."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from core.lab.chat_traces import DEFAULT_SESSIONS, ChatTokenizer
from core.lab.optimal import capacity_pages
from core.lab.sweep import parse_capacities, parse_policies
from core.lab.traces import MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC, load_trace
from core.lab.units import CapacityNeedsModel, ModelKV, load_model_config, parse_capacity, shipped_models
from core.lab.workloads import Workload, make_workload, workload_params



class BundledTrace(NamedTuple):
    path: Path
    capacities: str     # the page's default sweep: from a few hundred requests' misses to most of the trace
    caption: str


# shipped with the project: data/mooncake/README.md
MOONCAKE_TRACES = {
    "synthetic": BundledTrace(
        Path(MOONCAKE_SYNTHETIC), "1000p, 3000p, 6000p, 12000p, 24000p",
        "The synthetic trace released with Mooncake (FAST'25): prompts as 512-token block hashes, no text. Its "
        "paper reports a 66 % hit rate with an infinite pool, and LRU at 3M tokens reaching about 46 % of that. "
        "The whole trace takes a few seconds per point and core."),
    "conversation": BundledTrace(
        Path(MOONCAKE_CONVERSATION), "2000p, 4000p, 8000p, 16000p, 32000p",
        "The conversation trace released with Mooncake (FAST'25): an hour of chat, 12,031 requests, the same "
        "prompt start for all and conversations that come back turn after turn; an infinite pool hits 37 % of "
        "its prompt blocks. Its 288,500 prompt blocks are 2.4 times the synthetic trace's work per point."),
}

# Small defaults: every preset replays in about a second and fits the "through the real model" run.
PRESETS: dict[str, dict[str, Any]] = {
    "generated-shared-prefix": dict(num_groups=8, prompts_per_group=6, system_prompt_len=192, question_len=32,
                                    output_len=16, order="shuffled"),
    "multi-turn-chat": dict(num_sessions=8, turns=4, system_prompt_len=64, user_len=24, output_len=24),
    "few-shot": dict(num_requests=48, num_tasks=4, examples_len=192, question_len=32, output_len=8),
    "tree-of-thought": dict(num_problems=3, branching=3, depth=3, problem_len=128, step_len=16, thought_len=32),
}
PRESET_CAPACITIES = {
    "generated-shared-prefix": "512, 1k, 2k, 3k",
    "multi-turn-chat": "256, 512, 1k, 2k",
    "few-shot": "256, 512, 1k, 2k",
    "tree-of-thought": "256, 384, 512, 1k",
}
CHOICES = {   # parameters that take one of a few words
    ("generated-shared-prefix", "order"): ["shuffled", "grouped"],
    ("multi-turn-chat", "order"): ["interleaved", "sequential"],
    ("tree-of-thought", "order"): ["bfs", "dfs"],
}
PARAM_HELP = {
    "seed": "the random token ids are drawn from this seed",
    "vocab_size": "token ids are drawn from 0 .. vocab_size - 1",
    "request_rate": "requests per second (Poisson arrivals); 0 = no timestamps. Needed by the overlap replay.",
    "order": "the order in which the requests arrive",
}
DEFAULT_POLICIES = ["lru", "lfu", "fifo", "slru"]
TOKENS_ONLY = "none (tokens only)"
MODEL_CHOICES = [TOKENS_ONLY] + list(shipped_models())
KV_DTYPES = ["as in the config", "fp8", "bf16", "fp16", "fp32"]


def model_choice(choice: str, kv_dtype: str = KV_DTYPES[0]) -> Optional[ModelKV]:
    """The page's model selector: None for tokens only, else the shipped config (KV dtype overridden)."""
    if choice == TOKENS_ONLY:
        return None
    return load_model_config(choice, None if kv_dtype == KV_DTYPES[0] else kv_dtype)


def preset_params(name: str) -> dict[str, Any]:
    """A generator's parameters with the page's small defaults (the generator's own for the rest)."""
    return {**workload_params(name), **PRESETS.get(name, {})}


def preset_workload(name: str, params: dict[str, Any]) -> Workload:
    """Build a preset; request_rate 0 means no timestamps."""
    params = dict(params)
    if params.get("request_rate") in (0, 0.0):
        params["request_rate"] = None
    return make_workload(name, **params)


def read_uploaded_trace(data: bytes, filename: str, tokenizer: Optional[Callable[[str], list]] = None,
                        skip_bad_lines: bool = False, chat: Optional[ChatTokenizer] = None,
                        sessions: int = DEFAULT_SESSIONS) -> Workload:
    """Parse an uploaded trace (Mooncake JSONL, or JSONL or a JSON array of token ids, texts or chats).

    The loaders read files, so the bytes go to a temporary file; error messages name the uploaded
    file (with the line number), never the temporary path. `tokenizer` is only called for text lines,
    `chat` for chat records.
    """
    if not data or not data.strip():
        raise ValueError(f"{filename} is empty: upload a JSONL file with one request a line")
    with tempfile.TemporaryDirectory(prefix="radix_trace_") as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        try:
            wl = load_trace(path, "auto", tokenizer, "skip" if skip_bad_lines else "raise", chat=chat,
                            sessions=sessions)
        except UnicodeDecodeError:
            raise ValueError(f"{filename} is not a UTF-8 text file; upload a JSONL trace") from None
        except ValueError as e:
            msg = str(e).replace(f"trace {path!r}", filename).replace(path, filename)
            msg = msg.replace("pass on_error='skip' / --skip-bad-lines", "tick “Skip malformed lines”")
            msg = re.sub(r"read fewer with --limit ([\d,]+) \(limit=\)", r"upload only the first \1 records", msg)
            raise ValueError(msg) from None
    wl.name = filename
    return wl


def suggest_capacities(workload: Workload, page_size: int = 1, points: int = 5) -> str:
    """Capacities for an unknown trace: halvings down from the tokens the whole workload would cache, never
    below what the longest request holds, in whole pages rounded up (rounded down, a trace of two 1,031-token
    requests at pages of 512 got 2p, where nothing fits)."""
    total = sum(r.cached_len for r in workload.requests)
    longest = max(r.cached_len for r in workload.requests)
    caps = []
    for k in range(points):
        c = max(total >> k, longest, page_size)
        c = -(-c // page_size) * page_size
        if c not in caps:
            caps.append(c)
    caps.sort()
    if page_size > 1:
        return ", ".join(f"{c // page_size}p" for c in caps)
    return ", ".join(str(c) for c in caps)


def parse_sweep_inputs(capacities: str, policies: list[str], page_size: int,
                       kv: Optional[ModelKV] = None) -> tuple[list[int], list[str]]:
    """The page's capacity text (tokens, pages, or GiB/GB with a model), policy choice and page size, checked;
    ValueError with a message otherwise."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page size must be a positive whole number of tokens, got {page_size!r}")
    if not policies:
        raise ValueError("pick at least one eviction policy")
    pols = parse_policies(list(policies))
    try:
        caps = parse_capacities(capacities, page_size, kv)
    except CapacityNeedsModel as e:   # the CLI's wording names its flag; here the control is the Model box
        raise ValueError(f"capacity {e.text!r} is in bytes: pick a model in “Model (sizes the KV cache in bytes)” "
                         f"so bytes can become tokens, or write tokens (3M) or pages (6000p)") from None
    for c in caps:
        capacity_pages(c, page_size)
    return caps, pols


def parse_host_capacity(text: str, page_size: int, kv: Optional[ModelKV]) -> int:
    """The host tier's size: tokens, pages or GiB/GB (with a model); 0 allowed (no host tier)."""
    if not str(text).strip():
        raise ValueError("give the host tier's size (tokens, pages, or GiB with a model), e.g. 64k or 200GiB")
    if str(text).strip() == "0":
        return 0
    return parse_capacity(str(text), page_size, kv)


def fmt_tokens(n: int) -> str:
    """3,072,000 -> '3.07M', 2048 -> '2,048'."""
    if n >= 1_000_000:
        return f"{n / 1e6:.3g}M"
    return f"{n:,}"
