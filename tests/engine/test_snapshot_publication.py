"""The engine publishes what viewers read at the end of every step: a snapshot (while someone watches)
and the gauges, so a reader never waits for a running step and never sees an older step than the
last one finished (the Live page and /metrics under load)."""
from __future__ import annotations

import threading
import time

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from tests.tiny_models import tiny_pair

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def slow_steps(engine: Engine, seconds: float) -> None:
    """Make every forward pass take `seconds` longer (a bigger model on a slower box)."""
    forward = engine.runner.forward

    def slow(batch, pool):
        time.sleep(seconds)
        return forward(batch, pool)
    engine.runner.forward = slow


def test_a_watched_request_shows_running_with_its_tokens_rising_at_every_poll():
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256)
    slow_steps(e, 0.02)
    e.snapshot(wait=False)                        # a viewer is watching from now on
    e.start()
    try:
        h = e.submit(PROMPT, SamplingParams(max_new_tokens=40, ignore_eos=True))
        seen = []
        while not h.done():
            s = e.snapshot(wait=False)
            view = next((r for r in s.requests if r.rid == h.rid), None)
            if view is not None and view.state == "running":
                seen.append((s.step, view.output_tokens))
            time.sleep(0.02)
        assert len(seen) >= 10
        steps = [st for st, _ in seen]
        tokens = [n for _, n in seen]
        assert steps == sorted(steps) and tokens == sorted(tokens) and tokens[-1] >= 30   # seen near its end
        assert all(n <= st for st, n in seen)                    # a snapshot never runs ahead of its step
        assert len(set(tokens)) >= 10                            # it moved while the request ran
    finally:
        e.stop()


def test_a_reader_gets_the_last_finished_step_without_waiting_for_the_running_one():
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256)
    slow_steps(e, 0.4)
    e.snapshot(wait=False)
    e.start()
    try:
        h = e.submit(PROMPT, SamplingParams(max_new_tokens=6, ignore_eos=True))
        deadline = time.time() + 20
        while e.snapshot(wait=False).step < 2 and time.time() < deadline:
            time.sleep(0.01)
        waits = []
        for _ in range(10):                       # most of these land inside a 0.4 s step
            t = time.perf_counter()
            s = e.snapshot(wait=False)
            waits.append(time.perf_counter() - t)
            assert s.step >= e.step_count - 1     # at most the step that is running now is missing
            time.sleep(0.05)
        assert max(waits) < 0.1, waits
        h.result(timeout=30)
    finally:
        e.stop()


def test_gauges_read_the_true_running_count_while_the_engine_is_busy():
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=512, max_running_requests=16)
    slow_steps(e, 0.02)
    e.start()
    try:
        handles = [e.submit([7, i, 3, i], SamplingParams(max_new_tokens=30, ignore_eos=True)) for i in range(12)]
        deadline = time.time() + 30
        counts = []
        while not all(h.done() for h in handles) and time.time() < deadline:
            g = e.gauges()
            counts.append((g.running, g.waiting, g.token_usage))
            time.sleep(0.01)
        assert max(r for r, _, _ in counts) == 12           # all twelve decoded together
        assert all(r + w <= 12 for r, w, _ in counts)
        assert all(0 < u < 1 for r, _, u in counts if r)     # running requests hold slots of a pool not full
        for h in handles:
            assert h.result(timeout=30).finish_reason == "length"
        g = e.gauges()
        assert (g.running, g.waiting) == (0, 0)
    finally:
        e.stop()


def test_submitted_but_not_admitted_requests_count_as_waiting_at_once():
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256)           # not started: nothing drains the inbox
    assert e.gauges().waiting == 0
    e.submit(PROMPT, SamplingParams(max_new_tokens=2))
    e.submit(PROMPT, SamplingParams(max_new_tokens=2))
    assert e.gauges().waiting == 2 and e.gauges().running == 0
    e.step()
    assert (e.gauges().running, e.gauges().waiting) == (2, 0)
    assert e.snapshot(wait=False).metrics["running"] == 2


def test_a_snapshot_from_several_threads_at_once_is_one_consistent_view():
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256)
    slow_steps(e, 0.01)
    e.start()
    errors: list = []
    stop = threading.Event()

    def read():
        while not stop.is_set():
            s = e.snapshot(wait=False)
            running = sum(1 for r in s.requests if r.state == "running")
            if running != s.metrics["running"]:
                errors.append((s.step, running, s.metrics["running"]))

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        hs = [e.submit([5, i, 5], SamplingParams(max_new_tokens=8, ignore_eos=True)) for i in range(6)]
        for h in hs:
            h.result(timeout=60)
    finally:
        stop.set()
        for t in readers:
            t.join()
        e.stop()
    assert errors == []


def test_a_caller_that_has_its_answer_sees_the_step_that_ended_it_published():
    """The engine told a request's caller it was done inside the step, before the step's gauges, version and
    snapshot were out: a caller reading them at once saw the request still running. With the end of the step
    slowed, the caller now wakes only after they are published."""
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256)
    e.snapshot(wait=False)                        # a viewer is watching: the snapshot is published each step
    tick = e.cache.tick

    def slow_tick():
        time.sleep(0.2)
        tick()
    e.cache.tick = slow_tick
    e.start()
    try:
        h = e.submit(PROMPT, SamplingParams(max_new_tokens=3, ignore_eos=True))
        h.result(timeout=30)
        g, s = e.gauges(), e.snapshot(wait=False)
        assert (g.running, g.waiting, g.step) == (0, 0, e.step_count)
        view = next(r for r in s.requests if r.rid == h.rid)
        assert (view.state, view.output_tokens, s.step) == ("finished", 3, e.step_count)
        assert view.total_time is not None
    finally:
        e.stop()
