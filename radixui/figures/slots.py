"""The slot pool: (a) the article's slot row (slot -> token text, owning node, state) and (b) a
layers x slots heatmap of the K norms stored in k_buffer, with the slot states in a strip above.

States (core.observe.snapshot.SLOT_STATES): padding (slot 0), never written, free but stale (the old KV
stays until a later alloc overwrites it: struck through, as in the article), cached and evictable,
locked by a running request, in use (held by a running request outside the tree).

The heatmap downsamples wide ranges to at most `max_cols` columns of equal width: each column is
the max over its slots (per layer) and its state is the most occupied state inside it, so a single
occupied slot among 100,000 still shows. `lo`, `hi` pick a slot range, drawn at full resolution
when it fits in `max_cols`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from core.observe.snapshot import (
    EVICTABLE,
    FREE_STALE,
    IN_USE,
    LOCKED,
    NEVER_WRITTEN,
    PADDING,
    SLOT_STATES,
    CacheSnapshot,
    PoolView,
)
from radixui.figures.fmt import TokenText, clean, fit_runs, html_escape, resolve_token_text, shorten, slot_list
from radixui.figures.plot import figure

STATE_COLOURS = {             # far apart on purpose (the tests hold every pair >= 80 apart in RGB)
    "padding": "#374151",
    "never_written": "#ffffff",
    "free_stale": "#fde68a",  # pale yellow: free, but the old KV is still there (struck through)
    "evictable": "#f87171",   # cached and evictable: the red of the tree's evictable outline, lighter
    "locked": "#7c8797",      # the tree's grey for locked, darker
    "in_use": "#60a5fa",      # blue: a running request writes here
}
STATE_LABELS = {
    "padding": "padding (never handed out)",
    "never_written": "never written",
    "free_stale": "free, stale KV",
    "evictable": "cached, evictable",
    "locked": "locked (running request)",
    "in_use": "in use (running request)",
}
# "How occupied" each state is, for downsampling: a bin shows its most occupied slot.
OCCUPANCY_ORDER = ("never_written", "padding", "free_stale", "evictable", "locked", "in_use")
_RANK = np.array([OCCUPANCY_ORDER.index(s) for s in SLOT_STATES], dtype=np.int8)       # code -> rank
_UNRANK = np.array([SLOT_STATES.index(s) for s in OCCUPANCY_ORDER], dtype=np.int8)     # rank -> code
OCCUPIED = (EVICTABLE, LOCKED, IN_USE)
MAX_COLS = 2000
ROW_CELLS = 160   # the slot row draws up to this many cells (text only where a cell is wide enough)


def written_range(pool: PoolView, margin: int = 4, min_slots: int = 16) -> tuple[int, int]:
    """[0, hi): the slots ever written plus a few free ones after them, so the default view zooms
    to where the KV is instead of a pool that is mostly never written."""
    size = len(pool.states)
    written = np.flatnonzero((pool.states != NEVER_WRITTEN) & (pool.states != PADDING))
    hi = int(written[-1]) + 1 + margin if len(written) else 0
    return 0, min(size, max(hi, min_slots))


def _state_colorscale() -> list:
    """A discrete colorscale over the codes 0..len(SLOT_STATES)-1 (zmin=-0.5, zmax=len-0.5)."""
    n = len(SLOT_STATES)
    scale = []
    for i, name in enumerate(SLOT_STATES):
        scale += [[i / n, STATE_COLOURS[name]], [(i + 1) / n, STATE_COLOURS[name]]]
    return scale


def _legend_entries() -> list:
    return [dict(type="scatter", x=[None], y=[None], mode="markers", name=STATE_LABELS[s], showlegend=True,
                 hoverinfo="skip", marker=dict(symbol="square", size=13, color=STATE_COLOURS[s],
                                               line=dict(color="#9ca3af", width=1)))
            for s in SLOT_STATES]


def _range(size: int, lo: Optional[int], hi: Optional[int]) -> tuple[int, int]:
    lo = 0 if lo is None else int(lo)
    hi = size if hi is None else int(hi)
    if not 0 <= lo < hi <= size:
        raise ValueError(f"slot range [{lo}, {hi}) is outside the pool of slots 0..{size - 1}; "
                         f"pick 0 <= lo < hi <= {size}")
    return lo, hi


def slot_owners(cache: CacheSnapshot, size: int) -> np.ndarray:
    """Owning node id per slot 0..size-1 (-1 where no tree node holds the slot)."""
    owners = np.full(size, -1, dtype=np.int64)
    for n in cache.nodes:
        if n.slots:
            owners[list(n.slots)] = n.id
    return owners


def _slot_texts(pool: PoolView, cache: CacheSnapshot, tt: TokenText, lo: int, hi: int) -> list[str]:
    """Each slot's token as text. With a decoder that knows token bytes (`tt.pieces`), a slot in a
    tree node is decoded in the context of its node's run, so a character split over two tokens
    shows whole on the slot that completes it ("·" on the one before) instead of "�" twice."""
    toks = pool.slot_tokens
    out = {s: clean(tt([int(toks[s])])) if toks[s] >= 0 else "" for s in range(lo, hi)}
    pieces = getattr(tt, "pieces", None)
    if pieces is not None:
        for n in cache.nodes:
            if n.slots and n.slots[-1] >= lo and n.slots[0] < hi:
                for s, text in zip(n.slots, pieces(n.token_ids)):
                    if lo <= s < hi and toks[s] >= 0:
                        out[s] = clean(text)
    return [out[s] for s in range(lo, hi)]


# ----- (a) the slot row ----------------------------------------------------------------------------
def slot_table(pool: PoolView, cache: CacheSnapshot, token_text: Optional[TokenText] = None,
               lo: Optional[int] = None, hi: Optional[int] = None) -> pd.DataFrame:
    """One row per slot in [lo, hi): slot, token_id (-1 never written), text, node (owning node, <NA>
    when free), state (a SLOT_STATES name), stale (free but still holding old KV)."""
    tt = resolve_token_text(token_text)
    lo, hi = _range(len(pool.states), lo, hi)
    owners = slot_owners(cache, len(pool.states))[lo:hi]
    toks = pool.slot_tokens[lo:hi]
    codes = pool.states[lo:hi]
    df = pd.DataFrame({
        "slot": np.arange(lo, hi),
        "token_id": toks.astype(np.int64),
        "text": _slot_texts(pool, cache, tt, lo, hi),
        "node": pd.array([int(o) if o >= 0 else None for o in owners], dtype="Int64"),
        "state": [SLOT_STATES[int(c)] for c in codes],
    })
    df["stale"] = codes == FREE_STALE
    return df


NOTE_CHAR_PX = 6.6   # average width of one character of the notes' 12 px font


def row_notes(free: Sequence[int], lo: int, hi: int, cut: bool, width: int) -> list[str]:
    """The line under the row, fitted to `width` pixels (it is one line between the row and the
    legend): the free list shrinks to whole runs, then the notes to their short forms, so nothing
    is cut at the figure's right edge."""
    budget = int((width - 20) / NOTE_CHAR_PX)
    showing = [f"showing slots {lo}–{hi - 1}; narrow the range to see others"] if cut else []
    for owner, free_label, show in (("#N under a run: tree node N holds those slots",
                                     "free_pages (front is handed out next)", showing),
                                    ("#N: tree node N", "free_pages", [f"slots {lo}–{hi - 1}"] if cut else [])):
        if not free:
            notes = [owner, "free_pages: [] (no free slot: the next alloc must evict)"] + show
        else:
            notes = [owner, f"{free_label}: {slot_list(free)}"] + show
            room = budget - len(" · ".join(notes)) + len(slot_list(free)) - 2
            if len(" · ".join(notes)) > budget:
                notes[1] = f"{free_label}: [{fit_runs(free, max(8, room))}]"
        if len(" · ".join(notes)) <= budget:
            return notes
    return notes


