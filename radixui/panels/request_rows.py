"""The Live page's request table: its rows (newest first, this tab's submissions the engine does not list yet
among them), its column widths, and which request the user ticked (the tree shows that request's path)."""
from __future__ import annotations

import zlib
from typing import Optional

import pandas as pd
import streamlit as st

from core.observe.snapshot import EngineSnapshot

TABLE_COLUMNS = ["request", "state", "cached / prompt", "new", "TTFT from submit (s)", "output", "path"]


def _table_config() -> dict:
    """Pixel widths that fit the left column (~420 px at 1400 wide) with every column in view, the
    output included: no horizontal scrolling. Long request ids are cut; hovering shows them whole."""
    col = st.column_config
    return {"request": col.TextColumn("request", width=66),
            "state": col.TextColumn("state", width=58),
            "cached / prompt": col.TextColumn("cached", width=50, help="cached / prompt tokens"),
            "new": col.NumberColumn("new", width=34, help="output tokens so far"),
            "TTFT from submit (s)": col.NumberColumn(
                "TTFT (s)", width=52, format="%.2f",   # the full name pushed its figures off the grid
                help="Seconds from submit to the first token: includes the time the request waited in the "
                     "queue (in step mode, until you pressed Step)"),
            "output": col.TextColumn("output", width=90),
            "path": col.TextColumn("", width=20, help="◀: the request whose path the tree shows")}


TABLE_CONFIG = _table_config()


def request_table(snap: EngineSnapshot, pending: dict, selected: Optional[str]) -> pd.DataFrame:
    """Newest first. Requests this tab submitted that the snapshot does not list yet (the engine
    is mid-step) show as "submitted", and leave `pending` once it lists them (so a request the
    engine later drops from its table, or a rebuilt engine never knew, does not come back as
    "submitted"); `path` marks the request whose path the tree shows."""
    listed = {r.rid for r in snap.requests}
    for rid in listed & set(pending):      # the engine lists it now: its own row says how it goes
        del pending[rid]
    rows = [{"request": rid, "state": "submitted", "cached / prompt": "", "new": None, "TTFT from submit (s)": None,
             "output": f"({text[:40]})", "path": ""} for rid, (text, _) in reversed(list(pending.items()))
            if rid not in listed]
    for r in reversed(snap.requests):
        rows.append({"request": r.rid, "state": r.state,
                     "cached / prompt": "" if r.state == "waiting" else f"{r.cached_tokens} / {r.prompt_tokens}",
                     "new": r.output_tokens, "TTFT from submit (s)": None if r.ttft is None else round(r.ttft, 3),
                     "output": r.output_text if not r.error else f"error: {r.error}",
                     "path": "◀" if r.rid == selected else ""})
    df = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    df["new"] = df["new"].astype("Int64")
    return df


def table_key(rids: list) -> str:
    """The request table's widget key, one for each order of its rows. The table keeps its ticked row by index
    and lists the newest first, so a new request moved the tick to the row above the clicked request while
    the tree still showed it; a new order is a new widget, with no tick, and the ◀ mark still names it."""
    return "req_table_" + format(zlib.crc32("\x00".join(rids).encode()), "08x")


def selected_rid(ss) -> Optional[str]:
    """The rid the user clicked, from the table drawn last run (row indexes refer to it)."""
    key = ss.get("_table_key", "req_table")
    try:
        rows = list(ss[key]["selection"]["rows"])
    except (KeyError, TypeError):
        rows = []
    shown = ss.get("_table_rids", [])
    if key != ss.get("_last_table_key"):   # a table drawn anew (rows moved): its empty tick is no click
        ss["_last_table_key"] = key
        if not rows:
            ss["_last_rows"] = rows
            return ss.get("_selected_rid")
    if rows != ss.get("_last_rows"):
        ss["_last_rows"] = rows
        ss["_selected_rid"] = shown[rows[0]] if rows and rows[0] < len(shown) else None
    return ss.get("_selected_rid")
