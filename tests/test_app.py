"""AppTest wiring: the pages render, a prompt reaches the engine and shows up in the request
table and KPIs, bad input is a message, and the walkthrough steps back and forth."""
from __future__ import annotations

import pathlib
import time

import pytest
from streamlit.testing.v1 import AppTest

APP = str(pathlib.Path(__file__).resolve().parents[1] / "app.py")


def _kpi(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def _request_rows(at: AppTest):
    return next(df.value for df in at.dataframe if "cached tokens" in getattr(df.value, "columns", []))


@pytest.fixture(scope="module")
def app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    return at


def test_live_page_renders_without_errors(app):
    assert [t.value for t in app.title] == ["RadixAttention, live"]
    assert not app.error
    assert _kpi(app, "Prefill computed") == "0 tok"
    assert len(_request_rows(app)) == 0


def test_submitting_a_prompt_updates_request_table_and_kpis(app):
    mode = next(r for r in app.radio if r.label == "Mode")
    mode.set_value("Raw completion")
    app.text_area[0].input("Why my code throws errors")
    next(n for n in app.number_input if n.label == "Max new tokens").set_value(3)
    next(b for b in app.button if b.label == "Send").click()
    app.run()
    assert not app.exception and not app.error
    deadline = time.time() + 120
    while time.time() < deadline:
        app.run()
        rows = _request_rows(app)
        if len(rows) == 1 and rows.iloc[0]["state"] == "finished":
            break
        time.sleep(0.5)
    row = _request_rows(app).iloc[0]
    assert row["state"] == "finished" and row["prompt tokens"] == 5 and row["new tokens"] == 3
    assert _kpi(app, "Prefill computed") == "5 tok"
    # the same prompt again: 4 of 5 tokens come from the cache (the last one is always recomputed)
    app.text_area[0].input("Why my code throws errors")
    next(b for b in app.button if b.label == "Send").click()
    app.run()
    deadline = time.time() + 120
    while time.time() < deadline:
        app.run()
        rows = _request_rows(app)
        if len(rows) == 2 and set(rows["state"]) == {"finished"}:
            break
        time.sleep(0.5)
    assert list(_request_rows(app)["cached tokens"]) == [4, 0]
    assert _kpi(app, "Prefill skipped").startswith("4 tok")


def test_empty_prompt_is_a_message_not_a_crash(app):
    app.text_area[0].input("   ")
    next(b for b in app.button if b.label == "Send").click()
    app.run()
    assert not app.exception
    assert any("Empty prompt" in e.value for e in app.error)
    app.run()  # the message is shown once; the page keeps working
    assert not app.error and not app.exception


def test_bad_model_path_keeps_the_previous_engine(app):
    next(t for t in app.text_input if t.label == "Model").input("/no/such/model")
    next(b for b in app.button if b.label == "Apply").click()
    app.run()
    assert any("Engine not changed" in e.value and "/no/such/model" in e.value for e in app.error)
    assert "Model `default`" in app.caption[0].value
    assert _kpi(app, "Prefill computed") != "–"


def test_walkthrough_steps_forward_and_back():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("radixui/pages/walkthrough.py")
    at.run()
    assert not at.exception
    assert at.subheader[0].value.startswith("Start: an empty tree")
    nxt = lambda: next(b for b in at.button if b.label == "Next ▶").click().run()  # noqa: E731
    for t in range(4):
        nxt()
        assert at.subheader[0].value.startswith(f"Time {t}:")
    text = "\n".join(m.value for m in at.markdown)
    assert "alloc(3) takes slots [6,7,8]" in text and "[6,7,8,9]" in text
    assert "4 slots came back though only 3 were needed" in text
    next(b for b in at.button if b.label == "◀ Back").click().run()
    assert at.subheader[0].value.startswith("Time 2:")
    assert "alloc(2) takes slots [10,11]" in "\n".join(m.value for m in at.markdown)
