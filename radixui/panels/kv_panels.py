"""The KV events page's panels: gap status, KPI tiles, tiers and rates figures, event and eviction tables."""
from __future__ import annotations

import time
from typing import Any

import pandas as pd

from radixui.figures.fmt import shorten
from radixui.figures.plot import figure


def gap_panel(st, status: dict, gaps: list, live: bool = True) -> None:
    """Exact, or which batches are missing: never silent. `live`: say how long ago the last batch came."""
    last = status["last_seq"]
    if last is None:
        st.info("Connected; no batch received yet. (An idle engine publishes nothing until it caches something.)")
        return
    age = time.time() - status["last_recv"] if status["last_recv"] and live else None
    missing = status["missing_batches"]
    lost_gaps = sum(1 for g in gaps if g.lost)
    if status["exact"]:
        filled = [g for g in gaps if g.recovered and g.reason != "publisher restarted"]
        extra = f"; {len(filled)} gap(s) filled from the replay socket" if filled else ""
        if missing:
            extra += (f"; {missing:,} batch(es) lost before that ({lost_gaps} gap(s)), made good since by "
                      f"the engine clearing its cache")
        st.success(f"Exact: every batch up to seq {last:,} applied{extra}"
                   + (f" · last batch {age:.0f} s ago" if age is not None else ""))
    else:
        st.error(f"{missing:,} batch(es) lost ({lost_gaps} gap(s)): missing since seq {status['suspect_since']:,} "
                 f"and not recovered, the replay buffer no longer held them (or there is no replay endpoint). "
                 f"The tree may lack blocks (or hold removed ones) until the engine clears its cache.")
    if gaps:
        rows = [{"from seq": g.start, "to seq": g.end, "batches": g.size, "reason": g.reason,
                 "recovered": {True: "yes", False: "no", None: "pending"}[g.recovered], "replayed": g.replayed,
                 "lost": g.lost, "when": time.strftime("%H:%M:%S", time.localtime(g.detected_ts))}
                for g in reversed(gaps)]
        with st.expander(f"Gaps and catch-ups ({len(gaps)})", expanded=not status["exact"]):
            st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def kpi_tiles(st, stats: dict, media: dict, rate: tuple, status: dict) -> None:
    tiers = " · ".join(f"{k} {v:,}" for k, v in media.items()) or "–"
    tiles = [("Blocks cached", f"{stats['blocks']:,}", f"per tier: {tiers}"),
             ("Stored / s", f"{rate[0]:,.1f}", "blocks newly stored per second (last 10 s of batch time)"),
             ("Removed / s", f"{rate[1]:,.1f}", "blocks that left the cache per second (evictions, flushes)"),
             ("Max depth", f"{stats['max_depth']:,}", "longest cached prefix, in blocks"),
             ("Sharing", f"{stats['sharing']:.2f}×", "blocks the cached sequences would need without prefix sharing, "
                                                    "over the blocks held: 1.0 means no prefix is shared"),
             ("Branch points", f"{stats['branch_blocks']:,}", "blocks with two or more children"),
             ("Orphans", f"{stats['orphans']:,}", "blocks whose parent is not cached: no prefix lookup reaches them"),
             ("Batches", f"{status['batches']:,}", f"DP ranks seen: {status['dp_ranks'] or '–'}; duplicates "
                                                   f"ignored: {status['duplicates']}; lost for good: "
                                                   f"{status['missing_batches']:,}")]
    for row in (tiles[:4], tiles[4:]):
        for col, (label, value, help_) in zip(st.columns(4), row):
            col.metric(label, value, help=help_)


def tiers_figure(media: dict):
    names = list(media) or ["GPU"]
    return figure([dict(type="bar", x=names, y=[media.get(n, 0) for n in names], marker=dict(color="#3b82f6"))],
                  dict(height=300, margin=dict(l=40, r=10, t=40, b=30), title=dict(text="Blocks per tier", x=0.01)))


def rates_figure(rates: list):
    """Blocks stored and removed per second, in one-second buckets of batch time."""
    if not rates:
        return figure([], dict(height=300, title=dict(text="Blocks per second (no batches yet)", x=0.01)))
    t0 = rates[0][0]
    buckets: dict = {}
    for ts, s, r in rates:
        b = buckets.setdefault(int(ts - t0), [0, 0])
        b[0] += s
        b[1] += r
    xs = sorted(buckets)
    traces = [dict(type="scatter", mode="lines+markers", x=xs, y=[buckets[x][0] for x in xs], name="stored"),
              dict(type="scatter", mode="lines+markers", x=xs, y=[buckets[x][1] for x in xs], name="removed")]
    return figure(traces, dict(height=300, margin=dict(l=40, r=10, t=40, b=30), xaxis=dict(title="seconds"),
                               title=dict(text="Blocks per second", x=0.01)))


def event_log_table(log: list, limit: int = 300) -> pd.DataFrame:
    rows = []
    for seq, ts, kind, d in reversed(log[-limit:]):
        if kind == "BlockStored":
            text = (f"{d['blocks']} block(s) in {d['medium']}, {d['new']} new, {d['tokens']} tokens, "
                    f"parent {shorten(str(d['parent']), 24)}")
        elif kind == "BlockRemoved":
            text = f"{d['blocks']} block(s) out of {d['medium']}, {d['gone']} left the cache" + \
                   (f", {d['unknown']} unknown" if d["unknown"] else "")
        else:
            text = "the engine emptied its cache"
        rows.append({"seq": seq, "time": time.strftime("%H:%M:%S", time.localtime(ts)), "event": kind,
                     "description": text})
    return pd.DataFrame(rows, columns=["seq", "time", "event", "description"])


def evictions_table(removals: list, limit: int = 300) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for r in reversed(removals[-limit:]):
        rows.append({"seq": r.seq, "time": time.strftime("%H:%M:%S", time.localtime(r.ts)), "block": r.serial,
                     "tier": r.medium, "left the cache": r.left_tree,
                     "tokens": shorten(str(list(r.tokens)), 80)})
    return pd.DataFrame(rows, columns=["seq", "time", "block", "tier", "left the cache", "tokens"])
