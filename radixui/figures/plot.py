"""Plotly figures from plain dicts, without plotly's per-property validation.

plotly validates and deep-copies every property of every trace (~5 ms a trace, and a deepcopy per
list element); the dashboard redraws each refresh and must build a 2,000-node tree or a
100,000-slot heatmap in under 100 ms. So builders write trace and layout dicts, long lists become
numpy arrays here (copied as one block), and the figure is wrapped unvalidated. Tests re-validate
every figure with `validate(fig)`.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

_MIN_LEN = 8  # shorter lists stay lists


def _arrays(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out[k] = _arrays(v)
        elif isinstance(v, list) and len(v) >= _MIN_LEN and not isinstance(v[0], (dict, list, tuple)):
            if any(x is None for x in v):
                out[k] = np.array([np.nan if x is None else x for x in v], dtype=float)
            else:
                a = np.asarray(v)
                out[k] = a if a.dtype != object else v
        else:
            out[k] = v
    return out


def figure(data: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A go.Figure from trace dicts (each with "type") and a layout dict, skipping validation."""
    return go.Figure(data=[_arrays(t) for t in data], layout=layout, _validate=False)


def validate(fig: go.Figure) -> go.Figure:
    """Rebuild `fig` with full validation; raises ValueError on any invalid property."""
    return go.Figure(fig.to_dict())
