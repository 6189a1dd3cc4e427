"""core/server/child_process.py: a child in its own session still ends when its launcher is killed outright
(Linux's parent-death signal; the project runs and tests on Linux)."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

LAUNCHER = """
import sys
from core.server.child_process import start_child
child = start_child([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:           # a zombie is gone for our purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_in_its_own_session_ends_when_its_launcher_is_sigkilled():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    try:
        assert os.getsid(child) == child != os.getsid(launcher.pid)   # its own session: no terminal signal reaches it
        assert _alive(child)
        launcher.kill()
        launcher.wait(10)
        deadline = time.time() + 10
        while time.time() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
