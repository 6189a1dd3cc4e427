"""The Live page's pure parts: the request table, notes, the form's checks, the KPI line, the
SGLang status line, the hit-rate series, and the walkthrough's note on the article's numbers."""
from __future__ import annotations

import math

import pytest

from core.cache.events import AllocEvent, EvictEvent
from core.observe.snapshot import RequestView
from core.observe.time_travel import empty_snapshot
from radixui.figures.hit_chart import hit_rate_figure, hit_rate_series
from radixui.figures.kpis import kpi_line, kpis, sglang_status
from radixui.figures.narrate import article_token_note, word_groups
from radixui.figures.plot import validate
from radixui.panels.live_views import chunked_prefill_note
from radixui.panels.request_rows import TABLE_COLUMNS, request_table, selected_rid, table_key
from radixui.panels.prompt_panel import form_params


def req(rid, state="finished", prompt=10, cached=0, out=3, ttft=0.25):
    return RequestView(rid=rid, state=state, prompt_tokens=prompt, cached_tokens=cached, output_tokens=out,
                       prompt_text="p", output_text="o", finish_reason="length" if state == "finished" else None,
                       ttft=ttft, total_time=1.0)


class Snap:
    def __init__(self, requests):
        self.requests = tuple(requests)
        self.cache = empty_snapshot(64)


def test_request_table_lists_pending_submissions_first_and_marks_the_shown_path():
    snap = Snap([req("r1", cached=4, prompt=5), req("r2", state="waiting", ttft=None, out=0)])
    df = request_table(snap, {"r1": ("p", 0.0), "r9": ("Why is the sky blue", 1.0)}, selected="r1")
    assert list(df.columns) == TABLE_COLUMNS and "TTFT from submit (s)" in TABLE_COLUMNS
    assert list(df["request"]) == ["r9", "r2", "r1"]          # r1 is listed by the engine: not pending
    assert list(df["state"]) == ["submitted", "waiting", "finished"]
    assert list(df["cached / prompt"]) == ["", "", "4 / 5"]    # waiting: not matched yet
    assert list(df["path"]) == ["", "", "◀"]


def test_selected_row_maps_to_the_rid_drawn_last_run():
    k1 = table_key(["r9", "r2", "r1"])
    ss = {"_table_rids": ["r9", "r2", "r1"], "_table_key": k1, k1: {"selection": {"rows": [2], "columns": []}}}
    assert selected_rid(ss) == "r1"
    ss["_table_rids"] = ["r10", "r9", "r2", "r1"]               # a new row on top: still r1
    assert selected_rid(ss) == "r1"
    k2 = ss["_table_key"] = table_key(ss["_table_rids"])        # drawn anew under its own key: no tick at row 2
    assert k2 != k1
    ss[k2] = {"selection": {"rows": [], "columns": []}}
    assert selected_rid(ss) == "r1"                            # the new table's empty tick is no click
    ss[k2] = {"selection": {"rows": [1], "columns": []}}        # a click on r9
    assert selected_rid(ss) == "r9"
    ss[k2] = {"selection": {"rows": [], "columns": []}}         # unticked: back to no selection
    assert selected_rid(ss) is None


def test_chunked_prefill_is_explained():
    assert chunked_prefill_note(Snap([req("r1", prompt=1024)]), 1024) is None
    note = chunked_prefill_note(Snap([req("r1", prompt=1112)]), 1024)
    assert "1,112 tokens, more than max prefill (1,024)" in note and "prefilled in 2 chunks" in note
    assert "shows as 2 nodes" in note


