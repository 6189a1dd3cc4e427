"""`python -m core.lab`: a sweep writes its files; bad input exits 2 with a message, no traceback."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.lab.__main__ import main
from tests.interrupts import default_sigint

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_of_a_generated_workload(tmp_path, capsys):
    rc = main(["sweep", "--workload", "generated-shared-prefix", "-p", "num_groups=4", "-p", "prompts_per_group=3",
               "-p", "system_prompt_len=64", "-p", "question_len=8", "-p", "output_len=4", "-p", "order=grouped",
               "--capacities", "80,160,1k", "--policies", "lru,lfu", "--workers", "1", "--quiet",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "infinite-capacity hit rate" in out and "smallest swept capacity reaching 90%" in out
    assert {p.name for p in tmp_path.iterdir()} == {"results.csv", "results.json", "chart.html"}
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["policies"] == ["lru", "lfu"] and data["capacities"] == [80, 160, 1000]
    html = (tmp_path / "chart.html").read_text()
    # plotly.js is inside the file (about 3.5 MB), so the chart draws offline; no script tag loads it from a CDN
    assert len(html) > 1_000_000 and re.search(r"<script[^>]*\bsrc=", html) is None
    # 1k is beyond what the workload can fill: its 388 distinct tokens (4 x 64 system + 12 x (8 question + 3
    # cached output), counted below from the sequences) plus the longest request (75) held while it runs
    from core.lab.workloads import generated_shared_prefix
    w = generated_shared_prefix(num_groups=4, prompts_per_group=3, system_prompt_len=64, question_len=8,
                                output_len=4, order="grouped")
    distinct = len({tuple(r.cached_ids()[:k].tolist()) for r in w.requests for k in range(1, r.cached_len + 1)})
    need = distinct + max(r.cached_len for r in w.requests)
    assert (distinct, need) == (388, 388 + 75)
    assert f"note: 1,000 tokens exceed the {need:,} tokens this workload can ever fill" in out   # page size 1
    big = [p for p in data["points"] if p["capacity_tokens"] == 1000]
    assert [p["pool_pages"] for p in big] == [need, need] and all(p["evictions"] == 0 for p in big)
    assert [p["hit_tokens"] for p in big] == [data["infinite"]["hit_tokens"]] * 2


def test_sweep_of_a_mooncake_slice_in_pages(mooncake_path, mooncake, tmp_path, capsys):
    from core.lab.replay import replay
    rc = main(["sweep", "--trace", str(mooncake_path), "--limit", "200", "--page-size", "512",
               "--capacities", "100p,400p", "--policies", "lru", "--workers", "1", "--quiet", "--no-optimal",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "200 requests" in out
    data = json.loads((tmp_path / "results.json").read_text())
    w = mooncake.slice(0, 200)
    assert [p["capacity_pages"] for p in data["points"]] == [100, 400]
    for p in data["points"]:
        assert p["hit_tokens"] == replay(w, p["capacity_pages"] * 512, "lru", 512).hit_tokens
    assert data["points"][0]["hit_tokens"] < data["points"][1]["hit_tokens"]
    # the infinite rate from a scan of the hash ids: a whole block hits when the same prefix of blocks came before
    seen, hits = set(), 0
    for r in w.requests:
        ids = r.hash_ids.tolist()
        whole = r.prompt_len // 512
        hits += 512 * sum(1 for k in range(whole) if tuple(ids[:k + 1]) in seen)
        seen.update(tuple(ids[:k + 1]) for k in range(whole))
    assert data["infinite"]["hit_tokens"] == hits
    assert data["infinite"]["hit_rate"] == hits / sum(r.prompt_len for r in w.requests)


def write(tmp_path, text, name="trace.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("args, msg", [
    (["--workload", "few-shot", "--capacities", "100", "--policies", "lru,bogus"],
     "unknown eviction policy 'bogus'; choose one of: lru, lfu, fifo, mru, filo, priority, slru"),
    (["--workload", "few-shot", "--capacities", "100", "--page-size", "512"], "below one page of 512"),
    (["--workload", "few-shot", "--capacities", "1k", "-p", "colour=red"], "no parameter 'colour'"),
    (["--trace", "EMPTY", "--capacities", "1k"], "holds no requests"),
    (["--trace", "BAD", "--capacities", "1k"], "line 2: malformed"),
])
def test_bad_input_exits_2_with_a_message(args, msg, tmp_path, capsys):
    args = [{"EMPTY": write(tmp_path, "", "empty.jsonl"), "BAD": write(tmp_path, "[1,2]\n{nope\n", "bad.jsonl")}.get(a, a) for a in args]
    assert main(["sweep", *args, "--workers", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and "Traceback" not in err


def test_skip_bad_lines_counts_them(tmp_path, capsys):
    path = write(tmp_path, "[1,2,3]\n{nope\n[1,2,4]\n")
    assert main(["sweep", "--trace", path, "--skip-bad-lines", "--capacities", "8", "--workers", "1", "--quiet"]) == 0
    assert "1 malformed line(s) skipped" in capsys.readouterr().out


def test_module_help_runs_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "core.lab", "sweep", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--capacities" in out.stdout and "--page-size" in out.stdout


def fails_fast(capsys, msg, *args):
    """Exit 2 with one line on stderr, before the workload is even read."""
    assert main(["sweep", *args, "--workers", "1", "--quiet"]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("error: ") and msg in cap.err and "Traceback" not in cap.err, cap.err
    assert cap.err.count("\n") == 1 and "workload" not in cap.out
    return cap.err


GSP = ["--workload", "generated-shared-prefix", "-p", "num_groups=2", "-p", "prompts_per_group=2",
       "-p", "system_prompt_len=32", "-p", "question_len=4", "-p", "output_len=2"]


def test_out_at_a_file_or_an_unwritable_place_fails_before_the_sweep(tmp_path, capsys):
    f = tmp_path / "results.txt"
    f.write_text("keep me")
    fails_fast(capsys, "is a file; give a directory", *GSP, "--capacities", "64", "--out", str(f))
    assert f.read_text() == "keep me"
    fails_fast(capsys, "cannot write results into", *GSP, "--capacities", "64", "--out", str(f / "sub"))


@pytest.mark.parametrize("value", ["0", "-512"])
def test_page_size_must_be_positive(value, capsys):
    fails_fast(capsys, f"--page-size must be a positive number of tokens per page (512 for Mooncake traces), "
                       f"got {value}", *GSP, "--capacities", "64", "--page-size", value)


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "nan", "inf"])
def test_target_must_be_a_fraction(value, capsys):
    fails_fast(capsys, "--target must be a fraction of the infinite-capacity hit rate in (0, 1]",
               *GSP, "--capacities", "64", "--target", value)


def test_target_is_what_results_json_reports(tmp_path, capsys):
    assert main(["sweep", *GSP, "--capacities", "40,80,200", "--policies", "lru", "--workers", "1", "--quiet",
                 "--target", "0.5", "--out", str(tmp_path)]) == 0
    assert "smallest swept capacity reaching 50% of it" in capsys.readouterr().out
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["target_fraction_of_infinite"] == 0.5 and "capacity_for_90pct_of_infinite" not in data


@pytest.mark.parametrize("value", ["0", "-1"])
def test_limit_must_be_positive(value, mooncake_path, capsys):
    fails_fast(capsys, f"--limit must be a positive number of requests to read, got {value}",
               "--trace", str(mooncake_path), "--capacities", "4p", "--limit", value)


MC_LINE = b'{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n'


def test_a_non_utf8_byte_names_its_line_and_can_be_skipped(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_bytes(MC_LINE + b'{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, \xff2]}\n'
                  + MC_LINE)
    fails_fast(capsys, f"{p}, line 2: malformed Mooncake line: not UTF-8 text (byte 0xff at column 75)",
                     "--trace", str(p), "--capacities", "4p")
    assert main(["sweep", "--trace", str(p), "--capacities", "4p", "--skip-bad-lines", "--workers", "1",
                 "--quiet"]) == 0
    assert "2 requests, 1,200 prompt tokens, 1 malformed line(s) skipped" in capsys.readouterr().out


def test_a_malformed_first_line_does_not_flip_the_format(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"{oops\n" + MC_LINE + MC_LINE)
    fails_fast(capsys, "line 1: malformed Mooncake line: not valid JSON", "--trace", str(p), "--capacities", "4p")
    assert main(["sweep", "--trace", str(p), "--capacities", "4p", "--skip-bad-lines", "--workers", "1",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2 requests, 1,200 prompt tokens, 1 malformed line(s) skipped" in out
    assert "page size 512 tokens: the trace's block size" in out


def test_dev_zero_is_refused_without_running_out_of_memory(capsys):
    fails_fast(capsys, "/dev/zero, line 1: longer than 64 MiB without a line break; this is not a JSONL trace",
               "--trace", "/dev/zero", "--capacities", "4p")


def test_host_tier_flags_fail_fast(capsys):
    fails_fast(capsys, "cannot read capacity 'lots'", *GSP, "--capacities", "64", "--host-capacity", "lots")
    fails_fast(capsys, "capacity '1GiB' is in bytes: give a model", *GSP, "--capacities", "64", "--host-capacity", "1GiB")
    fails_fast(capsys, "--host-bandwidth must be a positive number, got nan", *GSP, "--capacities", "64",
               "--host-capacity", "1k", "--host-bandwidth", "nan")
    fails_fast(capsys, "--prefill-rate must be a positive number, got 0.0", *GSP, "--capacities", "64",
               "--host-capacity", "1k", "--prefill-rate", "0")


def test_a_host_capacity_below_the_traces_page_fails_before_the_sweep(mooncake_path, tmp_path, capsys):
    """The early check knows no page size yet (a block trace sets 512); the sweep ran and printed its table first."""
    assert main(["sweep", "--trace", str(mooncake_path), "--limit", "20", "--capacities", "4p,8p", "--policies", "lru",
                 "--host-capacity", "0.4k", "--workers", "1", "--quiet", "--out", str(tmp_path / "o")]) == 2
    cap = capsys.readouterr()
    assert "below one page of 512 tokens" in cap.err and "Traceback" not in cap.err
    assert "hit_rate" not in cap.out and not any((tmp_path / "o").iterdir())


def test_capacities_in_the_same_page_give_one_row(tmp_path, capsys):
    assert main(["sweep", *GSP, "--capacities", "64,65,79,80", "--page-size", "16", "--policies", "lru",
                 "--workers", "1", "--quiet", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["capacities"] == [64, 80] and [p["capacity_pages"] for p in data["points"]] == [4, 5]


@pytest.mark.parametrize("cap", ["80G", "1000G"])
def test_a_capacity_beyond_the_workload_is_capped_with_a_note(cap, mooncake_path, mooncake, tmp_path, capsys):
    from core.lab.optimal import Bounds
    from core.lab.replay import pool_pages_needed
    assert main(["sweep", "--trace", str(mooncake_path), "--limit", "50", "--capacities", f"{cap},400p",
                 "--policies", "lru,lfu", "--workers", "1", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    w = mooncake.slice(0, 50)
    b = Bounds(w, 512)
    need = pool_pages_needed(w, 512, distinct=b.distinct_pages)
    pages = int(cap[:-1]) * 10 ** 9 // 512
    assert f"note: {pages:,} pages exceed the {need:,} pages this workload can ever fill" in out
    data = json.loads((tmp_path / "results.json").read_text())
    big = [p for p in data["points"] if p["capacity_pages"] == pages]
    assert [p["pool_pages"] for p in big] == [need, need]
    assert [p["hit_tokens"] for p in big] == [b.infinite().hit_tokens] * 2 and all(p["evictions"] == 0 for p in big)


def test_a_block_trace_defaults_to_its_block_size_and_refuses_smaller_pages(mooncake_path, tmp_path, capsys):
    fails_fast(capsys, "--page-size 1 is smaller than this block trace's 512-token blocks",
               "--trace", str(mooncake_path), "--limit", "20", "--capacities", "4p", "--page-size", "1")
    assert main(["sweep", "--trace", str(mooncake_path), "--limit", "20", "--capacities", "40p", "--policies", "lru",
                 "--workers", "1", "--quiet", "--out", str(tmp_path / "a")]) == 0
    assert "page size 512 tokens: the trace's block size" in capsys.readouterr().out
    assert main(["sweep", "--trace", str(mooncake_path), "--limit", "20", "--capacities", "40p", "--policies", "lru",
                 "--workers", "1", "--quiet", "--page-size", "512", "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    assert a["page_size"] == 512 and a["points"] == [{**p, "seconds": a["points"][0]["seconds"]} for p in b["points"]]


def test_ctrl_c_with_two_workers_stops_at_once_without_a_traceback(mooncake_path, tmp_path):
    import os
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "core.lab", "sweep", "--trace", str(mooncake_path),
                          "--capacities", "1000p,2000p,4000p,6000p,12000p,24000p", "--policies", "lru,lfu,fifo,slru",
                          "--workers", "2", "--out", str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_sigint)
    try:
        assert "page size 512" in p.stdout.readline()     # the sweep is under way
        time.sleep(2.0)
        t = time.perf_counter()
        os.killpg(p.pid, signal.SIGINT)                  # what a terminal's Ctrl-C does: the whole group
        out, err = p.communicate(timeout=60)
        took = time.perf_counter() - t
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.rstrip().endswith("interrupted: the workers were stopped and nothing was written")
    assert took < 5.0, took
    assert not (tmp_path / "out" / "results.json").exists()


def _children(pid: int) -> list[int]:
    import pathlib
    out = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    import pathlib
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_sweep_process_alone_takes_its_workers_with_it(mooncake_path, tmp_path, sig):
    """`kill PID` (a supervisor, a CI cancel) reaches the main process only: its workers stayed, blocked on the
    pool's queues under PID 1, for ever. SIGTERM now unwinds as Ctrl-C does (exit 143); after SIGKILL, which
    nothing can catch, the workers die with their parent (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "core.lab", "sweep", "--trace", str(mooncake_path),
                          "--capacities", "1000p,2000p,4000p,6000p,12000p,24000p", "--policies", "lru,lfu,fifo,slru",
                          "--workers", "2", "--out", str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    workers: list[int] = []
    try:
        assert "page size 512" in p.stdout.readline()
        deadline = time.time() + 60
        while len(workers) < 2:                           # the pool's workers (and its resource tracker)
            assert time.time() < deadline and p.poll() is None
            time.sleep(0.2)
            workers = _children(p.pid)
        time.sleep(1.0)
        os.kill(p.pid, getattr(signal, sig))
        out, err = p.communicate(timeout=60)
        deadline = time.time() + 10
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], workers
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if sig == "SIGTERM":
        assert p.returncode == 143 and "Traceback" not in err, err
        assert err.rstrip().endswith("interrupted: the workers were stopped and nothing was written")
    assert not (tmp_path / "out" / "results.json").exists()


