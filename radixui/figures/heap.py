"""The eviction heap: the evictable leaves in the order the policy would evict them, next victim
first, as a table and an optional bar figure.

The order is the snapshot's `eviction_order` (the cache computed it: a node whose children all go
first becomes a leaf and joins the heap, as `evict` does); the key is the policy's priority key.
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
import plotly.graph_objects as go

from core.cache.eviction.registry import POLICIES, is_stateful
from core.observe.snapshot import CacheSnapshot, NodeView
from radixui.figures.fmt import TokenText, clean, fmt_time, html_escape, resolve_token_text, shorten, slot_runs
from radixui.figures.plot import figure

COLUMNS = ["order", "node", "last_access_time", "policy_key", "tokens", "freed_total", "text", "slots",
           "leaf_now", "hit_count"]
LEAF_COLOUR = "#dc2626"    # an evictable leaf now (red, like its outline in the tree)
LATER_COLOUR = "#9ca3af"   # becomes a leaf once its children are evicted


def policy_key(node: NodeView, policy: str) -> Optional[tuple]:
    """The policy's priority key for a node (lower goes first); None for a policy not known here,
    and for a stateful one (arc, s3fifo, ...): its key lives in the policy object's own state, which
    a snapshot does not carry (POLICIES holds only an LRU stand-in for it)."""
    if is_stateful(policy):
        return None
    fn = POLICIES.get(policy)
    return None if fn is None else tuple(float(x) for x in fn(node))


def order_note(policy: str) -> str:
    """What the Eviction heap view shows, in words; plain about a stateful policy's key."""
    if is_stateful(policy):
        return (f"Policy `{policy}` keeps state of its own: the order below is the cache's own "
                f"`eviction_order()`, next victim first; the key column is empty because `{policy}`'s key "
                f"lives in that state, not in the node.")
    return f"Policy `{policy}`: the order evict() would take nodes, next victim first."


def eviction_table(snapshot: CacheSnapshot, token_text: Optional[TokenText] = None,
                   limit: Optional[int] = None) -> pd.DataFrame:
    """Rows in eviction order (order 1 = next victim): node, last_access_time, policy_key, tokens,
    freed_total (tokens freed by evicting down to this row), text, slots (runs), leaf_now (an
    evictable leaf already, else it becomes one when the rows above it are gone), hit_count."""
    tt = resolve_token_text(token_text)
    by_id = {n.id: n for n in snapshot.nodes}
    rows = []
    freed = 0
    for i, nid in enumerate(snapshot.eviction_order[:limit] if limit is not None else snapshot.eviction_order):
        n = by_id[nid]
        freed += len(n.token_ids)
        rows.append({"order": i + 1, "node": n.id, "last_access_time": n.last_access_time,
                     "policy_key": policy_key(n, snapshot.policy), "tokens": len(n.token_ids),
                     "freed_total": freed, "text": clean(tt(n.token_ids)), "slots": slot_runs(n.slots),
                     "leaf_now": bool(n.evictable), "hit_count": n.hit_count})
    return pd.DataFrame(rows, columns=COLUMNS)


def eviction_figure(snapshot: CacheSnapshot, token_text: Optional[TokenText] = None, limit: int = 20,
                    width: int = 600) -> go.Figure:
    """Horizontal bars, next victim on top: bar length = tokens the node would free, red for leaves
    evictable now, grey for nodes that become leaves later; hover has times, key and slots."""
    df = eviction_table(snapshot, token_text, limit)
    chars = max(12, int((width * 0.45) / 7) - 12)
    labels = [f"#{r.order} node {r.node} · {html_escape(shorten(r.text, chars))}" for r in df.itertuples()]
    hover = [f"node {r.node}: '{html_escape(shorten(r.text, 200))}'<br>tokens {r.tokens} · slots "
             f"{html_escape(shorten(r.slots, 80))}<br>last_access_time {fmt_time(r.last_access_time)} · "
             + (f"key {r.policy_key} · " if r.policy_key is not None else "")
             + f"hit_count {r.hit_count}<br>"
             + ("evictable leaf now" if r.leaf_now else "becomes a leaf once the nodes above are gone")
             for r in df.itertuples()]
    trace = dict(type="bar", orientation="h", x=df["tokens"].tolist(), y=labels, hovertext=hover,
                 hoverinfo="text", marker=dict(color=[LEAF_COLOUR if v else LATER_COLOUR for v in df["leaf_now"]]),
                 text=[f"t={fmt_time(t)}" for t in df["last_access_time"]], textposition="auto",
                 name="eviction order")
    layout = dict(height=max(160, 26 * len(df) + 80), margin=dict(l=10, r=10, t=40, b=30),
                  plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", showlegend=False,
                  xaxis=dict(title=dict(text="tokens freed"), gridcolor="#e5e7eb"),
                  yaxis=dict(autorange="reversed", automargin=True, tickfont=dict(size=12)),
                  title=dict(text=f"Eviction order ({snapshot.policy}): next victim on top", x=0.01,
                             font=dict(size=13)))
    if df.empty:
        layout["annotations"] = [dict(xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                                      text="nothing evictable: every leaf is locked or the tree is empty")]
    return figure([trace], layout)
