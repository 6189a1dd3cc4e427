"""Workloads for the capacity lab: requests as token ids (no text, no model), and four generators.

A `TraceRequest` is what the replay needs from one call to an LLM server: the prompt's token ids,
how many tokens it generates, and optionally when it arrived. Outputs are token ids too: a
generator that feeds answers back (multi-turn chat, tree-of-thought) fixes them so the next
prompt can contain them; otherwise each request gets fresh ids that occur nowhere else.

Block traces (Mooncake) do not carry tokens, only one hash id per 512-token block; a request
built with `hash_ids` expands block h to the ids h*block_size .. h*block_size+block_size-1
on demand, so a 61M-token trace costs only its hash ids in memory.

Id spaces: token ids must be below OUTPUT_ID_BASE (2^50), where the fresh output ids start. Hash ids
may be anything that fits int64 (the loader renumbers traces densely first); a `Workload` renumbers
its block requests' hash ids densely when the largest would expand past MAX_EXPANDED_HASH, so
h*block_size can neither reach the output ids nor wrap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from core.lab.workload_size import check_counts, check_size, tree_size

# Fresh output ids live far above any vocabulary and any expanded block id, one range per request.
OUTPUT_ID_BASE = 1 << 50
OUTPUT_ID_STRIDE = 1 << 24
MAX_EXPANDED_HASH = 1 << 32   # hash ids at or above this (times a block size up to 2^18) are renumbered


def _id_array(ids: Any, what: str, below: Optional[int] = None) -> np.ndarray:
    """Ids as a 1-D int64 array; a ValueError (not numpy's OverflowError) for ids out of range."""
    try:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"{what} must be integers below 2^63; load traces with load_mooncake, which "
                         f"renumbers hash ids of any size") from None
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{what} must be non-negative, found {int(arr.min())}")
    if below is not None and arr.size and int(arr.max()) >= below:
        raise ValueError(f"{what}: id {int(arr.max())} is too large (token ids are vocabulary indices, "
                         f"below 2^{below.bit_length() - 1})")
    return arr


