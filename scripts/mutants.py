"""Mutation testing: does the suite notice when the cache, the allocator or the lab is subtly wrong?

Applies each hand-made mutant of `scripts/mutants_catalog.py` to a scratch copy of the repository (one
copy per worker under --workdir, without .git/.venv; the worktree itself is never
touched), runs that mutant's test group with `pytest -x -q` under a timeout (in a child forked from a server that
has imported torch and friends once), and restores the file.
A failing (or timed-out) run kills the mutant; a passing one lets it survive; a mutant whose snippet no
longer occurs in the current code is "not applicable" and counts on neither side. A survivor of the suite
is then run against the tests written to kill survivors (NEW_TESTS in the catalogue): one pass prints the
BEFORE figure (older suite) and the AFTER one (with those tests).

    .venv/bin/python scripts/mutants.py                   # every mutant, 2 workers
    .venv/bin/python scripts/mutants.py --only evict-max,split-no-lock
    .venv/bin/python scripts/mutants.py --list            # the catalogue, and whether each still applies
    .venv/bin/python scripts/mutants.py --json out.json   # also save the results

Survivors that cannot be killed (equivalent mutants) are listed with the reason in EQUIVALENT below;
they are reported as "equivalent" when they survive.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutants_catalog import MUTANTS, Mutant  # noqa: E402

# Mutants that change no observable behaviour, and why (checked by reading the code, see benchmarks/README.md).
EQUIVALENT = {
    "split-no-child-stamp": "_split_node is only called from _walk, which has just stamped the child with the same `now`",
    "evict-zero-guard": "with num_tokens == 0 the loop `while freed < 0` never runs: 0 is returned either way",
    "evict-no-lock-check": "the heap holds only unlocked leaves (evictable_leaves, and parents pushed only when "
                           "unlocked and childless); nothing locks or adds children during evict",
    "peek-partial-page": "with fewer than page_size tokens left the edge key is a shorter tuple, which no child "
                         "(keyed by a whole first page) has: the loop breaks there either way",
    "root-unlocked": "the root is excluded by identity everywhere (_update_leaf_status, evict's re-push, "
                     "the lock walks stop at it), so its lock_ref is never read",
    "free-size-guard": "a call with more pages than the pool must repeat one: the run kernel (and the ring store) "
                       "reject the first repeat with a 'double free' message, and write at most one run per "
                       "distinct page checked, which the run ring always has room for",
    "free-not-dirty": "a successful free needs a page handed out since the last clear, and alloc already "
                      "cleared the pristine flag",
    "replay-inserted-from-hit": "the prompt's matched path stays locked from match_prefix to insert and nothing is "
                                "inserted in between, so insert returns exactly the device hit: cached == hit",
    "host-match-on-device": "the device tree holds every page's whole prefix, so a page right after the device "
                            "match is not on the device, nor is any later one (its parent is not): the check never fires",
    "host-victim-on-device": "host pages enter the victim heap only when they leave the device, and every way back "
                             "(a load in match, an insert) touches the page and changes its host key, so its heap "
                             "entry is stale by key before the on-device check is reached",
    "replay-tail-free": "in_tree (prompt pages in the tree) <= n_prompt <= n_cached, so max(n_cached, in_tree) "
                        "== n_cached",
    "opt-swap-on-tie": "two distinct pages never share a next use below _NEVER (a position is one access) and the "
                       "new page's k < _NEVER, so -negk == k cannot happen",
    "opt-admit-never-used": "a page with no future use has a key >= _NEVER, above every page that will be used, so "
                            "it is the first evicted when room is needed and never costs a hit",
}

FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.M)


SKIP = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "results", "lab_out"}


def make_copy(dest: Path) -> None:
    """A fresh copy of the working tree without .git, the virtualenv and caches."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT, dest, symlinks=True, ignore=lambda d, names: [n for n in names if n in SKIP])


def applies(m: Mutant, text: str) -> str:
    """'' when every snippet occurs exactly once, else why not."""
    for old, _ in m.edits:
        c = text.count(old)
        if c != 1:
            return "snippet not found" if c == 0 else f"snippet occurs {c} times"
    return ""


def mutate(text: str, m: Mutant) -> str:
    for old, new in m.edits:
        text = text.replace(old, new, 1)
    return text


def serve(copy: str) -> None:
    """A fork server for one scratch copy: third-party imports (torch, numba, hypothesis, pytest) are
    paid once; each request forks a child that imports the (mutated) project fresh and runs pytest."""
    import hypothesis, numba, numpy, pytest, torch  # noqa: F401, E401  (preloaded for the children)
    os.chdir(copy)
    sys.path.insert(0, copy)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            # no shrinking: a mutant is killed by the first failing example, and shrinking it costs minutes
            hypothesis.settings.register_profile("mutants", database=None, deadline=None, phases=[
                hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate])
            hypothesis.settings.load_profile("mutants")
            try:
                rc = int(pytest.main([*req["tests"], "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra",
                                      "--hypothesis-seed=0"]))
            except BaseException:  # noqa: BLE001 - any crash of the child is a failed run
                rc = 99
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        deadline, rc = time.monotonic() + req["timeout"], None
        while rc is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                rc = "timeout"
            else:
                time.sleep(0.05)
        print(json.dumps({"rc": rc}), flush=True)