@pytest.mark.parametrize("fields, message", [
    ((-5, 0, 1, 0, 1, 0), "Max new tokens must be a whole number of at least 1; got -5"),
    ((0, 0, 1, 0, 1, 0), "Max new tokens must be a whole number of at least 1; got 0"),
    ((2.5, 0, 1, 0, 1, 0), "Max new tokens must be a whole number"),
    ((math.nan, 0, 1, 0, 1, 0), "Max new tokens"),
    ((8, -1, 1, 0, 1, 0), "Temperature must be at least 0 and at most 2"),
    ((8, 0, 0, 0, 1, 0), "Top p must be above 0 and at most 1"),
    ((8, 0, 1, -3, 1, 0), "Top k must be a whole number of at least 0"),
    ((8, 0, 1, 0, 0, 0), "Copies must be a whole number from 1 to 64"),
    ((8, 0, 1, 0, 65, 0), "Copies must be a whole number from 1 to 64"),
    ((8, 0, 1, 0, 1, 0.5), "Priority must be a whole number"),
])
def test_form_params_name_the_bad_field(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        form_params(*fields)


def test_form_params_pass_the_values_through():
    params, copies = form_params(100000, 0.7, 0.9, 40, 3, 5)
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.priority) == \
        (100000, 0.7, 0.9, 40, 5)
    assert copies == 3 and isinstance(params.max_new_tokens, int)


def test_kpi_line_is_one_element_with_every_tile_and_the_step():
    m = {"hit_rate": 0.5, "running": 0, "waiting": 0, "locked_slots": 0, "free_slots": 10}
    line = kpi_line(m, step=42)
    assert line.count("class='kpi-l'") == len(kpis(m)) == 10
    assert ">step 42<" in line and line.startswith("<div") and line.count("<div") == 1
    assert "<b class='kpi-v'>0 / 0</b>" in line and "<b class='kpi-v'>50.0%</b>" in line


def test_sglang_status_line():
    m = {"running": 2, "waiting": 1, "num_slots": 1024, "free_slots": 1000, "token_usage": 24 / 1024,
         "hit_rate": 0.452, "decode_tokens_per_s": 12.345}
    assert sglang_status(m) == ("#running-req: 2, #queue-req: 1, #token: 24, token usage: 0.02, "
                                "cache hit rate: 45.2%, gen throughput (token/s): 12.35")
    assert sglang_status({}).startswith("#running-req: –, #queue-req: –, #token: –")


def test_hit_rate_series_cumulative_and_recent():
    rs = [req("a", prompt=10, cached=0), req("b", state="waiting", cached=0), req("c", prompt=10, cached=10),
          req("d", prompt=20, cached=5)]
    s = hit_rate_series(rs, window=2)
    assert s["x"] == [1, 3, 4] and s["rid"] == ["a", "c", "d"]      # the waiting one has no count yet
    assert s["cumulative"] == [0.0, 50.0, 37.5]
    assert s["recent"] == [0.0, 50.0, 50.0]                        # (10 + 5) / (10 + 20)
    fig = validate(hit_rate_figure(rs))
    assert [t.name for t in fig.data] == ["cumulative", "last 20"]
    assert list(fig.layout.xaxis.range) == [0.5, 5.5] and fig.layout.xaxis.dtick == 1


def test_the_empty_hit_chart_counts_requests_from_one():
    """No request yet: the x axis runs over request numbers 1-5 (plotly's empty default was -1..6)."""
    fig = validate(hit_rate_figure([]))
    assert list(fig.layout.xaxis.range) == [0.5, 5.5] and fig.layout.xaxis.dtick == 1
    many = [req(f"r{i}") for i in range(1, 31)]
    assert validate(hit_rate_figure(many)).layout.xaxis.range is None     # many points: plotly fits them


def test_word_groups_join_pieces_into_words():
    assert word_groups(["Why", " my", " code", " won", "'t", " compile"]) == \
        [["Why"], [" my"], [" code"], [" won", "'t"], [" compile"]]


def test_article_note_explains_the_extra_slot_at_time_3():
    tokens = ["Why", " my", " code", " won", "'t", " compile"]
    events = [EvictEvent(seq=1, time=3, node=3, parent=2, token_ids=(5, 6, 7, 8), slots=(6, 7, 8, 9),
                         last_access_time=1, policy_key=(1,)),
              AllocEvent(seq=2, time=3, slots=(6, 7, 8))]
    note = article_token_note(tokens, 3, events)
    assert "'won't' is ' won' + ''t'" in note and "the prompt is 6 tokens, not 5" in note
    assert "3 new tokens need slots where the article needs 2" in note
    assert "alloc(3) takes [6,7,8] where the article's takes [6,7]" in note
    assert "only [9] stays free but stale (the article: [8,9])" in note
    assert article_token_note(["Why", " my", " code", " is", " slow"], 3, events) is None