class TraceRequest:
    """One request: prompt token ids (or block hash ids), output length, optional timestamp (ms)."""

    __slots__ = ("rid", "output_len", "timestamp", "extra_key", "_prompt", "_output",
                 "hash_ids", "block_size", "prompt_len")

    def __init__(self, prompt: Optional[Sequence[int] | np.ndarray] = None, output_len: int = 1,
                 timestamp: Optional[float] = None, output: Optional[Sequence[int] | np.ndarray] = None, *,
                 hash_ids: Optional[Sequence[int] | np.ndarray] = None, input_len: Optional[int] = None,
                 block_size: int = 512, extra_key: Optional[str] = None, rid: int = 0) -> None:
        if (prompt is None) == (hash_ids is None):
            raise ValueError("a TraceRequest needs exactly one of prompt (token ids) or hash_ids (block trace)")
        if hash_ids is not None:
            self.hash_ids = _id_array(hash_ids, "hash_ids")
            if isinstance(block_size, bool) or int(block_size) != block_size or not 1 <= block_size <= 1 << 18:
                raise ValueError(f"block_size must be an integer from 1 to 2^18, got {block_size!r}")
            self.block_size = int(block_size)
            full = self.hash_ids.shape[0] * self.block_size
            self.prompt_len = full if input_len is None else int(input_len)
            if not 0 < self.prompt_len <= full or self.prompt_len <= full - self.block_size:
                raise ValueError(f"input_len={self.prompt_len} does not fit {self.hash_ids.shape[0]} blocks of "
                                 f"{self.block_size} tokens (expected {full - self.block_size + 1}..{full})")
            self._prompt = None
        else:
            self._prompt = _id_array(prompt, "prompt token ids", OUTPUT_ID_BASE)
            self.hash_ids = None
            self.block_size = 0
            self.prompt_len = int(self._prompt.shape[0])
            if self.prompt_len == 0:
                raise ValueError("a TraceRequest needs a non-empty prompt")
        self._output = None if output is None else _id_array(output, "output token ids", OUTPUT_ID_BASE)
        if self._output is not None:
            output_len = int(self._output.shape[0])
        if isinstance(output_len, bool) or int(output_len) != output_len or output_len < 0:
            raise ValueError(f"output_len must be a non-negative integer, got {output_len!r}")
        if output_len >= OUTPUT_ID_STRIDE:
            raise ValueError(f"output_len={output_len} is too large (limit {OUTPUT_ID_STRIDE - 1})")
        self.output_len = int(output_len)
        self.timestamp = None if timestamp is None else float(timestamp)
        self.extra_key = extra_key
        self.rid = int(rid)

    def prompt_ids(self) -> np.ndarray:
        """The prompt's token ids (materialised from the hash ids for block traces)."""
        if self._prompt is not None:
            return self._prompt
        ids = (self.hash_ids[:, None] * self.block_size + np.arange(self.block_size, dtype=np.int64)).reshape(-1)
        return ids[:self.prompt_len]

    def output_ids(self) -> np.ndarray:
        """The generated token ids: fixed by the generator, or fresh ids unique to this request."""
        if self._output is not None:
            return self._output
        start = OUTPUT_ID_BASE + self.rid * OUTPUT_ID_STRIDE
        return np.arange(start, start + self.output_len, dtype=np.int64)

    @property
    def cached_len(self) -> int:
        """Tokens the engine caches when the request finishes: prompt + output minus the last token."""
        return self.prompt_len + max(self.output_len - 1, 0)

    def cached_ids(self) -> np.ndarray:
        """prompt + output[:-1]: the sequence `cache_finished_req` inserts (the last token has no KV)."""
        if self._prompt is None and self._output is None:
            # block trace: expand the blocks and write the fresh output ids in one buffer, one pass each
            n_blocks, bs = self.hash_ids.shape[0], self.block_size
            out = np.empty(max(n_blocks * bs, self.cached_len), dtype=np.int64)
            np.add((self.hash_ids * bs)[:, None], np.arange(bs, dtype=np.int64),
                   out=out[:n_blocks * bs].reshape(n_blocks, bs))
            if self.output_len > 1:
                start = OUTPUT_ID_BASE + self.rid * OUTPUT_ID_STRIDE
                out[self.prompt_len:self.cached_len] = np.arange(start, start + self.output_len - 1, dtype=np.int64)
            return out[:self.cached_len]
        if self.output_len <= 1:
            return self.prompt_ids()
        return np.concatenate([self.prompt_ids(), self.output_ids()[:-1]])

    @property
    def has_output_ids(self) -> bool:
        """True when the workload fixed the output's token ids (a block trace or a plain prompt draws fresh ones)."""
        return self._output is not None

    def copy(self) -> "TraceRequest":
        """The same request with a fresh rid slot (a workload slice renumbers its copies)."""
        if self.hash_ids is not None:
            return TraceRequest(None, self.output_len, self.timestamp, self._output, hash_ids=self.hash_ids,
                                input_len=self.prompt_len, block_size=self.block_size, extra_key=self.extra_key)
        return TraceRequest(self._prompt, self.output_len, self.timestamp, self._output, extra_key=self.extra_key)

    def __repr__(self) -> str:
        kind = f"blocks={self.hash_ids.shape[0]}" if self.hash_ids is not None else "tokens"
        return (f"TraceRequest(rid={self.rid}, prompt_len={self.prompt_len}, {kind}, output_len={self.output_len}, "
                f"timestamp={self.timestamp})")