def test_with_a_model_the_csv_keeps_its_integer_columns_whole(tmp_path, capsys):
    """The bytes columns were added by rereading results.csv, which turned evictions 48 into 48.0; the
    optimum's blank hit_tokens where nothing fits turned every hit_tokens and tokens_saved into 50.0."""
    assert main(["sweep", *GSP, "--capacities", "8,64,128", "--policies", "lru", "--workers", "1", "--quiet",
                 "--model-config", "llama-3.1-8b", "--out", str(tmp_path)]) == 0
    lines = (tmp_path / "results.csv").read_text().splitlines()
    head = lines[0].split(",")
    assert "capacity_gib" in head
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        assert row["capacity_tokens"].isdigit() and row["capacity_pages"].isdigit(), row
        if row["policy"] == "lru":
            assert all(row[c].isdigit() for c in ("evictions", "evicted_tokens", "rejected", "requests")), row
        assert all(row[c].isdigit() or row[c] == "" for c in ("hit_tokens", "tokens_saved")), row
    assert any(line.startswith("optimal,8,") and ",,," in line for line in lines)      # nothing fits at 8: blank


def test_a_second_ctrl_c_while_the_first_unwinds_is_ignored():
    """The CLI's SIGINT handler (run() installs it): the first raises KeyboardInterrupt, later ones are ignored, so
    a second press during the workers' teardown no longer ends in a traceback and exit -2 (seen with a 200k-request
    trace: `sigint` twice 50 ms apart; after the change exit 130, one line)."""
    import os
    import signal
    import time
    from core.lab import __main__ as cli
    previous = signal.signal(signal.SIGINT, cli._first_ctrl_c_only)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGINT)           # ignored: nothing raised here
        time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_flags_the_trace_does_not_decide_fail_fast_naming_the_flag(capsys):
    fails_fast(capsys, "capacity '0' holds no tokens", *GSP, "--capacities", "0")
    fails_fast(capsys, "--ms-per-output-token must be a non-negative number of milliseconds, got -1.0", *GSP,
               "--capacities", "64", "--overlap", "--ms-per-output-token", "-1")
    assert main(["route", *GSP, "--capacity", "4k", "--concurrency", "0"]) == 2
    cap = capsys.readouterr()
    assert cap.err == "error: --concurrency must be at least 1 (requests in flight), got 0\n" and cap.out == ""


def test_a_tokenizer_that_is_not_on_this_machine_fails_at_once_with_what_to_give(tmp_path, capsys):
    """Offline, a hub name took 57 s of retries to fail; a folder without tokenizer files gave transformers'
    message about sentencepiece and tiktoken."""
    import time
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"text": "hello"}\n')
    for name in ("nobody/no-such-model-xyz", str(tmp_path)):
        t0 = time.perf_counter()
        assert main(["sweep", "--trace", str(trace), "--tokenizer", name, "--capacities", "8", "--workers", "1",
                     "--quiet"]) == 2
        assert time.perf_counter() - t0 < 20
        err = capsys.readouterr().err
        assert "no tokenizer there" in err and "tokenizer files" in err, err



def test_capacities_a_page_size_rounds_down_are_named_on_the_terminal(mooncake_path, tmp_path, capsys):
    assert main(["sweep", "--trace", str(mooncake_path), "--limit", "20", "--capacities", "1000,4k,8192",
                 "--policies", "lru", "--workers", "1", "--quiet", "--out", str(tmp_path)]) == 0
    assert ("note: a pool holds whole pages of 512 tokens, so capacities are rounded down: 1000 is 512 tokens, 4k is "
            "3,584 tokens\n") in capsys.readouterr().out
