"""The newcomer's path: `make test` installs what the tests need (.ci/browser-deps, as CI does) or says in one line
how to, and the README's two commands are the Makefile's targets. The script really runs, with a PATH of our
making: a fake `id` (root or not), a fake `apt-get` that records its calls, and chromium present or not."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "browser-deps"
PACKAGES = "chromium fonts-dejavu-core fonts-noto-cjk fonts-noto-color-emoji"


def fake_bin(tmp: pathlib.Path, uid: int, chromium: bool) -> pathlib.Path:
    bin_ = tmp / "bin"
    bin_.mkdir()
    tools = {"id": f'echo {uid}', "apt-get": 'echo "DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> "$APT_LOG"'}
    if chromium:
        tools["chromium"] = "exit 0"
    for name, body in tools.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    return bin_


def run_script(tmp: pathlib.Path, uid: int, chromium: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    log = tmp / "apt.log"
    env = {"PATH": str(fake_bin(tmp, uid, chromium)), "APT_LOG": str(log)}   # no /usr/bin: no real chromium
    got = subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    return got, (log.read_text().splitlines() if log.exists() else [])


def test_without_chromium_and_not_root_it_prints_the_one_command_to_run_and_exits_1(tmp_path):
    got, apt = run_script(tmp_path, uid=1000, chromium=False)
    assert got.returncode == 1 and got.stdout == "" and apt == []
    assert got.stderr == ("The browser tests need Debian's chromium; install it with: sudo apt-get update && "
                          f"sudo apt-get install -y --no-install-recommends {PACKAGES}\n")


def test_without_chromium_as_root_it_updates_then_installs_chromium_and_the_fonts_noninteractively(tmp_path):
    got, apt = run_script(tmp_path, uid=0, chromium=False)
    assert got.returncode == 0, got.stderr
    assert apt == ["DEBIAN_FRONTEND=noninteractive update -qq",
                   f"DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends {PACKAGES}"]


def test_with_chromium_present_it_does_nothing_whoever_runs_it(tmp_path):
    for uid in (0, 1000):
        case = tmp_path / str(uid)
        case.mkdir()
        got, apt = run_script(case, uid=uid, chromium=True)
        assert (got.returncode, got.stdout, got.stderr, apt) == (0, "", "", [])


def makefile_targets() -> dict[str, list[str]]:
    """target -> its prerequisites, from the Makefile's rule lines."""
    rules = re.findall(r"^([A-Za-z][\w-]*):(?!=)([^\n]*)$", (ROOT / "Makefile").read_text(), re.M)
    return {name: deps.split() for name, deps in rules}


def test_the_readmes_two_commands_are_makefile_targets_and_test_installs_the_browser_first():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands\s+```bash\n(.*?)```", readme, re.S).group(1)
    commands = re.findall(r"^make (\w+)", block, re.M)
    assert commands == ["run", "test"]
    targets = makefile_targets()
    assert set(commands) <= set(targets)
    assert targets["test"][0] == "browser-deps" and targets["browser-deps"] == []
    recipe = (ROOT / "Makefile").read_text().split("\nbrowser-deps:\n", 1)[1].splitlines()[0]
    assert recipe == "\t.ci/browser-deps"
    assert os.access(SCRIPT, os.X_OK)


def test_ci_runs_the_readmes_test_command_and_nothing_else():
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[-1] == "exec make test"
    assert not any("apt-get" in ln or "pytest" in ln for ln in lines)


def test_make_test_runs_the_browser_check_before_pytest():
    got = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = got.stdout.splitlines()
    assert got.returncode == 0, got.stderr
    deps = lines.index(".ci/browser-deps")
    assert any("-m pytest" in ln for ln in lines[deps + 1:])
