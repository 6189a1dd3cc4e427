"""AppTest wiring on the real model: the Live page renders, a prompt reaches the engine and shows in
the request table and the one-line KPIs, every issue-11 defect that lives in the page is held
down, and the walkthrough steps back and forth."""
from __future__ import annotations

import json
import pathlib
import re
import time

import pytest
from streamlit.testing.v1 import AppTest

from tests.radixui.pages.conftest import APP
from tests.radixui.pages.live_page import (
    button,
    charts,
    kpi_step,
    kpis,
    number,
    request_rows,
    row_count,
    send,
    slot_row,
    tree_spec,
    wait_quiet,
    wait_rows,
)



def test_live_page_renders_without_errors(app):
    assert [t.value for t in app.title] == ["RadixAttention, live"]
    assert not app.error
    assert kpis(app)["Prefill computed"] == "0 tok"
    # no empty request table (it used to sit under the view buttons): a sentence instead
    assert request_rows(app) is None
    assert any("No requests yet" in c.value for c in app.caption)


def test_a_new_tab_draws_its_hidden_views_after_its_first_screen():
    """The first run draws only the open view and asks the poll for the rest FIRST_SCREEN_S later;
    the next full run draws them all and drops the request."""
    from radixui.panels.live_views import FIRST_SCREEN_S
    at = AppTest.from_file(APP, default_timeout=180)
    t0 = time.monotonic()
    at.run()
    assert not at.exception
    waiting = [c.value for c in at.caption if c.value == "Drawing this view..."]
    assert len(waiting) == 4                                   # every view but the open tree
    due = at.session_state["_catch_up_at"]
    assert t0 + FIRST_SCREEN_S <= due <= time.monotonic() + FIRST_SCREEN_S
    at.run()
    assert not [c for c in at.caption if c.value == "Drawing this view..."]
    assert "_catch_up_at" not in at.session_state


def test_favicon_is_a_local_file():
    src = pathlib.Path(APP).read_text()
    icon = re.search(r'ICON = str\(pathlib.Path\(__file__\).parent / "radixui" / "static" / "(.*?)"\)', src)
    assert icon and (pathlib.Path(APP).parent / "radixui" / "static" / icon.group(1)).stat().st_size > 100
    assert "page_icon=ICON" in src


def test_submitting_a_prompt_updates_request_table_and_kpis(app):
    send(app, "Why my code throws errors")
    assert not app.exception and not app.error
    row = wait_rows(app, 1).iloc[0]
    assert row["cached / prompt"] == "0 / 5" and row["new"] == 3
    assert kpis(app)["Prefill computed"] == "5 tok"
    send(app, "Why my code throws errors")
    rows = wait_rows(app, 2)
    assert list(rows["cached / prompt"]) == ["4 / 5", "0 / 5"]  # newest first; the last token is recomputed
    k = kpis(app)
    assert k["Prefill skipped"] == "4 tok" and k["Running / waiting"] == "0 / 0" and k["Locked slots"] == "0"
    assert "TTFT from submit (s)" in rows.columns
    grid = next(df for df in app.dataframe if "cached / prompt" in getattr(df.value, "columns", []))
    ttft = json.loads(grid.proto.columns)["TTFT from submit (s)"]   # shown short, so its figures fit the grid
    assert ttft["label"] == "TTFT (s)" and "from submit" in ttft["help"] and "queue" in ttft["help"]
    assert rows.iloc[0]["TTFT from submit (s)"] > 0
    assert kpi_step(app) >= 2
    status = next(m.value for m in app.markdown if "#running-req" in m.value)
    assert "#running-req: 0, #queue-req: 0" in status and "cache hit rate: 40.0%" in status


def test_unicode_prompt_round_trips_in_tree_and_slot_labels(app):
    text = "Ünïcödé 🚀"
    send(app, text, max_new=1)
    wait_rows(app, 3)
    edge_text = next(t for t in tree_spec(app)["data"] if t["name"] == "edge text")["text"]
    assert any(text in t for t in edge_text), edge_text
    assert not any("\ufffd" in t for t in edge_text)
    assert [t.label for t in app.tabs] == ["Radix tree", "Slot pool", "Eviction heap", "Event log", "Time travel"]
    cells = slot_row(app)["data"][0]["text"][0]   # the Slot pool tab, hidden, caught up: nothing is running
    assert not any("\ufffd" in c for c in cells)
    assert "Ü" in cells and "🚀" in cells and "·" in cells   # "·": the first bytes of a split character