class Server:
    """The worker's handle on its fork server."""

    def __init__(self, copy: Path, env: dict) -> None:
        self.copy = copy
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(copy)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, tests: list[str], timeout: float) -> tuple[str, str, float]:
        tests = [t for t in tests if (self.copy / t.split("::")[0]).exists()]
        log = self.copy.parent / f"{self.copy.name}.log"
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps({"tests": tests, "timeout": timeout, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        rc = json.loads(self.proc.stdout.readline())["rc"]
        dt = time.perf_counter() - t0
        out = log.read_text(errors="replace")
        if rc == "timeout":
            return "killed", "timeout", dt
        if rc == 0:
            return "survived", "", dt
        hit = FAILED.search(out)
        if hit:
            return "killed", hit.group(2), dt
        tail = out.strip().splitlines()[-1][:80] if out.strip() else ""
        return "killed", f"pytest exit {rc}: {tail}", dt

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def worker(k: int, work: "queue.Queue[Mutant]", results: dict, args, lock: threading.Lock) -> None:
    copy = Path(args.workdir) / f"w{k}"
    make_copy(copy)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "NUMBA_CACHE_DIR": str(Path(args.workdir) / f"numba-w{k}"), "PYTHONDONTWRITEBYTECODE": "1"}
    server = Server(copy, env)
    try:
        while True:
            try:
                m = work.get_nowait()
            except queue.Empty:
                return
            path = copy / m.file
            original = path.read_text()
            why = applies(m, original)
            if why:
                res = {"status": "not applicable", "detail": why, "seconds": 0.0}
            else:
                try:
                    path.write_text(mutate(original, m))
                    before, detail, dt = server.run(m.tests, args.timeout)
                    status = before
                    if before == "survived" and not args.no_new:
                        status, detail, dt2 = server.run(m.new_tests, args.timeout)
                        dt += dt2
                finally:
                    path.write_text(original)
                    os.utime(path)     # a new mtime: numba's cache of slot_kernels notices the restore
                if status == "survived" and m.name in EQUIVALENT:
                    status, detail = "equivalent", EQUIVALENT[m.name]
                res = {"before": before, "status": status, "detail": detail, "seconds": round(dt, 1)}
            with lock:
                results[m.name] = res
                print(f"  [{len(results):3d}/{args.total}] {m.name:28s} {res.get('before', '-'):9s} -> "
                      f"{res['status']:14s} {res['seconds']:6.1f}s "
                      f"{res['detail'][:90]}", flush=True)
    finally:
        server.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's test run (default 600)")
    ap.add_argument("--workdir", default="/tmp/mut")
    ap.add_argument("--only", default=None, help="comma-separated mutant names")
    ap.add_argument("--file", default=None, help="only mutants of files containing this string")
    ap.add_argument("--list", action="store_true", help="print the catalogue and whether each applies; run nothing")
    ap.add_argument("--baseline", action="store_true", help="first check the unmutated tests pass in a copy")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--no-new", action="store_true", help="run only the older suite (the BEFORE figure)")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0

    names = [m.name for m in MUTANTS]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"duplicate mutant names: {sorted(dup)}")
    chosen = MUTANTS
    if args.only:
        want = set(args.only.split(","))
        unknown = want - set(names)
        if unknown:
            raise SystemExit(f"unknown mutants {sorted(unknown)}; see --list")
        chosen = [m for m in MUTANTS if m.name in want]
    if args.file:
        chosen = [m for m in chosen if args.file in m.file]
    if args.list:
        for m in chosen:
            why = applies(m, (ROOT / m.file).read_text())
            print(f"{m.name:28s} {m.file:22s} {'ok' if not why else why:20s} {m.description}")
        return 0
    if args.baseline:
        base = Path(args.workdir) / "baseline"
        make_copy(base)
        server = Server(base, {**os.environ, "NUMBA_CACHE_DIR": str(Path(args.workdir) / "numba-base")})
        try:
            for group in sorted({tuple(m.tests) for m in chosen}):
                status, detail, dt = server.run(list(group), args.timeout * 2)
                print(f"baseline {' '.join(group)}: {'pass' if status == 'survived' else 'FAIL ' + detail} "
                      f"({dt:.0f} s)", flush=True)
                if status != "survived":
                    return 1
        finally:
            server.close()

    work: "queue.Queue[Mutant]" = queue.Queue()
    for m in chosen:
        work.put(m)
    args.total = len(chosen)
    results: dict = {}
    lock = threading.Lock()
    t0 = time.perf_counter()
    print(f"{len(chosen)} mutants, {args.workers} workers, copies under {args.workdir}")
    threads = [threading.Thread(target=worker, args=(k, work, results, args, lock)) for k in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    print(f"\n{'mutant':28s} {'file':22s} {'old suite':9s}    {'with new tests':14s} description -> detail")
    for m in chosen:
        r = results[m.name]
        print(f"{m.name:28s} {m.file:22s} {r.get('before', '-'):9s} -> {r['status']:14s} {m.description} "
              f"-> {r['detail'][:100]}")
    na = sum(r["status"] == "not applicable" for r in results.values())
    applicable = len(results) - na
    eq = sum(r["status"] == "equivalent" for r in results.values())
    before = sum(r.get("before") == "killed" for r in results.values())
    after = sum(r["status"] == "killed" for r in results.values())
    left = sum(r["status"] == "survived" for r in results.values())
    print(f"\n{applicable} applicable mutants ({na} not applicable), {eq} of them equivalent (explained):")
    print(f"  BEFORE (suite without the mutant-killing tests): {before} killed, {applicable - before} survived")
    if not args.no_new:
        print(f"  AFTER  (with tests/cache/test_radix_mutants.py, tests/lab/test_replay_reference.py, "
              f"tests/lab/test_lab_mutants.py): {after} killed, "
              f"{eq} equivalent, {left} unexplained survivors")
    print(f"  {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if left == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
