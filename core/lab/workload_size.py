"""A generated workload's counts and size, checked before it is built: its prompts live in memory as int64 token
arrays (8 bytes a token), and a form field has no natural limit (tree-of-thought at branching 10, depth 9 ran the
dashboard out of memory after 26 s)."""
from __future__ import annotations

from typing import Any

import numpy as np

MAX_GENERATED_TOKENS = 100_000_000
MAX_GENERATED_REQUESTS = 1_000_000
MAX_TRACE_TOKENS = MAX_GENERATED_TOKENS   # a trace of token ids, texts or chats keeps its prompts in memory too


class WorkloadTooLarge(ValueError):
    """A trace past MAX_TRACE_TOKENS: not a malformed line to skip, the whole read stops."""


def check_counts(**kw: Any) -> None:
    """ValueError naming the first count that is not a positive integer."""
    for name, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def check_size(name: str, requests: int, prompt_tokens: int, at_least: bool = False) -> None:
    """ValueError before anything is built when the parameters ask for more than MAX_GENERATED_*."""
    if requests > MAX_GENERATED_REQUESTS or prompt_tokens > MAX_GENERATED_TOKENS:
        more = "at least " if at_least else ""
        raise ValueError(f"these {name} parameters make {more}{requests:,} requests of {prompt_tokens:,} prompt "
                         f"tokens in all; a generated workload holds at most {MAX_GENERATED_REQUESTS:,} requests and "
                         f"{MAX_GENERATED_TOKENS:,} tokens (its prompts are kept in memory): make it smaller")


def tree_size(branching: int, depth: int, first_prompt: int, per_level: int) -> tuple[int, int, bool]:
    """(nodes, prompt tokens, whether the count stopped early) of one tree-of-thought problem: branching**level
    nodes a level, each prompt `per_level` tokens longer than its parent's. The count stops once it is already
    too big (10**9 levels would take long), and then it is a lower bound."""
    nodes = tokens = 0
    for level in range(depth):
        count = branching ** level
        nodes += count
        tokens += count * (first_prompt + level * per_level)
        if nodes > MAX_GENERATED_REQUESTS or tokens > MAX_GENERATED_TOKENS:
            return nodes, tokens, level + 1 < depth
    return nodes, tokens, False
