"""Child processes that never outlive their launcher (`make run`'s core/server/launch.py, `python -m core.replicas`).

Each child runs in its own session, so a terminal's Ctrl-C reaches only the launcher, which passes one signal
on (two, the terminal's and the launcher's, broke uvicorn's graceful stop). Its own session also keeps the
child out of the terminal's SIGHUP and out of a `kill` of the launcher's group, so on Linux the child asks the
kernel for SIGTERM when the launcher dies, however it dies (SIGKILL included): nothing is left on the ports.
"""
from __future__ import annotations

import ctypes
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_child(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(argv, **popen_kwargs)` in a new session that ends with its parent (Linux)."""
    linux = sys.platform.startswith("linux")
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent if linux else None,
                            **popen_kwargs)