@dataclass
class Workload:
    """Requests in arrival order, with where they came from."""

    name: str
    requests: list[TraceRequest]
    params: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0           # malformed trace lines skipped (on_error="skip")

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError(f"workload {self.name!r} has no requests")
        for i, r in enumerate(self.requests):
            r.rid = i   # fresh output ids are keyed by position, so they never collide
        _renumber_hash_ids(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def has_timestamps(self) -> bool:
        return all(r.timestamp is not None for r in self.requests)

    @property
    def is_block_trace(self) -> bool:
        return all(r.hash_ids is not None for r in self.requests)

    def slice(self, start: int, stop: int) -> "Workload":
        """Requests [start:stop] as a new workload (a trace slice)."""
        reqs = [r.copy() for r in self.requests[start:stop]]
        return Workload(f"{self.name}[{start}:{stop}]", reqs, dict(self.params), 0)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "requests": len(self), "prompt_tokens": self.prompt_tokens,
                "output_tokens": sum(r.output_len for r in self.requests),
                "timestamps": self.has_timestamps, **self.params}


def _renumber_hash_ids(reqs: list[TraceRequest]) -> None:
    """Dense hash ids (sorted order) for the block requests, when any would expand past MAX_EXPANDED_HASH.
    A bijection on the ids, so prefix sharing and every hit rate stay as they were; the TraceRequest objects get
    new arrays (the caller's arrays are not written)."""
    blocks = [r for r in reqs if r.hash_ids is not None]
    if not blocks or max(int(r.hash_ids.max()) for r in blocks) < MAX_EXPANDED_HASH:
        return
    _, inverse = np.unique(np.concatenate([r.hash_ids for r in blocks]), return_inverse=True)
    at = 0
    for r in blocks:
        n = r.hash_ids.shape[0]
        r.hash_ids = inverse[at:at + n].astype(np.int64)
        at += n


