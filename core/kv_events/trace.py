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

A store under the last block of an earlier request ("extensions" in the summary) is one of two things the events
cannot tell apart: the same request going on (an engine stores a request more than once: its prompt after prefill,
chunk by chunk in SGLang, then its output when it finishes, each under the last block of the one before: SGLang's
cache_unfinished_req and cache_finished_req, and this engine's), or a new request that extends it exactly (a
chat's next turn). Replayed as requests of their own (the default), the first kind hits the whole prefix before it:
a stream of single-turn requests with no hit at all replays at 40 %. With `merge_extensions` their tokens are
appended to the request they extend (for single-turn traffic; a chat's turns would become one request). A request
stays open to that for the next WINDOW requests. Appended tokens are replayed as prompt: the events do not say
where a prompt ends.

Each request carries its namespace (`extra_key`: the store's cache_salt and LoRA, else its parent chain's), so two
tenants' equal prompts, which the engine hashed apart, do not share a prefix in the replay either.

What the events cannot show is said here too: requests that hit the cache entirely store nothing,
so SGLang never reports them (vLLM does, as a BlockStored of blocks already cached, which count
here as requests too).
"""
from __future__ import annotations

import json
import math
import os
from collections import deque
from typing import Optional

from core.kv_events.block_tree import BlockTree
from core.kv_events.follower import StreamFollower
from core.kv_events.protocol import MEDIUM_GPU, BlockStored, medium_name
from core.kv_events.recorder import replay_recording

FIRST_GROUP = 0
WINDOW = 4096          # later requests a request stays open for: a store under its last block continues it


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


def namespace(ev: BlockStored, tree: BlockTree) -> Optional[str]:
    """The store's cache namespace (BlockTree.namespace) as a lab `extra_key`."""
    salt, lora = tree.namespace(ev)
    parts = ([f"salt:{salt}"] if salt else []) + ([f"lora:{lora}"] if lora else [])
    return "|".join(parts) or None


class _Requests:
    """Trace lines in arrival order, each open for WINDOW later requests to a store that continues it."""

    def __init__(self, fh) -> None:
        self.fh = fh
        self.lines: deque = deque()          # [line, its last block hash], oldest first
        self.open: dict = {}                 # last block hash -> that entry

    def add(self, line: dict, last) -> None:
        entry = [line, last]
        self.lines.append(entry)
        self.open[last] = entry
        while len(self.lines) > WINDOW:
            self._write(self.lines.popleft())

    def extends(self, parent) -> bool:
        """Whether a store under `parent` extends an open request (`parent` is its last block)."""
        return parent in self.open

    def go_on(self, parent, tokens: list, last) -> None:
        """Append `tokens` to the open request whose last block is `parent`; it now ends at `last`."""
        entry = self.open.pop(parent)
        entry[0]["input_ids"] += tokens
        entry[1] = last
        self.open[last] = entry

    def _write(self, entry: list) -> None:
        if self.open.get(entry[1]) is entry:
            del self.open[entry[1]]
        self.fh.write(json.dumps(entry[0]) + "\n")

    def close(self) -> None:
        while self.lines:
            self._write(self.lines.popleft())


def convert_recording(path, out, output_len: int = 0, errors: Optional[list] = None,
                      merge_extensions: bool = False) -> dict:
    """Write one JSONL request per device store (with `merge_extensions`, a store that extends an open request is
    appended to it); returns a summary (requests, extensions, what was skipped, gaps, and the block sizes the
    engine stored with: the page size to sweep the trace at, as the engine's cache matched whole pages)."""
    tree = BlockTree()
    counts = {"requests": 0, "extensions": 0, "blocks_requested": 0, "blocks_stored": 0,
              "tier_copies": 0, "other_groups": 0, "orphans": 0}
    sizes: set = set()                  # the engine's page sizes: what to sweep the trace with
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
    requests = _Requests(fh)

    def before(ev, ts: float) -> None:   # the tree as it stood when the engine stored this chain
        if not isinstance(ev, BlockStored) or not ev.block_hashes:
            return
        kind = store_kind(ev, tree)
        if kind != "request":
            counts[plural[kind]] += 1
            return
        new = [t for t in ev.token_ids if isinstance(t, int)]
        last = ev.block_hashes[-1]
        sizes.add(ev.block_size)
        if ev.parent_block_hash is not None and requests.extends(ev.parent_block_hash):
            counts["extensions"] += 1
            if merge_extensions:
                requests.go_on(ev.parent_block_hash, new, last)
                counts["blocks_requested"] += len(new) // max(1, ev.block_size)
                counts["blocks_stored"] += len(ev.block_hashes)
                return
        prefix = () if ev.parent_block_hash is None else tree.path_tokens((FIRST_GROUP, ev.parent_block_hash))
        tokens = [t for t in prefix if isinstance(t, int)] + new
        if not tokens:
            return
        if not t0 and math.isfinite(ts):     # a NaN first timestamp left every line without one
            t0.append(ts)
        counts["blocks_requested"] += len(tokens) // max(1, ev.block_size)
        counts["blocks_stored"] += len(ev.block_hashes)
        counts["requests"] += 1
        at = (ts - t0[0]) * 1000.0 if t0 else math.nan
        line = {"input_ids": tokens, "output_len": output_len,      # NaN / inf: no timestamp, not a NaN the
                "timestamp": round(at, 3) if math.isfinite(at) else None}   # lab refuses
        key = namespace(ev, tree)
        if key is not None:
            line["extra_key"] = key
        requests.add(line, last)

    tree.before_event = before
    try:
        with fh:
            follower = replay_recording(path, StreamFollower(tree), errors)
            requests.close()
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    st = follower.status()
    return dict(counts, block_sizes=sorted(sizes), batches=st["batches"], unrecovered_gaps=st["unrecovered_gaps"],
                missing_batches=st["missing_batches"])
