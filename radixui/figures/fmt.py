"""Small text helpers shared by the figure builders: slot runs, token text, shortening, times.

Pure functions, no plotly or streamlit, so every label the dashboard shows can be tested as a string.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

TokenText = Callable[[Sequence[int]], str]

ELLIPSIS = "…"
EN_DASH = "–"


def slot_runs(slots: Sequence[int], max_runs: Optional[int] = None) -> str:
    """Compress slot indices into runs: (1, 2, 3, 4, 5) -> "1–5", (1, 4, 5, 6) -> "1, 4–6".

    With `max_runs`, only the first runs are written and the rest is summarised ("…+3 runs").
    """
    runs: list[tuple[int, int]] = []
    for s in slots:
        s = int(s)
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    parts = [f"{a}" if a == b else f"{a}{EN_DASH}{b}" for a, b in runs]
    if max_runs is not None and len(parts) > max_runs:
        rest = len(parts) - max_runs
        parts = parts[:max_runs] + [f"{ELLIPSIS}+{rest} run{'s' if rest != 1 else ''}"]
    return ", ".join(parts)


def slot_list(slots: Sequence[int], max_items: int = 12) -> str:
    """The article's bracket form, "[6,7,8,9]"; long lists fall back to runs."""
    if len(slots) <= max_items:
        return "[" + ",".join(str(int(s)) for s in slots) + "]"
    return "[" + slot_runs(slots, max_runs=4) + "]"


def shorten(text: str, max_chars: int) -> str:
    """At most `max_chars` characters around one "…": the head, and from 16 characters on also the
    tail ("Why my code throws errors" -> "Why my code…" at 12, "Why my code t…errors" at 20)."""
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return ELLIPSIS
    tail = (max_chars - 1) // 3 if max_chars >= 16 else 0
    head = max_chars - 1 - tail
    return text[:head].rstrip() + ELLIPSIS + (text[len(text) - tail:].lstrip() if tail else "")


def fit_runs(slots: Sequence[int], max_chars: int) -> str:
    """Slot runs cut at a whole run to fit `max_chars`: "243–249, 250–265, …". Never cuts a number;
    the first run is always kept even if it is longer."""
    parts = slot_runs(slots).split(", ")
    out = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        more = i < len(parts) - 1
        cand = f"{out}, {part}"
        if len(cand) + (3 if more else 0) > max_chars:
            return out + ", " + ELLIPSIS
        out = cand
    return out


def clean(text: str) -> str:
    """One-line, trimmed text for labels: newlines as "⏎", tabs as spaces."""
    return text.replace("\r", "").replace("\n", "⏎").replace("\t", " ").strip()


def ids_text(token_ids: Sequence[int]) -> str:
    """Fallback token text when no tokenizer is at hand: the ids themselves."""
    return " ".join(str(int(t)) for t in token_ids)


def resolve_token_text(token_text: Optional[TokenText]) -> TokenText:
    return token_text if token_text is not None else ids_text


def fmt_time(t: Any) -> str:
    """Logical times print as integers ("time 3"), wall-clock times with 3 decimals."""
    if t is None:
        return "–"
    f = float(t)
    return str(int(f)) if f.is_integer() else f"{f:.3f}"


def html_escape(text: str) -> str:
    """Plotly renders a subset of HTML in text: escape what would be read as a tag or entity."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
