"""Aborting from the Live page: the selected request's button and the sidebar's abort all."""
from __future__ import annotations

from tests.radixui.pages.test_app import button, kpis, request_rows, send


def test_a_running_request_is_aborted_from_the_table_and_every_one_from_the_sidebar(app):
    """A demo's long generation can be stopped: the selected row's button aborts it, the sidebar's aborts all
    (the reset needs an idle engine); the slots come back and the table says "aborted"."""
    toggle = lambda: next(t for t in app.toggle if t.label == "Step mode")  # noqa: E731
    toggle().set_value(True).run()
    try:
        send(app, "Count slowly from one to one hundred:", max_new=60)
        button(app, "Step").click().run()
        rid = request_rows(app).iloc[0]["request"]
        assert request_rows(app).iloc[0]["state"] == "running"
        ss = app.session_state
        ss["_selected_rid"], ss["_last_table_key"], ss["_last_rows"] = rid, ss["_table_key"], []   # as a click does
        app.run()
        assert not any(b.label.startswith("Abort r") for b in app.button if b.label != f"Abort {rid}")
        button(app, f"Abort {rid}").click().run()
        assert request_rows(app).iloc[0]["state"] == "aborted"
        assert not any(b.label == f"Abort {rid}" for b in app.button)       # nothing left to abort there
        assert [t.value for t in app.toast][-1:] == [f"Aborted {rid}: its slots are back in the pool."]
        send(app, "First of two", max_new=60)
        send(app, "Second of two", max_new=60)
        button(app, "Step").click().run()
        button(app, "Abort all requests").click().run()
        assert list(request_rows(app)["state"][:3]) == ["aborted"] * 3
        assert [t.value for t in app.toast][-1:] == ["Aborted 2 requests."]
        button(app, "Abort all requests").click().run()
        assert any("Nothing to abort" in i.value for i in app.info)
        m = kpis(app)
        assert (m["Running / waiting"], m["Locked slots"]) == ("0 / 0", "0"), m
    finally:
        toggle().set_value(False).run()