def slot_row_figure(pool: PoolView, cache: CacheSnapshot, token_text: Optional[TokenText] = None,
                    lo: Optional[int] = None, hi: Optional[int] = None, max_cells: int = ROW_CELLS,
                    width: int = 1200, title: Optional[str] = None) -> go.Figure:
    """The article's slot row: one cell per slot in [lo, hi) (at most `max_cells`, from lo), coloured
    by state, holding its token text (struck through when free but stale), the owning node under
    it as a bracket, slot numbers on top, and free_pages in allocator order underneath."""
    tt = resolve_token_text(token_text)
    lo, hi = _range(len(pool.states), lo, hi)
    cut = hi - lo > max_cells
    hi = min(hi, lo + max_cells)
    df = slot_table(pool, cache, tt, lo, hi)
    n = len(df)
    cell_px = max(2.0, (width - 40) / n)
    chars = int((cell_px - 6) / 7)   # 0: cells too narrow for text (hover still has it)
    codes = pool.states[lo:hi].astype(float)
    texts, hovers = [], []
    for r in df.itertuples(index=False):
        label = html_escape(shorten(r.text, chars)) if r.text and chars >= 1 else ""
        if r.stale and label:
            label = f"<s>{label}</s>"
        texts.append(label)
        owner = f"tree node #{int(r.node)}" if r.node is not pd.NA and not pd.isna(r.node) else "no tree node"
        hovers.append(f"slot {r.slot}<br>{STATE_LABELS[r.state]}<br>"
                      + (f"token {r.token_id}: '{html_escape(r.text)}'" if r.token_id >= 0 else "never written")
                      + f"<br>{owner}")
    x = df["slot"].to_numpy()
    traces = [dict(type="heatmap", x=x, y=[0], z=[codes], text=[texts], texttemplate="%{text}",
                   textfont=dict(size=13 if chars >= 4 else 10, color="#111827"), customdata=[hovers],
                   hovertemplate="%{customdata}<extra></extra>", colorscale=_state_colorscale(),
                   zmin=-0.5, zmax=len(SLOT_STATES) - 0.5, showscale=False, xgap=2, ygap=0, name="slots")]
    # owner brackets: one line and label per run of consecutive slots held by one node
    bx, by, lx, lt = [], [], [], []
    owners = df["node"].to_numpy(dtype=float, na_value=np.nan)
    i = 0
    while i < n:
        j = i
        while j + 1 < n and owners[j + 1] == owners[i] and not np.isnan(owners[i]):
            j += 1
        if not np.isnan(owners[i]):
            bx += [x[i] - 0.42, x[i] - 0.42, x[j] + 0.42, x[j] + 0.42, None]
            by += [-0.62, -0.7, -0.7, -0.62, None]
            lx.append((x[i] + x[j]) / 2)
            label = f"#{int(owners[i])}"   # the number in that node's circle in the tree
            lt.append(label if (j - i + 1) * cell_px >= 7 * len(label) else "")
        i = j + 1
    traces.append(dict(type="scatter", x=bx, y=by, mode="lines", line=dict(color="#374151", width=1.5),
                       hoverinfo="skip", showlegend=False, name="owners"))
    traces.append(dict(type="scatter", x=lx, y=[-0.85] * len(lx), mode="text", text=lt,
                       textposition="middle center", textfont=dict(size=12, color="#374151"),
                       hoverinfo="skip", showlegend=False, name="owner labels"))
    traces += _legend_entries()
    notes = row_notes(cache.free_slots(), lo, hi, cut, width)
    layout = dict(
        height=270, margin=dict(l=10, r=10, t=70 if title else 36, b=40),
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        xaxis=dict(side="top", tickmode="array", tickvals=x, ticktext=[str(s) for s in x], showgrid=False,
                   zeroline=False, range=[x[0] - 0.5, x[-1] + 0.5], fixedrange=True,
                   tickfont=dict(size=11 if n <= 40 else 9), title=None),
        yaxis=dict(visible=False, range=[-1.3, 0.52], fixedrange=True),
        legend=dict(orientation="h", x=0, y=0, yanchor="top", font=dict(size=11),
                    itemclick=False, itemdoubleclick=False),
        annotations=[dict(xref="paper", yref="y", x=0, y=-1.18, yanchor="middle", xanchor="left",
                          showarrow=False, align="left", font=dict(size=12, color="#374151"),
                          text=" · ".join(notes))],
        meta=dict(lo=lo, hi=hi),
    )
    if n > 64:   # every slot numbered only while the numbers fit
        keep = x[::int(np.ceil(n / 32))]
        layout["xaxis"].update(tickvals=keep, ticktext=[str(s) for s in keep])
    if title:
        layout["title"] = dict(text=title, x=0.01, font=dict(size=15))
    return figure(traces, layout)


