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
