"""A recorded KV event stream -> a capacity lab trace (plain JSONL of token ids, core/lab/traces.py).

Each BlockStored chain the device computed is one request: its prompt is the tokens of the
parent chain already cached (a hit) followed by the newly stored blocks (the miss). Timestamps
are the batch's, in ms from the first request. Replaying these against a bigger pool asks "what
if my cache were twice as big" of the user's own traffic.

A request is counted once, so only device-tier stores (medium GPU; none given means GPU) of the
first KV cache group (group_idx 0; SGLang sends none) whose whole parent chain is known become
requests. The rest is counted in the summary and not replayed: tier copies (SGLang HiCache's
CPU_PINNED write-through, vLLM's CPU offload: the same blocks again, on another tier), other
groups (a hybrid model's per-group stores of the same request), and orphans (a parent the stream
never showed or already removed: the prompt would be cut short).

What the events cannot show is said here too: requests that hit the cache entirely store nothing,
so SGLang never reports them (vLLM does, as a BlockStored of blocks already cached, which count
here as requests too).
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional

from core.kv_events.block_tree import BlockTree
from core.kv_events.follower import StreamFollower
from core.kv_events.protocol import MEDIUM_GPU, BlockStored, medium_name
from core.kv_events.recorder import replay_recording

FIRST_GROUP = 0


def store_kind(ev: BlockStored, tree: BlockTree) -> str:
    """"request", or why the store is not one: "tier_copy", "other_group", "orphan" (tree as it
    stood before the store)."""
    if medium_name(ev.medium) != MEDIUM_GPU:
        return "tier_copy"
    group = ev.group_idx or 0
    if group != FIRST_GROUP:
        return "other_group"
    parent = None if ev.parent_block_hash is None else (group, ev.parent_block_hash)
    return "request" if tree.chain_known(parent) else "orphan"


def convert_recording(path, out, output_len: int = 0, errors: Optional[list] = None) -> dict:
    """Write one JSONL request per device store; returns a summary (requests, what was skipped, gaps)."""
    tree = BlockTree()
    counts = {"requests": 0, "blocks_requested": 0, "blocks_stored": 0,
              "tier_copies": 0, "other_groups": 0, "orphans": 0}
    plural = {"tier_copy": "tier_copies", "other_group": "other_groups", "orphan": "orphans"}
    if isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 0:
        raise ValueError(f"output_len must be an integer >= 0 (the lab's loader refuses others), got {output_len!r}")
    if os.path.exists(out) and os.path.exists(path) and os.path.samefile(path, out):
        raise ValueError(f"--out {os.fspath(out)!r} is the recording itself: write the trace to another file")
    t0: list = []
    # the trace goes to a temporary file beside `out`, renamed over it only once the recording was read: a failed
    # read left an empty `out` (an existing trace, or the recording itself when they were one file, destroyed)
    tmp = f"{os.fspath(out)}.{os.getpid()}.part"     # open(), not mkstemp: the umask's permissions, as before
    try:
        fh = open(tmp, "x", encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot write trace {os.fspath(out)!r}: {e.strerror or e}") from None

    def before(ev, ts: float) -> None:   # the tree as it stood when the engine stored this chain
        if not isinstance(ev, BlockStored) or not ev.block_hashes:
            return
        kind = store_kind(ev, tree)
        if kind != "request":
            counts[plural[kind]] += 1
            return
        prefix = () if ev.parent_block_hash is None else tree.path_tokens((FIRST_GROUP, ev.parent_block_hash))
        tokens = [t for t in prefix if isinstance(t, int)] + [t for t in ev.token_ids if isinstance(t, int)]
        if not tokens:
            return
        if not t0:
            t0.append(ts)
        counts["blocks_requested"] += len(tokens) // max(1, ev.block_size)
        counts["blocks_stored"] += len(ev.block_hashes)
        counts["requests"] += 1
        at = (ts - t0[0]) * 1000.0
        fh.write(json.dumps({"input_ids": tokens, "output_len": output_len,      # NaN / inf: no timestamp, not
                             "timestamp": round(at, 3) if math.isfinite(at) else None}) + "\n")   # a NaN the lab refuses

    tree.before_event = before
    try:
        with fh:
            follower = replay_recording(path, StreamFollower(tree), errors)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    st = follower.status()
    return dict(counts, batches=st["batches"], unrecovered_gaps=st["unrecovered_gaps"],
                missing_batches=st["missing_batches"])