# ----- generators ------------------------------------------------------------------------------
class _Tokens:
    """Random token runs; every run drawn from one generator so a seed fixes the whole workload."""

    def __init__(self, seed: int, vocab_size: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2^63), got {seed!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or not 2 <= vocab_size <= 2**62:
            raise ValueError(f"vocab_size must be an integer in [2, 2^62], got {vocab_size!r}")
        self.rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size

    def __call__(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.vocab_size, size=int(n), dtype=np.int64)


def _timestamps(n: int, request_rate: Optional[float], seed: int) -> list[Optional[float]]:
    """Poisson arrivals at `request_rate` requests per second, in ms; None when no rate is given."""
    if request_rate is None:
        return [None] * n
    if (isinstance(request_rate, bool) or not isinstance(request_rate, (int, float, np.integer, np.floating))
            or not math.isfinite(request_rate) or request_rate <= 0):
        raise ValueError(f"request_rate must be a positive number (requests per second), got {request_rate!r}")
    gaps = np.random.default_rng(seed + 1).exponential(1000.0 / request_rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def generated_shared_prefix(num_groups: int = 64, prompts_per_group: int = 16, system_prompt_len: int = 2048,
                            question_len: int = 128, output_len: int = 256, order: str = "shuffled",
                            seed: int = 1, vocab_size: int = 32000,
                            request_rate: Optional[float] = None) -> Workload:
    """SGLang's `generated-shared-prefix` benchmark: groups of prompts sharing one system prompt.

    order="grouped" sends each group's prompts back to back; "shuffled" mixes all prompts.
    """
    check_counts(num_groups=num_groups, prompts_per_group=prompts_per_group,
                  system_prompt_len=system_prompt_len, question_len=question_len, output_len=output_len)
    if order not in ("shuffled", "grouped"):
        raise ValueError(f"order must be 'shuffled' or 'grouped', got {order!r}")
    n = num_groups * prompts_per_group
    check_size("generated-shared-prefix", n, n * (system_prompt_len + question_len))
    tok = _Tokens(seed, vocab_size)
    prompts = []
    for g in range(num_groups):
        system = tok(system_prompt_len)
        for _ in range(prompts_per_group):
            prompts.append(np.concatenate([system, tok(question_len)]))
    if order == "shuffled":
        perm = np.random.default_rng(seed).permutation(len(prompts))
        prompts = [prompts[i] for i in perm]
    ts = _timestamps(len(prompts), request_rate, seed)
    reqs = [TraceRequest(p, output_len, t) for p, t in zip(prompts, ts)]
    return Workload("generated-shared-prefix", reqs, dict(
        num_groups=num_groups, prompts_per_group=prompts_per_group, system_prompt_len=system_prompt_len,
        question_len=question_len, output_len=output_len, order=order, seed=seed))


def multi_turn_chat(num_sessions: int = 16, turns: int = 6, system_prompt_len: int = 256, user_len: int = 64,
                    output_len: int = 128, order: str = "interleaved", seed: int = 1, vocab_size: int = 32000,
                    request_rate: Optional[float] = None) -> Workload:
    """Chat sessions: turn t's prompt is the system prompt + every earlier user turn and answer + a new question.

    order="interleaved" sends turn t of every session before turn t+1 (sessions in a random order
    each round); "sequential" runs each session to its end before the next starts.
    """
    check_counts(num_sessions=num_sessions, turns=turns, system_prompt_len=system_prompt_len,
                  user_len=user_len, output_len=output_len)
    if order not in ("interleaved", "sequential"):
        raise ValueError(f"order must be 'interleaved' or 'sequential', got {order!r}")
    per_session = turns * (system_prompt_len + user_len) + (user_len + output_len) * turns * (turns - 1) // 2
    check_size("multi-turn-chat", num_sessions * turns, num_sessions * per_session)
    tok = _Tokens(seed, vocab_size)
    system = tok(system_prompt_len)        # one system prompt shared by every session
    sessions = []
    for _ in range(num_sessions):
        history, convo = system, []
        for _ in range(turns):
            prompt = np.concatenate([history, tok(user_len)])
            answer = tok(output_len)
            convo.append((prompt, answer))
            history = np.concatenate([prompt, answer])
        sessions.append(convo)
    if order == "sequential":
        pairs = [pa for convo in sessions for pa in convo]
    else:
        rng = np.random.default_rng(seed + 2)
        pairs = [sessions[s][t] for t in range(turns) for s in rng.permutation(num_sessions)]
    ts = _timestamps(len(pairs), request_rate, seed)
    reqs = [TraceRequest(p, output=a, timestamp=t) for (p, a), t in zip(pairs, ts)]
    return Workload("multi-turn-chat", reqs, dict(
        num_sessions=num_sessions, turns=turns, system_prompt_len=system_prompt_len, user_len=user_len,
        output_len=output_len, order=order, seed=seed))


def few_shot(num_requests: int = 256, num_tasks: int = 4, examples_len: int = 3072, question_len: int = 96,
             output_len: int = 32, seed: int = 1, vocab_size: int = 32000,
             request_rate: Optional[float] = None) -> Workload:
    """Few-shot prompting: a long block of worked examples per task, then a varying question.

    Requests pick a task at random, so the example blocks compete for the pool.
    """
    check_counts(num_requests=num_requests, num_tasks=num_tasks, examples_len=examples_len,
                  question_len=question_len, output_len=output_len)
    check_size("few-shot", num_requests, num_requests * (examples_len + question_len) + num_tasks * examples_len)
    tok = _Tokens(seed, vocab_size)
    examples = [tok(examples_len) for _ in range(num_tasks)]
    tasks = np.random.default_rng(seed + 3).integers(0, num_tasks, size=num_requests)
    ts = _timestamps(num_requests, request_rate, seed)
    reqs = [TraceRequest(np.concatenate([examples[t], tok(question_len)]), output_len, ts[i])
            for i, t in enumerate(tasks)]
    return Workload("few-shot", reqs, dict(num_requests=num_requests, num_tasks=num_tasks,
                                           examples_len=examples_len, question_len=question_len,
                                           output_len=output_len, seed=seed))


def tree_of_thought(num_problems: int = 8, branching: int = 3, depth: int = 3, problem_len: int = 512,
                    step_len: int = 32, thought_len: int = 128, order: str = "bfs", seed: int = 1,
                    vocab_size: int = 32000, request_rate: Optional[float] = None) -> Workload:
    """Tree-of-thought search: each node's prompt is its parent's prompt + the parent's thought + a step cue.

    Every problem expands a full tree of `branching`**k nodes at level k < depth; each node generates
    a thought of `thought_len` tokens. order="bfs" explores level by level, "dfs" branch by branch;
    problems run one after another.
    """
    check_counts(num_problems=num_problems, branching=branching, depth=depth, problem_len=problem_len,
                  step_len=step_len, thought_len=thought_len)
    if order not in ("bfs", "dfs"):
        raise ValueError(f"order must be 'bfs' or 'dfs', got {order!r}")
    nodes, tokens, partial = tree_size(branching, depth, problem_len + step_len, thought_len + step_len)
    check_size("tree-of-thought", num_problems * nodes, num_problems * tokens, partial)
    tok = _Tokens(seed, vocab_size)
    pairs = []
    for _ in range(num_problems):
        root = (np.concatenate([tok(problem_len), tok(step_len)]), tok(thought_len))
        frontier = [(root, 0)]
        while frontier:
            (prompt, thought), level = frontier.pop(0) if order == "bfs" else frontier.pop()
            pairs.append((prompt, thought))
            if level + 1 < depth:
                kids = [((np.concatenate([prompt, thought, tok(step_len)]), tok(thought_len)), level + 1)
                        for _ in range(branching)]
                frontier.extend(kids if order == "bfs" else reversed(kids))
    ts = _timestamps(len(pairs), request_rate, seed)
    reqs = [TraceRequest(p, output=a, timestamp=t) for (p, a), t in zip(pairs, ts)]
    return Workload("tree-of-thought", reqs, dict(
        num_problems=num_problems, branching=branching, depth=depth, problem_len=problem_len,
        step_len=step_len, thought_len=thought_len, order=order, seed=seed))


GENERATORS: dict[str, Callable[..., Workload]] = {
    "generated-shared-prefix": generated_shared_prefix,
    "multi-turn-chat": multi_turn_chat,
    "few-shot": few_shot,
    "tree-of-thought": tree_of_thought,
}


def make_workload(name: str, **params: Any) -> Workload:
    """Build a generated workload by name; unknown names and parameters get a ValueError listing the valid ones."""
    import inspect
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(GENERATORS)}")
    fn = GENERATORS[name]
    allowed = list(inspect.signature(fn).parameters)
    bad = [k for k in params if k not in allowed]
    if bad:
        raise ValueError(f"workload {name!r} has no parameter {', '.join(map(repr, bad))}; "
                         f"its parameters are: {', '.join(allowed)}")
    return fn(**params)


def workload_params(name: str) -> dict[str, Any]:
    """Parameter names and defaults of a generator (for the CLI's --help and the dashboard's form)."""
    import inspect
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(GENERATORS)}")
    return {k: p.default for k, p in inspect.signature(GENERATORS[name]).parameters.items()}


def concat(*workloads: Workload, name: Optional[str] = None) -> Workload:
    """Phases one after another (e.g. a hot prefix, then others). Timestamps are dropped unless all have them,
    in which case each phase starts where the previous one ended."""
    if not workloads:
        raise ValueError("concat needs at least one workload")
    timed = all(w.has_timestamps for w in workloads)
    reqs, offset = [], 0.0
    for w in workloads:
        for r in w.requests:
            c = r.copy()
            c.timestamp = (r.timestamp + offset) if timed else None
            reqs.append(c)
        if timed:
            offset = reqs[-1].timestamp
    return Workload(name or " + ".join(w.name for w in workloads), reqs,
                    {"phases": [w.summary() for w in workloads]})
