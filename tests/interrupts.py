"""Subprocesses that a test stops with Ctrl-C (SIGINT) must have Python's handler for it. A process started as
a background job of a non-interactive shell (CI scripts, `cmd &`) inherits SIGINT as ignored, and Python then
installs no KeyboardInterrupt handler in its children: the signal would be dropped and the test would see the
program finish instead of stop. Pass `preexec_fn=default_sigint` to Popen."""
from __future__ import annotations

import signal


def default_sigint() -> None:
    """Run in the child before exec: SIGINT back to its default, so Python turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
