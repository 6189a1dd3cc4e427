"""A real Ctrl-C (SIGINT) while `Engine.generate` steps on the main thread: it lands wherever Python is, and the
engine must come out whole. Before sigint_guard.py, a signal inside the scheduler, the tree or the allocator left
slots lost or owned twice and paths locked for good, and a later request read another's KV."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.engine.sigint_guard import SigintGuard
from tests.engine_checks import no_leak, still_serves
from tests.interrupts import default_sigint
from tests.tiny_models import tiny_pair

PROMPTS = [[7, 3, 9, 2, 11, 5] * 3, [8, 8, 1, 2] * 5, [7, 3, 9, 2, 11, 5] * 2 + [40, 41], [21, 22, 23] * 6]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama")


@pytest.fixture
def python_sigint():
    """SIGINT raises KeyboardInterrupt here, as in a terminal (a test worker may have it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _ctrl_c_inside(obj, name: str, monkeypatch) -> None:
    """The next call of obj.name receives a real SIGINT at its start, then runs as itself."""
    original = getattr(obj, name)

    def signalled(*args, **kwargs):
        monkeypatch.setattr(obj, name, original)
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)
    monkeypatch.setattr(obj, name, signalled)


@pytest.mark.parametrize("where", ["scheduler._admit_one", "scheduler.cache_unfinished", "scheduler.release",
                                   "cache.match_prefix", "cache.insert", "cache.inc_lock_ref", "allocator.alloc",
                                   "allocator.free"])
def test_a_ctrl_c_inside_the_schedulers_bookkeeping_waits_for_a_whole_state(pair, python_sigint, monkeypatch,
                                                                           where):
    ref, runner = pair
    e = Engine(runner, pool_slots=120, page_size=2)
    e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=3))     # a cached prefix: matches and splits follow
    part, name = where.split(".")
    _ctrl_c_inside(getattr(e, part), name, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(3):
            e.generate(PROMPTS, SamplingParams(max_new_tokens=6))
    no_leak(e)
    still_serves(e, ref)


TRIALS = """
import os, random, signal, threading, time
from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from tests.engine.test_engine_ctrl_c import PROMPTS
from tests.engine_checks import no_leak, still_serves
from tests.interrupts import default_sigint
from tests.tiny_models import tiny_pair
ref, runner = tiny_pair("llama")
e = Engine(runner, pool_slots=120, page_size=2)
rng = random.Random(0)
interrupted = 0
for trial in range(40):
    timer = threading.Timer(rng.uniform(0, 0.03), os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        e.generate(rng.sample(PROMPTS, 3), SamplingParams(max_new_tokens=rng.randint(2, 12)))
        timer.join()
        time.sleep(0.05)          # a signal that came after generate returned lands here, harmlessly
    except KeyboardInterrupt:
        interrupted += 1
        timer.join()
    no_leak(e)
still_serves(e, ref)
print("interrupted", interrupted)
"""


def test_random_real_ctrl_cs_during_generate_never_break_the_engine():
    """Signals from another thread at random moments, on one engine, as a notebook user pressing Ctrl-C. In a
    process of its own: its main thread is a plain one, and a stray signal cannot reach the test runner."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", TRIALS], cwd=root, capture_output=True, text=True, timeout=300,
                          preexec_fn=default_sigint)
    assert done.returncode == 0, done.stderr[-3000:]
    interrupted = int(done.stdout.split()[-1])
    assert interrupted >= 10, f"only {interrupted} of 40 trials were interrupted: the timings missed"


def test_a_guard_off_the_main_thread_or_with_sigint_ignored_changes_nothing(python_sigint):
    seen = []

    def off_main() -> None:
        with SigintGuard():
            seen.append(signal.getsignal(signal.SIGINT))
    worker = threading.Thread(target=off_main)
    worker.start()
    worker.join()
    assert seen == [signal.default_int_handler]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with SigintGuard():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_held_back_ctrl_c_is_raised_when_the_guard_ends_and_the_handler_is_restored(python_sigint):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with SigintGuard():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_held_back_ctrl_c_is_not_lost_behind_an_ordinary_error(python_sigint):
    """reset_cache refusing while requests run (ValueError): a caller that catches it still gets the Ctrl-C."""
    with pytest.raises(KeyboardInterrupt) as got:
        with SigintGuard():
            os.kill(os.getpid(), signal.SIGINT)
            raise ValueError("refused")
    assert isinstance(got.value.__context__, ValueError)


def test_a_handler_that_sets_its_own_sigint_handler_keeps_it(python_sigint):
    """As the lab's CLI mutes a second Ctrl-C while it cleans up: the guard does not put the old one back."""
    def mute(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, mute)
    with pytest.raises(KeyboardInterrupt):
        with SigintGuard() as guard:
            with guard.interruptible():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
