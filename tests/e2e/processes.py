"""The processes the browser tests start: free ports, waiting for an answer, stopping, a Streamlit page,
`make run`'s pair (the engine server and the dashboard attached to it), and the CPU seconds they use,
shared by every browser test file."""
from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from core.server import http_probe
from tests.e2e import CHROMIUM

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "e2e" / "artifacts"


def require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        raise RuntimeError("Debian's chromium is missing: .ci/run installs it (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[2]} exited; see {log}")
        if http_probe.answers(url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def streamlit_app(script: str, log: pathlib.Path, env: dict) -> Iterator[tuple[str, subprocess.Popen]]:
    """`streamlit run script` on a free 127.0.0.1 port until the block ends; yields (url, process)."""
    port = free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", script, "--server.port", str(port),
                                 "--server.address", "127.0.0.1", "--server.headless", "true"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(url, proc, log)
            yield url, proc
        finally:
            stop(proc)


@contextlib.contextmanager
def attached_stack(name: str, server_args: Sequence[str], ui_env: dict) -> Iterator[tuple[str, str]]:
    """`python -m core.server` with `server_args` and `streamlit run app.py` attached to it (RADIX_ENGINE_URL) on
    free 127.0.0.1 ports; yields (server url, dashboard url); logs in artifacts/<name>_server.log / _streamlit.log."""
    require_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    sport = free_port()
    slog = ARTIFACTS / f"{name}_server.log"
    with open(slog, "w") as so:
        server = subprocess.Popen([sys.executable, "-m", "core.server", "--port", str(sport), *server_args],
                                  cwd=ROOT, stdout=so, stderr=subprocess.STDOUT)
        try:
            surl = f"http://127.0.0.1:{sport}"
            wait_http(f"{surl}/health", server, slog)
            with streamlit_app("app.py", ARTIFACTS / f"{name}_streamlit.log", dict(ui_env, RADIX_ENGINE_URL=surl)) as (uurl, _):
                yield surl, uurl
        finally:
            stop(server)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (Linux), in seconds."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants still alive."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
            kids = pathlib.Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        todo += [int(k) for k in kids]
    return total


def parent_pid(pid: int) -> int:
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def chromium_pid():
    """The main chromium process this test process launched (its renderers are its descendants)."""
    me = os.getpid()
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            exe = (p / "cmdline").read_bytes().split(b"\0")[0]
            pid, ancestor = int(p.name), parent_pid(int(p.name))
            if not exe.endswith(b"chromium") or exe == (pathlib.Path(f"/proc/{ancestor}/cmdline").read_bytes().split(b"\0")[0]):
                continue
            while ancestor > 1 and ancestor != me:
                ancestor = parent_pid(ancestor)
        except (OSError, ValueError, IndexError):
            continue
        if ancestor == me:
            return pid
    return None
