"""Kept sweeps: a finished result stays on the Capacity lab page, next to the next run's.

A sweep of a large trace takes tens of seconds; comparing two settings (another page size, other
policies) used to mean remembering the first chart. "Keep this result" stores it in the session
(at most MAX_KEPT, oldest dropped) and draws it, with its settings and its downloads, under the
current chart until it is removed.
"""
from __future__ import annotations

import json
from typing import Optional

import streamlit as st

from core.lab.sweep import SweepResult
from core.lab.units import ModelKV
from radixui.figures.lab_chart import sweep_figure
from radixui.panels.lab_inputs import fmt_tokens

MAX_KEPT = 4


def kept_label(res: SweepResult, kv: Optional[ModelKV]) -> str:
    """What a kept result was: workload, page size, capacities, policies, and how long it ran."""
    caps = ", ".join(fmt_tokens(c) for c in res.capacities)
    gib = f" ({kv.name}, {', '.join(f'{kv.gib(c):.3g}' for c in res.capacities)} GiB)" if kv is not None else ""
    return (f"{res.workload.get('name', 'workload')}, page size {res.page_size}, {', '.join(res.policies)} "
            f"at {caps} tokens{gib}{', overlap in time' if res.overlap else ''} ({res.seconds:.1f} s)")


def keep(kept: list, res: SweepResult, kv: Optional[ModelKV]) -> bool:
    """Add `res` (once: the same object is not kept twice); drops the oldest beyond MAX_KEPT."""
    if any(r is res for r, _ in kept):
        return False
    kept.append((res, kv))
    del kept[:-MAX_KEPT]
    return True


def kept_section(res: SweepResult, kv: Optional[ModelKV]) -> None:
    """The Keep button under the current chart, then every kept result, two to a row."""
    kept: list = st.session_state.setdefault("cap_kept", [])
    is_kept = any(r is res for r, _ in kept)
    if st.button("Kept ✓" if is_kept else "Keep this result", key="cap_keep", disabled=is_kept,
                 help=f"keep this chart on the page to compare it with the next run (up to {MAX_KEPT})"):
        keep(kept, res, kv)
        st.rerun()
    others = [(i, r, k) for i, (r, k) in enumerate(kept) if r is not res]
    if not others:
        return
    st.markdown(f"**Kept results** ({len(others)}), for comparison with the run above")
    for start in range(0, len(others), 2):
        for col, (i, r, k) in zip(st.columns(2), others[start:start + 2]):
            with col:
                st.caption(kept_label(r, k))
                fig = sweep_figure(r, k)
                # half width: the caption above names the run, so no title over the legend's two rows
                fig.update_layout(height=420, title=dict(text=""), margin=dict(t=70))
                st.plotly_chart(fig, width="stretch", key=f"cap_kept_chart_{id(r)}")
                b1, b2 = st.columns(2)
                b1.download_button("Download JSON", json.dumps(r.to_json(), indent=2, default=lambda o: o.item()),
                                   f"capacity_lab_kept_{i + 1}.json", "application/json", key=f"cap_kept_json_{id(r)}")
                if b2.button("Remove", key=f"cap_unkeep_{id(r)}"):
                    kept[:] = [(x, y) for x, y in kept if x is not r]
                    st.rerun()
