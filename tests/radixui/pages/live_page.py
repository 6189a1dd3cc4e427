"""What the Live page's AppTest tests read of a run (KPIs, rows, charts) and how they drive it (send, wait)."""
from __future__ import annotations

import json
import re
import time

from streamlit.testing.v1 import AppTest


def kpis(at: AppTest) -> dict[str, str]:
    """label -> value from the single KPI line (exactly one such element per run)."""
    lines = [m.value for m in at.markdown if "data-testid='kpi-line'" in m.value]
    assert len(lines) == 1, f"expected one KPI line, got {len(lines)}"
    return dict(re.findall(r"<span class='kpi-l'>(.*?)</span> <b class='kpi-v'>(.*?)</b>", lines[0]))


def kpi_step(at: AppTest) -> int:
    line = next(m.value for m in at.markdown if "data-testid='kpi-line'" in m.value)
    return int(re.search(r">step (\d+)<", line).group(1))


def request_rows(at: AppTest):
    found = [df.value for df in at.dataframe if "cached / prompt" in getattr(df.value, "columns", [])]
    return found[0] if found else None


def charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def tree_spec(at: AppTest) -> dict:
    return next(c for c in charts(at) if any(t.get("name") == "edge text" for t in c["data"]))


def slot_row(at: AppTest) -> dict:
    return next(c for c in charts(at) if any(t.get("name") == "owner labels" for t in c["data"]))


def row_count(at: AppTest) -> int:
    rows = request_rows(at)
    return 0 if rows is None else len(rows)


def number(at: AppTest, label: str):
    return next(n for n in at.number_input if n.label == label)


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def wait_rows(at: AppTest, n: int, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        at.run()
        rows = request_rows(at)
        if rows is not None and len(rows) == n and set(rows["state"]) == {"finished"}:
            return rows
        time.sleep(0.3)
    raise AssertionError(f"requests did not finish: {request_rows(at)}")


QUIET_S = 1.5   # how long the charts must stand unchanged


def wait_quiet(at: AppTest, timeout: float = 120) -> None:
    """Runs until the charts stood unchanged for QUIET_S over several runs: the engine loaded and nothing moving
    (two runs 0.3 s apart can both fall in a pause of a busy box)."""
    deadline = time.time() + timeout
    at.run()
    last, since = charts(at), time.time()
    while time.time() < deadline:
        time.sleep(0.3)
        at.run()
        now = charts(at)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= QUIET_S:
            return
    raise AssertionError("the page kept changing")


def send(at: AppTest, text: str, max_new: int = 3, mode: str = "Raw completion") -> None:
    next(r for r in at.radio if r.label == "Mode").set_value(mode)
    at.text_area[0].input(text)
    number(at, "Max new tokens").set_value(max_new)
    button(at, "Send").click()
    at.run()