# ----- (b) the layers x slots heatmap ---------------------------------------------------------------
@dataclass(frozen=True)
class Binned:
    """A slot range cut into equal bins: starts[i] is the first slot of bin i, `width` slots a bin
    (the last may be shorter); k_max [layers, bins] (None without KV), states [bins] codes."""
    lo: int
    hi: int
    width: int
    starts: np.ndarray
    k_max: Optional[np.ndarray]
    states: np.ndarray


def bin_slots(pool: PoolView, lo: Optional[int] = None, hi: Optional[int] = None,
              max_cols: int = MAX_COLS) -> Binned:
    """Downsample [lo, hi) to at most `max_cols` bins: per-layer max of the K norms and the most
    occupied state (OCCUPANCY_ORDER) of each bin; bins of one slot when the range fits."""
    lo, hi = _range(len(pool.states), lo, hi)
    width = max(1, -(-(hi - lo) // max(1, max_cols)))
    starts = np.arange(lo, hi, width)
    if width == 1:
        states = pool.states[lo:hi].astype(np.int8)
        k = None if pool.k_norms is None else pool.k_norms[:, lo:hi]
    else:
        offs = starts - lo
        states = _UNRANK[np.maximum.reduceat(_RANK[pool.states[lo:hi]], offs)]
        k = None if pool.k_norms is None else np.maximum.reduceat(pool.k_norms[:, lo:hi], offs, axis=1)
    return Binned(lo, hi, width, starts, k, states)


def kv_heatmap(pool: PoolView, lo: Optional[int] = None, hi: Optional[int] = None,
               max_cols: int = MAX_COLS, title: Optional[str] = None, height: int = 430) -> go.Figure:
    """Layers x slots heatmap of ‖K‖ as stored in k_buffer (layer 0 on top), with a strip of slot
    states above it; downsampled to at most `max_cols` columns (see bin_slots)."""
    b = bin_slots(pool, lo, hi, max_cols)
    x = b.starts
    span = (f"slots {b.lo}–{b.hi - 1}" + (f", max over bins of {b.width} slots" if b.width > 1 else ", one column a slot"))
    names = np.array([STATE_LABELS[s] for s in SLOT_STATES])[b.states]
    bin_note = f" (bin of {b.width})" if b.width > 1 else ""
    traces = [dict(type="heatmap", x=x, y=[0], z=b.states.reshape(1, -1).astype(float), xaxis="x", yaxis="y2",
                   colorscale=_state_colorscale(), zmin=-0.5, zmax=len(SLOT_STATES) - 0.5, showscale=False,
                   customdata=names.reshape(1, -1), name="states",
                   hovertemplate=f"slot %{{x}}{bin_note}<br>%{{customdata}}<extra></extra>")]
    if b.k_max is not None:
        # never-written slots hold no KV: blank (NaN), not the colour of a zero norm
        z = np.where((b.states == NEVER_WRITTEN) | (b.states == PADDING), np.nan, b.k_max)
        traces.append(dict(type="heatmap", x=x, y=np.arange(pool.num_layers), z=z, xaxis="x", yaxis="y",
                           colorscale="Viridis", zmin=0, name="k_norms",
                           colorbar=dict(title=dict(text="‖K‖", side="right"), thickness=12, len=0.8, y=0.4),
                           hovertemplate=f"slot %{{x}}{bin_note}<br>layer %{{y}}<br>‖K‖ %{{z:.3g}}<extra></extra>"))
    traces += _legend_entries()
    x0 = float(x[0]) - 0.5 * b.width
    x1 = float(b.hi) - 0.5 * b.width
    annotations = [dict(xref="paper", yref="paper", x=0, y=0, yanchor="top", xanchor="left", yshift=-28,
                        showarrow=False, font=dict(size=11, color="#4b5563"), text=span)]
    if b.k_max is None:
        annotations.append(dict(xref="paper", yref="paper", x=0.5, y=0.4, showarrow=False,
                                font=dict(size=13, color="#6b7280"),
                                text="no K norms in this snapshot (a simulator's pool, or a server read "
                                     "without the admin key): slot states only"))
    layout = dict(
        height=height, margin=dict(l=50, r=10, t=64 if title else 40, b=56),
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        xaxis=dict(range=[x0, x1], showgrid=False, zeroline=False, title=None, anchor="y",
                   dtick=1 if len(x) <= 40 and b.width == 1 else None),
        yaxis=dict(domain=[0, 0.86], autorange="reversed", title=dict(text="layer"), showgrid=False,
                   zeroline=False, visible=b.k_max is not None, dtick=1 if pool.num_layers <= 12 else None),
        yaxis2=dict(domain=[0.89, 1.0], showticklabels=False, showgrid=False, zeroline=False, fixedrange=True,
                    title=dict(text="state", font=dict(size=11))),
        legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", font=dict(size=11),
                    itemclick=False, itemdoubleclick=False),
        annotations=annotations,
        meta=dict(lo=b.lo, hi=b.hi, bin_width=b.width, columns=len(x)),
    )
    if title:
        layout["title"] = dict(text=title, x=0.01, font=dict(size=15))
        layout["legend"]["y"] = 1.02
    return figure(traces, layout)
