"""A recorded KV event stream -> a capacity lab trace (plain JSONL of token ids, core/lab/traces.py).

Each BlockStored chain is one request the engine computed: its prompt is the tokens of the
parent chain already cached (a hit) followed by the newly stored blocks (the miss). Timestamps
are the batch's, in ms from the first batch. Replaying these against a bigger pool asks "what if
my cache were twice as big" of the user's own traffic. What the events cannot show is said in
the summary: requests that hit the cache entirely store nothing, so SGLang never reports them
(vLLM does, as a BlockStored of blocks already cached, which count here as requests too).
"""
from __future__ import annotations

import json
import os
from typing import Optional

from core.kv_events.block_tree import BlockTree
from core.kv_events.protocol import BlockStored
from core.kv_events.recorder import replay_recording


def convert_recording(path, out, output_len: int = 0, errors: Optional[list] = None) -> dict:
    """Write one JSONL request per stored chain; returns a summary (requests, blocks, gaps)."""
    from core.kv_events.follower import StreamFollower
    tree = BlockTree()
    counts = {"requests": 0, "blocks_requested": 0, "blocks_stored": 0}
    t0: list = []
    try:
        fh = open(out, "w", encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot write trace {os.fspath(out)!r}: {e.strerror or e}") from None

    def before(ev, ts: float) -> None:   # the tree as it stood when the engine stored this chain
        if not isinstance(ev, BlockStored) or not ev.block_hashes:
            return
        if not t0:
            t0.append(ts)
        group = ev.group_idx or 0
        prefix = () if ev.parent_block_hash is None else tree.path_tokens((group, ev.parent_block_hash))
        tokens = [t for t in prefix if isinstance(t, int)] + [t for t in ev.token_ids if isinstance(t, int)]
        if not tokens:
            return
        counts["blocks_requested"] += len(tokens) // max(1, ev.block_size)
        counts["blocks_stored"] += len(ev.block_hashes)
        counts["requests"] += 1
        fh.write(json.dumps({"input_ids": tokens, "output_len": output_len,
                             "timestamp": round((ts - t0[0]) * 1000.0, 3)}) + "\n")

    tree.before_event = before
    with fh:
        follower = replay_recording(path, StreamFollower(tree), errors)
    st = follower.status()
    return dict(counts, batches=st["batches"], unrecovered_gaps=st["unrecovered_gaps"],
                missing_batches=st["missing_batches"])
