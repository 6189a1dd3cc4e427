"""KPI tiles from EngineSnapshot.metrics: (label, value, help) triples, tolerant of missing keys.

Known keys: hit_rate, hit_rate_recent (fractions 0..1, or percentages), prefill_tokens_computed,
prefill_tokens_skipped, evicted_tokens, decode_tokens_per_s, waiting, running, free_slots,
evictable_slots, locked_slots. A missing or non-numeric value shows as "–".
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

MISSING = "–"


def _num(metrics: Mapping[str, Any], key: str) -> Optional[float]:
    v = metrics.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f


def _pct(v: Optional[float]) -> str:
    if v is None:
        return MISSING
    return f"{(v * 100 if v <= 1.0 else v):.1f}%"


def _count(v: Optional[float], unit: str = "") -> str:
    if v is None:
        return MISSING
    return f"{int(round(v)):,}{unit}"


def kpis(metrics: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The KPI tiles in display order: hit rates, prefill, evictions | pool slots, speed, queue.
    Values stay short so a tile never truncates at 1280 px (five tiles a row)."""
    m = metrics or {}
    computed, skipped = _num(m, "prefill_tokens_computed"), _num(m, "prefill_tokens_skipped")
    total = (computed or 0) + (skipped or 0)
    share = f" ({skipped / total * 100:.0f}% of prompt tokens)" if skipped is not None and total > 0 else ""
    tps = _num(m, "decode_tokens_per_s")
    running, waiting = _num(m, "running"), _num(m, "waiting")
    requests = (MISSING if running is None and waiting is None else f"{_count(running)} / {_count(waiting)}")
    return [
        ("Hit rate", _pct(_num(m, "hit_rate")),
         "Share of prompt tokens whose KV was found in the radix tree, since the engine started."),
        ("Hit rate (last 20)", _pct(_num(m, "hit_rate_recent")),
         "The same share over the last 20 requests: how well the cache serves the current workload."),
        ("Prefill skipped", _count(skipped, " tok"),
         f"Prompt tokens not recomputed because match_prefix found them{share}."),
        ("Prefill computed", _count(computed, " tok"),
         "Prompt tokens that went through the forward pass (no cached prefix covered them)."),
        ("Evicted", _count(_num(m, "evicted_tokens"), " tok"),
         "Tokens whose slots eviction gave back to free_pages (least recently used leaves first)."),
        ("Free slots", _count(_num(m, "free_slots")), "Slots in free_pages, ready for alloc()."),
        ("Evictable slots", _count(_num(m, "evictable_slots")),
         "Slots cached in unlocked tree nodes: reusable by a hit, or freed by eviction when memory runs short."),
        ("Locked slots", _count(_num(m, "locked_slots")),
         "Slots on tree paths locked by running requests (never evicted), plus slots running requests hold."),
        ("Decode speed", MISSING if tps is None else f"{tps:,.1f} tok/s",
         "Output tokens generated per second, over the recent decode steps."),
        ("Running / waiting", requests, "Requests decoding now / requests queued for a prefill."),
    ]


def kpi_line(metrics: Mapping[str, Any], step: Optional[int] = None) -> str:
    """Every KPI in one line of HTML (one element, so all numbers change together, from one
    snapshot: a tile can never show a newer engine step than its neighbour)."""
    from radixui.figures.fmt import html_escape
    cells = [f"<span class='kpi' title='{html_escape(help_)}'><span class='kpi-l'>{html_escape(label)}</span> "
             f"<b class='kpi-v'>{html_escape(value)}</b></span>" for label, value, help_ in kpis(metrics)]
    if step is not None:
        cells.append(f"<span class='kpi kpi-step' title='The engine step these numbers are from'>step {int(step)}</span>")
    return "<div class='kpi-line' data-testid='kpi-line'>" + "".join(cells) + "</div>"


def sglang_status(metrics: Mapping[str, Any]) -> str:
    """SGLang's scheduler log line, from the same numbers: `#running-req: 1, #queue-req: 0,
    #token: 38, token usage: 0.04, cache hit rate: 45.2%, gen throughput (token/s): 12.3`."""
    m = metrics or {}
    used = None
    num, free = _num(m, "num_slots"), _num(m, "free_slots")
    if num is not None and free is not None:
        used = num - free
    usage = _num(m, "token_usage")
    tps = _num(m, "decode_tokens_per_s")
    return (f"#running-req: {_count(_num(m, 'running'))}, #queue-req: {_count(_num(m, 'waiting'))}, "
            f"#token: {_count(used)}, token usage: {MISSING if usage is None else f'{usage:.2f}'}, "
            f"cache hit rate: {_pct(_num(m, 'hit_rate'))}, "
            f"gen throughput (token/s): {MISSING if tps is None else f'{tps:.2f}'}")
