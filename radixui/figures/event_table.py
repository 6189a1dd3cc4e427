"""The event log as a table: newest first, filter by kind, splits and evictions flagged; plus one
human sentence per event ("split node 1 after 1 token", "evicted node 3 ([6,7,8,9], ...)").

Accepts core.cache.events objects or their `to_dict()` form (what a remote engine would send).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import pandas as pd

from core.cache.events import EventLike, ev_get, ev_kind
from radixui.figures.fmt import TokenText, clean, fmt_time, resolve_token_text, shorten, slot_list, slot_runs

EVENT_KINDS = ("match", "split", "insert", "alloc", "free", "evict", "lock", "unlock", "reset")
HIGHLIGHT_KINDS = ("split", "evict")

ROOT_ID = 0  # RadixCache.reset gives the root id 0
COLUMNS = ["seq", "time", "kind", "node", "description", "highlight"]


def _nodes_text(path: Sequence[int]) -> str:
    return " → ".join(str(n) for n in path)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def describe_event(event: EventLike, token_text: Optional[TokenText] = None) -> str:
    """One sentence in the article's words for a cache event."""
    tt = resolve_token_text(token_text)
    kind = ev_kind(event)
    g = lambda name, default=None: ev_get(event, name, default)  # noqa: E731
    if kind == "match":
        asked, hit, path = int(g("tokens_asked", 0)), int(g("tokens_hit", 0)), tuple(g("path", ()) or ())
        if hit == 0:
            return f"no cached prefix: all {_plural(asked, 'token')} must be computed (miss)"
        return (f"matched {hit} of {_plural(asked, 'token')} along node{'s' if len(path) != 1 else ''} "
                f"{_nodes_text(path)}; {asked - hit} left to compute")
    if kind == "split":
        pos = int(g("position", 0))
        return (f"split node {g('node')} after {_plural(pos, 'token')}: "
                f"new node {g('new_parent')} holds the common prefix")
    if kind == "insert":
        text = shorten(clean(tt(g("token_ids", ()))), 60)
        slots = tuple(g("slots", ()) or ())
        parent = "the root" if int(g("parent", -1)) == ROOT_ID else f"node {g('parent')}"
        return (f"inserted node {g('node')} under {parent}: '{text}' "
                f"in slot{'s' if len(slots) != 1 else ''} {slot_runs(slots, max_runs=4)}")
    if kind == "alloc":
        slots = tuple(g("slots", ()) or ())
        return f"alloc({len(slots)}) from free_pages: slot{'s' if len(slots) != 1 else ''} {slot_runs(slots, max_runs=4)}"
    if kind == "free":
        slots = tuple(g("slots", ()) or ())
        return (f"freed slot{'s' if len(slots) != 1 else ''} {slot_runs(slots, max_runs=4)} to the back of "
                f"free_pages (old KV stays until overwritten)")
    if kind == "evict":
        text = shorten(clean(tt(g("token_ids", ()))), 60)
        return (f"evicted node {g('node')} ({slot_list(tuple(g('slots', ()) or ()))}, '{text}', "
                f"last used at time {fmt_time(g('last_access_time'))})")
    if kind == "lock":
        return f"locked path {_nodes_text(tuple(g('path', ()) or ()))} for a running request"
    if kind == "unlock":
        return f"unlocked path {_nodes_text(tuple(g('path', ()) or ()))}"
    if kind == "reset":
        return "cache reset: tree emptied, every slot back in free_pages"
    return f"{kind} event"


def _event_node(event: EventLike) -> Optional[int]:
    node = ev_get(event, "node")
    if node is None and ev_kind(event) == "match":
        path = ev_get(event, "path") or ()
        node = path[-1] if path else None
    return None if node is None else int(node)


def event_table(events: Iterable[EventLike], token_text: Optional[TokenText] = None,
                kinds: Optional[Iterable[str]] = None, limit: Optional[int] = None) -> pd.DataFrame:
    """Events newest first: seq, time, kind, node, description, highlight ("split"/"evict"/"").

    `kinds` keeps only those event kinds; `limit` keeps the newest `limit` rows after filtering.
    """
    keep = None if kinds is None else set(kinds)
    rows = []
    for e in reversed(list(events)):
        kind = ev_kind(e)
        if keep is not None and kind not in keep:
            continue
        rows.append({"seq": int(ev_get(e, "seq", 0)), "time": ev_get(e, "time"), "kind": kind,
                     "node": _event_node(e), "description": describe_event(e, token_text),
                     "highlight": kind if kind in HIGHLIGHT_KINDS else ""})
        if limit is not None and len(rows) >= limit:
            break
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["node"] = df["node"].astype("Int64")
    return df


def event_counts(events: Iterable[EventLike]) -> dict[str, int]:
    """How many events of each kind, in EVENT_KINDS order (kinds never seen are 0)."""
    counts = {k: 0 for k in EVENT_KINDS}
    for e in events:
        k = ev_kind(e)
        counts[k] = counts.get(k, 0) + 1
    return counts