def test_focus_box_keeps_naming_the_whole_tree(app):
    box = next(s for s in app.selectbox if s.label == "Focus on subtree")
    assert box.value == 0 and box.options[0] == "whole tree" and len(box.options) > 3
    app.run()
    box = next(s for s in app.selectbox if s.label == "Focus on subtree")
    assert box.value == 0 and box.index == 0


def test_preset_runs_with_the_values_in_the_form(app):
    number(app, "Max new tokens").set_value(2)
    next(s for s in app.selectbox if s.label == "Preset").set_value("The article's four prompts")
    button(app, "Run preset").click()
    app.run()
    assert any("Sent 4 requests" in t.value for t in app.toast)
    rows = wait_rows(app, 7)
    assert list(rows["new"][:4]) == [2, 2, 2, 2]


@pytest.mark.parametrize("value, message", [
    (-5, "Max new tokens must be a whole number of at least 1; got -5"),
    (100000, "max_new_tokens=100000"),
])
def test_bad_max_new_tokens_is_a_message_not_a_silent_send(app, value, message):
    send(app, "Why my code is slow", max_new=value)
    assert not app.exception
    assert [e.value for e in app.error if message in e.value], [e.value for e in app.error]
    # under the prompt form, in the left column: a message never pushes the tree down the screen
    assert [e.value for e in app.columns[0].error if message in e.value]
    assert not app.success and not app.toast   # no "Sent ..." message left beside the error
    app.run()
    assert len(request_rows(app)) == 7   # nothing was queued


def test_empty_prompt_is_a_message_not_a_crash(app):
    app.text_area[0].input("   ")
    button(app, "Send").click()
    app.run()
    assert not app.exception
    assert any("Empty prompt" in e.value for e in app.error)
    app.run()  # the message is shown once; the page keeps working
    assert not app.error and not app.exception


def test_bad_model_path_keeps_the_previous_engine(app):
    before = kpis(app)["Prefill computed"]
    next(t for t in app.text_input if t.label == "Model").input("/no/such/model")
    button(app, "Apply").click()
    app.run()
    assert any("Engine not changed" in e.value and "/no/such/model" in e.value for e in app.error)
    assert "Model `default`" in app.caption[0].value
    assert kpis(app)["Prefill computed"] == before      # same engine, same counters
    send(app, "Why my code throws errors", max_new=1)   # and it still serves: a full cache hit
    rows = wait_rows(app, 8)
    assert rows.iloc[0]["cached / prompt"] == "4 / 5"


def test_hidden_views_wait_while_the_engine_works_and_catch_up_when_it_is_quiet(app):
    """Every view is a tab drawn in every run; a hidden one re-sends its last figures while a request
    is queued or running (refresh work of one view), the open one follows each step, and a hidden
    one is redrawn when it is opened or when the engine goes quiet."""
    toggle = lambda: next(t for t in app.toggle if t.label == "Step mode")  # noqa: E731
    toggle().set_value(True).run()
    try:
        before_row, before_tree = slot_row(app), tree_spec(app)
        n = row_count(app)
        assert app.session_state["_busy"] is False              # quiet: the poll runs at its idle pace
        send(app, "Zebras zigzag", max_new=2)
        assert slot_row(app) == before_row                     # queued: the hidden slot row is as it was
        assert app.session_state["_busy"] is True               # and the poll at the chosen interval
        button(app, "Step").click().run()                       # prefill: the prompt is in the tree now
        assert len(request_rows(app)) == n + 1 and request_rows(app).iloc[0]["state"] == "running"
        assert slot_row(app) == before_row
        edge_text = next(t for t in tree_spec(app)["data"] if t["name"] == "edge text")["text"]
        assert any("Zebras zigzag" in t for t in edge_text) and tree_spec(app) != before_tree
        app.session_state["live_view"] = "Slot pool"            # open the tab: its rerun redraws it
        app.run()
        assert slot_row(app) != before_row                      # the new prompt's slots are drawn
        app.session_state["live_view"] = "Radix tree"
        app.run()
        opened_row = slot_row(app)
        for _ in range(10):
            if request_rows(app).iloc[0]["state"] == "finished":
                break
            button(app, "Step").click().run()
        assert request_rows(app).iloc[0]["state"] == "finished"
        assert slot_row(app) != opened_row                      # quiet: the hidden tab caught up
        assert app.session_state["_busy"] is False
    finally:
        toggle().set_value(False).run()