def test_cached_figure_rebuilds_on_new_inputs_and_a_hidden_view_keeps_its_last():
    from radixui.panels.live_data import cached_figure
    ss, built = {}, []
    make = lambda tag: (lambda: built.append(tag) or tag)  # noqa: E731
    assert cached_figure(ss, "row", (1,), make("a"), fresh=False) == "a"   # none yet: built even hidden
    assert cached_figure(ss, "row", (2,), make("b"), fresh=False) == "a"   # hidden: the last one
    assert cached_figure(ss, "row", (1,), make("c")) == "a"                # same inputs: not rebuilt
    assert cached_figure(ss, "row", (2,), make("d")) == "d"                # open, new inputs: rebuilt
    assert built == ["a", "d"]


def test_the_poll_ticks_fast_while_busy_slower_for_the_linger_then_at_the_idle_pace():
    from radixui.panels.live_poll import BUSY_LINGER_S, poll_every
    ss: dict = {}
    assert poll_every(ss, 1.0, False, now=100.0) == 3.0                       # never busy: idle pace
    assert poll_every(ss, 1.0, True, now=100.0) == 0.25                       # busy
    assert ss["_busy_until"] == 100.0 + BUSY_LINGER_S == 110.0
    assert poll_every(ss, 1.0, False, now=105.0) == 0.5                       # quiet, lingering
    assert poll_every(ss, 2.0, False, now=105.0) == 0.5                       # the linger caps a slow interval
    assert poll_every(ss, 0.3, False, now=105.0) == 0.3                       # and keeps a quicker one
    assert poll_every(ss, 1.0, False, now=110.0) == 3.0                       # the linger is over
    assert poll_every(ss, 5.0, False, now=111.0) == 5.0                       # idle: the interval, if longer
    assert ss["_busy_until"] == 110.0                                         # a quiet run does not extend it


@pytest.mark.parametrize("metrics, quiet", [
    ({"running": 0, "waiting": 0}, True), ({"running": 1, "waiting": 0}, False),
    ({"running": 0, "waiting": 2}, False), ({}, True), (None, True),
])
def test_engine_quiet_means_nothing_running_or_queued(metrics, quiet):
    from radixui.panels.live_views import engine_quiet

    class S:
        pass
    s = S()
    s.metrics = metrics
    assert engine_quiet(s) is quiet


def test_event_log_marks_splits_and_evictions_in_a_plain_frame():
    from core.cache.events import SplitEvent
    from radixui.panels.live_views import log_table
    events = [AllocEvent(seq=1, time=1.0, slots=(1, 2)), SplitEvent(seq=2, time=2.0, node=1, new_parent=2, position=1),
              EvictEvent(seq=3, time=3.0, node=1, parent=0, token_ids=(5,), slots=(2,),
                         last_access_time=2.0, policy_key=(2.0,))]
    df = log_table(events, None, ["alloc", "split", "evict"])
    assert list(df["seq"]) == [3, 2, 1] and list(df["highlight"]) == ["✕ evict", "✂ split", ""]
    assert list(log_table(events, None, ["alloc"])["seq"]) == [1]


def test_the_events_a_snapshot_describes_stop_at_its_seq():
    """The store may hold events fetched after the snapshot was taken; the tree's highlights, ghosts
    and eviction caption use only those up to the snapshot's seq (one step for all)."""
    from radixui.panels.live_data import EventStore
    store = EventStore()
    store.events = [EvictEvent(seq=i, time=i, node=i, parent=0, token_ids=(i,), slots=(i,), last_access_time=0,
                               policy_key=(0,)) for i in range(1, 8)]
    assert [e.seq for e in store.recent_upto(5)] == [1, 2, 3, 4, 5]
    assert [e.seq for e in store.recent_upto(5, n=2)] == [4, 5]
    assert [e.seq for e in store.recent_upto(99)] == list(range(1, 8))
    assert store.recent_upto(0) == []


