"""The Live page's sidebar and view controls at their edges: a slot range of one value, and step mode across
a rebuild (the page on the real model; its engine is shared with the other page tests: see conftest.py)."""
from __future__ import annotations

from tests.radixui.pages.live_page import wait_quiet


def test_a_slot_range_whose_handles_meet_shows_that_slot_alone(app):
    """Both handles of "Slot range" on one value raised "slot range [5, 5) is outside the pool" in the view."""
    wait_quiet(app)                              # every view drawn (a new tab draws the hidden ones a moment later)
    app.toggle(key="slot_zoom").set_value(False).run()
    try:
        size = app.slider(key="slot_range").max
        for lo in (5, 0, size):
            app.slider(key="slot_range").set_value((lo, lo)).run()
            assert not app.exception, [e.value for e in app.exception]
            assert not any("slot range" in e.value for e in app.error)
    finally:
        app.toggle(key="slot_zoom").set_value(True).run()


def test_a_rebuild_in_step_mode_keeps_step_mode():
    """The new engine waits for Step as the old one did, as the server's rebuild does; it used to start, and
    ran steps until the page's next run set step mode again."""
    from core.engine.config import EngineConfig
    from radixui.connect.in_process import EngineHolder
    from tests.tiny_models import tiny_pair

    runner = tiny_pair("llama")[1]
    holder = EngineHolder(lambda config: runner, lambda: EngineConfig(model="tiny", pool_slots=128))
    first = holder.get()
    assert first.running
    first.stop()
    assert holder.rebuild(EngineConfig(model="tiny", pool_slots=64)) is None
    stepped = holder.get()
    assert stepped is not first and not stepped.running and not first.running
    stepped.start()
    assert holder.rebuild(EngineConfig(model="tiny", pool_slots=96)) is None
    assert holder.get().running and not stepped.running
    holder.get().stop()