def test_walkthrough_steps_forward_and_back():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("radixui/pages/walkthrough.py")
    at.run()
    assert not at.exception
    assert at.subheader[0].value.startswith("Start: an empty tree")
    nxt = lambda: button(at, "Next ▶").click().run()  # noqa: E731
    for t in range(4):
        nxt()
        assert at.subheader[0].value.startswith(f"Time {t}:")
    text = "\n".join(m.value for m in at.markdown)
    assert "alloc(3) takes slots [6,7,8]" in text and "[6,7,8,9]" in text
    assert "4 slots came back though only 3 were needed" in text
    note = at.info[0].value
    assert "'won't' is ' won' + ''t'" in note and "alloc(3) takes [6,7,8] where the article's takes [6,7]" in note
    assert "only [9] stays free but stale (the article: [8,9])" in note
    heap = at.table[0].value   # a static table: the text and slots columns are all there
    assert list(heap.columns) == ["order", "node", "last used", "tokens", "text", "slots"]
    assert list(heap["order"]) == list(range(1, len(heap) + 1))
    assert "GPU memory runs out" not in set(heap["text"]) and "10–11" in set(heap["slots"])
    # the heap holds leaves only; the nodes with children are named under it (the table listed them as victims)
    assert list(heap["text"]) == ["throws errors", "is slow", "won't compile"]
    assert "Then, once their children are gone: node 4 ('my code'), node 2 ('Why')" in [c.value for c in at.caption]
    button(at, "◀ Back").click().run()
    assert at.subheader[0].value.startswith("Time 2:")
    assert "alloc(2) takes slots [10,11]" in "\n".join(m.value for m in at.markdown)
    assert not at.info   # time 2: every word is one token, as in the article


def test_walkthrough_buttons_are_enabled_for_the_step_the_click_leads_to():
    """The state of Back and Next is computed after the click is applied: at Time 3 (the last step) Next
    is disabled, after Restart "Press Next" sits above an enabled Next and Back is disabled."""
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("radixui/pages/walkthrough.py")
    at.run()
    state = lambda: (button(at, "◀ Back").disabled, button(at, "Next ▶").disabled)  # noqa: E731
    assert state() == (True, False)
    button(at, "Next ▶").click().run()
    assert at.subheader[0].value.startswith("Time 0:") and state() == (False, False)
    for t in (1, 2, 3):
        button(at, "Next ▶").click().run()
        assert at.subheader[0].value.startswith(f"Time {t}:")
    assert state() == (False, True)              # the last step: Next does nothing, so it looks it
    button(at, "◀ Back").click().run()
    assert at.subheader[0].value.startswith("Time 2:") and state() == (False, False)
    button(at, "Restart").click().run()
    assert at.subheader[0].value.startswith("Start: an empty tree") and state() == (True, False)
    assert any("Press **Next**" in m.value for m in at.markdown)
    assert not at.exception


def test_requests_of_a_rebuilt_engine_leave_the_table_instead_of_staying_submitted(app):
    """Apply in the sidebar rebuilds the engine: the tab's earlier requests, finished or not, are the
    old engine's; none stays behind as a "submitted" row with empty values, and the message says how
    many unfinished ones went with it."""
    pool = number(app, "Pool size (slots)")
    before = pool.value
    send(app, "Once upon a time, in a small village by the sea, there lived", max_new=400)
    rid = app.session_state["_table_rids"][0]
    model = next(t for t in app.text_input if t.label == "Model")
    try:
        model.input("default")                 # an earlier test may have left a bad path in the form
        number(app, "Pool size (slots)").set_value(before - 64)
        button(app, "Apply").click()
        app.run()
        assert not app.exception and not app.error, [e.value for e in app.error]
        assert any("Engine rebuilt" in t.value and "1 unfinished request went with the old engine" in t.value
                   for t in app.toast), [t.value for t in app.toast]
        for _ in range(3):
            rows = request_rows(app)
            assert rows is None or (rid not in set(rows["request"]) and "submitted" not in set(rows["state"])), rows
            app.run()
    finally:
        number(app, "Pool size (slots)").set_value(before)
        button(app, "Apply").click()
        app.run()
    assert f"{before:,} slots" in app.caption[0].value