def test_a_submission_leaves_the_pending_list_once_the_engine_lists_it():
    """Listed once, a request's row is the engine's: when the engine later drops it from its table
    (or a rebuilt engine never knew it) it does not come back as "submitted"."""
    pending = {"r1": ("p", 0.0), "r9": ("q", 1.0)}
    request_table(Snap([req("r1")]), pending, selected=None)
    assert list(pending) == ["r9"]
    df = request_table(Snap([]), pending, selected=None)
    assert list(df["request"]) == ["r9"] and list(df["state"]) == ["submitted"]


def _tree(snapshot) -> set:
    return {(v.id, v.parent, tuple(v.token_ids), tuple(v.slots)) for v in snapshot.nodes}


def test_a_tab_that_missed_the_ring_s_oldest_events_travels_in_time_from_the_cache_it_first_saw(monkeypatch):
    """The engine keeps only its newest events: a tab opened later had no time travel at all ("the ring has
    dropped older events"). It now starts its history at a snapshot, and replays from there exactly; so does a
    store that trims its own oldest events."""
    import radixui.panels.live_data as live_data
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams
    from tests.tiny_models import tiny_pair

    e = Engine(tiny_pair("llama")[1], pool_slots=48, event_capacity=60)

    class Client:
        def events_since(self, seq, limit=2000):
            return e.events_since(seq)[-limit:]

    def run(k: int) -> None:
        for i in range(k):
            e.generate([[1 + (i * 7) % 90, 2, 3, 4 + i % 5, 5]], SamplingParams(max_new_tokens=3))

    run(8)                                   # about 80 events, more than the 60 kept: the oldest are gone
    store = live_data.EventStore()
    snap = e.snapshot()
    store.sync(Client(), snap)
    assert store.rebased and store.start_seq == snap.cache.seq and store.events == []
    run(3)
    snap = e.snapshot()
    store.sync(Client(), snap)
    assert store.events and int(store.events[-1].seq) == snap.cache.seq
    assert _tree(store.replayer_for(snap).at(snap.cache.seq)) == _tree(snap.cache)
    monkeypatch.setattr(live_data, "MAX_EVENTS", 10)     # the store trims its own oldest: the base moves up
    run(2)
    snap = e.snapshot()
    store.sync(Client(), snap)
    assert len(store.events) == 10 and store.start_seq == int(store.events[0].seq) - 1
    rp = store.replayer_for(snap)
    assert _tree(rp.at(snap.cache.seq)) == _tree(snap.cache)
    e.check_invariants()


def test_a_tab_whose_engine_was_replaced_behind_its_back_starts_its_history_again():
    """Another tab's Apply, an admin's rebuild or a restart gives a new engine that counts from 0 again; once it
    had counted past where this tab stopped, its seq alone did not tell, and Time travel mixed the two engines'
    histories (the old pool size, the new engine's first events missing). Its snapshots name it."""
    import radixui.panels.live_data as live_data
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams
    from core.observe import wire
    from tests.tiny_models import tiny_pair

    runner = tiny_pair("llama")[1]
    engine = {"now": Engine(runner, pool_slots=96)}

    class Client:
        def events_since(self, seq, limit=2000):
            return engine["now"].events_since(seq)[-limit:]

    def run(k: int, first: int = 1) -> None:
        for i in range(k):
            engine["now"].generate([[first + i, 2, 3, 4, 5]], SamplingParams(max_new_tokens=2))

    store = live_data.EventStore()
    run(1)
    store.sync(Client(), engine["now"].snapshot())
    held = store.last_seq
    engine["now"] = Engine(runner, pool_slots=48)          # replaced: counts from 0 again, on another pool
    run(6, first=40)
    snap = engine["now"].snapshot()
    assert snap.seq > held and snap.engine_id != ""
    assert wire.snapshot_from_json(wire.snapshot_to_json(snap)).engine_id == snap.engine_id   # over the wire too
    store.sync(Client(), snap)
    assert store.events == engine["now"].events_since(1) and not store.rebased     # the new engine's, after its reset
    assert _tree(store.replayer_for(snap).at(snap.cache.seq)) == _tree(snap.cache)
    run(1, first=80)                                       # the same engine goes on: nothing starts again
    snap = engine["now"].snapshot()
    store.sync(Client(), snap)
    assert store.events == engine["now"].events_since(1)
