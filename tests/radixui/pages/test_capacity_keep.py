"""The Capacity lab keeps a finished sweep on the page: "Keep this result" and the next run draws both,
the kept one with its settings, a download and a Remove button; the sweep's chart is the restyled one."""
from __future__ import annotations

import json
import pathlib

from streamlit.testing.v1 import AppTest

APP = str(pathlib.Path(__file__).resolve().parents[3] / "app.py")
PAGE = "radixui/pages/capacity.py"
PRESET = "generated-shared-prefix"


def _run(at: AppTest, caps: str, policies: list[str]) -> None:
    at.text_input(key=f"cap_caps_{PRESET}").input(caps)
    at.multiselect(key="cap_policies").set_value(policies)
    at.button(key="cap_run").click()
    at.run()
    assert not at.exception, at.exception


def test_a_kept_result_stays_next_to_the_next_run_until_removed():
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page(PAGE)
    at.run()
    for k, v in {"num_groups": 4, "prompts_per_group": 5}.items():
        at.number_input(key=f"cap_p_{PRESET}_{k}").set_value(v)
    _run(at, "256, 512", ["lru", "fifo"])
    assert at.button(key="cap_keep").label == "Keep this result"
    at.button(key="cap_keep").click()
    at.run()
    assert at.button(key="cap_keep").label == "Kept ✓" and at.button(key="cap_keep").disabled
    assert len(at.get("plotly_chart")) == 1             # the kept result is the one on screen: drawn once
    _run(at, "256, 512, 1k", ["lru", "lfu"])
    assert at.button(key="cap_keep").label == "Keep this result"
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    names = [[t.get("name") for t in s["data"]] for s in specs]
    assert names[0][:2] == ["lru", "lfu"]               # the new run
    assert names[1][0].startswith("lru") and names[1][1].startswith("fifo")   # the kept one, next to it
    assert any(m.value.startswith("**Kept results** (1)") for m in at.markdown)
    assert any(c.value.startswith("generated-shared-prefix") and "lru, fifo at" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    remove = next(b for b in at.button if b.label == "Remove")
    remove.click()
    at.run()
    assert len(at.get("plotly_chart")) == 1 and not any(m.value.startswith("**Kept results**") for m in at.markdown)


def test_the_planner_waits_for_a_sweep_of_the_settings_on_screen():
    """Changed settings: the stale sweep's results stay, but the planner (size, host tier, routing, model run)
    is not offered: it ran the new workload with the old sweep's page size and capacities."""
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page(PAGE)
    at.run()
    for k, v in {"num_groups": 4, "prompts_per_group": 5}.items():
        at.number_input(key=f"cap_p_{PRESET}_{k}").set_value(v)
    _run(at, "256, 512", ["lru"])
    planner = ("cap_size_run", "cap_host_run")
    assert all(at.button(key=k) for k in planner)
    at.number_input(key=f"cap_p_{PRESET}_num_groups").set_value(6)
    at.run()
    assert not at.exception, at.exception
    assert any("The planner (smallest pool, host tier, routing, the model run) waits" in w.value for w in at.warning)
    assert any(m.value.startswith("**Every point**") for m in at.markdown)    # the stale results stay
    assert not {b.key for b in at.button} & set(planner)                          # the planner waits
    _run(at, "256, 512", ["lru"])
    assert all(at.button(key=k) for k in planner) and not at.warning