def test_a_send_draws_its_row_at_once_and_its_branch_on_the_next_run(app):
    """A Send's own run adds the row and re-sends every chart as it was: a changed Plotly chart is a new
    element to the browser, re-plotted from scratch (~0.5 CPU s of a 2-core box for the page's charts),
    which held the row back. It asks the poll's next tick for the run that draws the new branch."""
    n = row_count(app)
    wait_rows(app, n) if n else wait_quiet(app)                # quiet, every figure current
    before = charts(app)
    send(app, "Yaks yodel at dawn", max_new=2)
    assert row_count(app) == n + 1 and charts(app) == before
    assert app.session_state["_catch_up"] is True
    wait_rows(app, n + 1)                                       # the next runs draw the figures
    edge_text = next(t for t in tree_spec(app)["data"] if t["name"] == "edge text")["text"]
    assert any("Yaks yodel at dawn" in t for t in edge_text)


def test_a_send_keeps_a_view_without_a_chart_as_it_was_though_the_engine_already_took_the_request(app, monkeypatch):
    """After a rebuild the Time travel view has no events, so no chart. A Send whose run already finds its
    request in the engine (a fast engine, or a page run on a busy box) plotted that view's two charts in the Send's
    own run; it re-sends the view as it was, and the poll's next tick draws them."""
    from radixui.panels import live_views
    real = live_views.admitted_snapshot

    def admitted(client, rids, stepping):               # the request is in the engine before the run reads it
        deadline = time.time() + 10
        snap = real(client, rids, stepping)
        while not any(r.state != "waiting" for r in snap.requests) and time.time() < deadline:
            time.sleep(0.02)
            snap = real(client, rids, stepping)
        return snap

    pool = number(app, "Pool size (slots)")
    before_pool = pool.value
    try:
        pool.set_value(before_pool - 64)
        button(app, "Apply").click()
        app.run()                                      # a new engine: no requests, no events
        wait_quiet(app)
        before = charts(app)
        assert any(i.value.startswith("No events yet") for i in app.info)      # the Time travel view: no chart
        monkeypatch.setattr(live_views, "admitted_snapshot", admitted)
        send(app, "Quolls quarrel quietly", max_new=2)
        assert row_count(app) == 1 and charts(app) == before
        monkeypatch.setattr(live_views, "admitted_snapshot", real)
        wait_rows(app, 1)
        assert len(charts(app)) == len(before) + 2       # the Time travel view's tree and slot row, drawn after
    finally:
        number(app, "Pool size (slots)").set_value(before_pool)
        button(app, "Apply").click()
        app.run()


def test_with_live_refresh_off_a_send_draws_its_branch_in_its_own_run(app):
    """No poll tick follows, so that run waits (briefly) for the admission and draws the figures itself."""
    live = lambda: next(t for t in app.toggle if t.label == "Live refresh")  # noqa: E731
    live().set_value(False).run()
    try:
        n = row_count(app)
        send(app, "Ibexes idle on ice", max_new=2)
        assert row_count(app) == n + 1
        edge_text = next(t for t in tree_spec(app)["data"] if t["name"] == "edge text")["text"]
        assert any("Ibexes idle on ice" in t for t in edge_text)
    finally:
        live().set_value(True).run()


def test_time_travel_holds_a_past_event_while_new_events_arrive(app):
    """The slider went back to the newest event whenever one arrived (a new range made a new widget), so on a
    busy engine no past event could be held; it now keeps its end until the slider is dragged back to it."""
    before = row_count(app)
    send(app, "Once upon a time", max_new=2)
    wait_rows(app, before + 1)
    slider = next(s for s in app.slider if s.label == "After event")
    first, end = int(slider.min), int(slider.max)
    slider.set_value(first + 1)
    app.run()
    before = row_count(app)
    send(app, "A second story begins", max_new=2)
    wait_rows(app, before + 1)
    slider = next(s for s in app.slider if s.label == "After event")
    assert (slider.value, slider.max) == (first + 1, end), (first, end, slider.value, slider.max)
    assert any(m.value.startswith(f"**Event {first + 1}**") for m in app.markdown), ([m.value[:40] for m in app.markdown if "Event" in m.value], first, end)
    assert any("newer event(s) since you picked this one" in c.value for c in app.caption)
    slider.set_value(end)        # back at the end: follow the newest again
    app.run()
    app.run()
    slider = next(s for s in app.slider if s.label == "After event")
    assert slider.max > end and slider.value == slider.max
