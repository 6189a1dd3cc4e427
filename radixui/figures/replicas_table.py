"""The Replicas page's data: one snapshot per replica, their totals, and one request table.

Pure functions of snapshots (no streamlit), so the same code draws replicas reached over HTTP
and is tested without a browser."""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from core.observe.snapshot import EngineSnapshot

SUMMED = ("prompt_tokens", "cached_tokens", "prefill_tokens_computed", "decode_tokens", "evicted_tokens",
          "free_slots", "num_slots", "running", "waiting", "requests_finished", "requests_aborted",
          "decode_tokens_per_s")


def total_metrics(snaps: Sequence[Optional[EngineSnapshot]]) -> dict[str, float]:
    """Counters summed over the replicas that answered; rates recomputed from the sums (a mean of
    per-replica hit rates would weigh a replica with 2 requests like one with 2,000)."""
    live = [s.metrics for s in snaps if s is not None]
    out = {k: float(sum(m.get(k, 0) or 0 for m in live)) for k in SUMMED}
    out["hit_rate"] = out["cached_tokens"] / out["prompt_tokens"] if out["prompt_tokens"] else 0.0
    out["token_usage"] = (out["num_slots"] - out["free_slots"]) / out["num_slots"] if out["num_slots"] else 0.0
    return out


def request_rows(snaps: Sequence[Optional[EngineSnapshot]], names: Sequence[str]) -> pd.DataFrame:
    """Every replica's requests, newest first within each, with the replica that served them."""
    rows = []
    for name, snap in zip(names, snaps):
        if snap is None:
            continue
        for r in reversed(snap.requests):
            rows.append({"replica": name, "request": r.rid, "state": r.state, "prompt tokens": r.prompt_tokens,
                         "cached tokens": r.cached_tokens, "new tokens": r.output_tokens,
                         "output": r.output_text if not r.error else f"error: {r.error}"})
    return pd.DataFrame(rows, columns=["replica", "request", "state", "prompt tokens", "cached tokens",
                                       "new tokens", "output"])
