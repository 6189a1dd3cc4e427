"""The size search: it agrees with a dense sweep of every capacity on small workloads, reports probes that
break monotonicity, bounds its answer by a probe that misses, and the `size` subcommand prints tokens and GiB."""
from __future__ import annotations

import json

import pytest

from core.lab.__main__ import main
from core.lab.optimal import Bounds
from core.lab.page_trace import NO_HITS_NOTE
from core.lab.replay import pool_pages_needed, replay
from core.lab.size import OPTIMAL, SizeAnswer, _violations, search, size
from core.lab.workloads import few_shot, generated_shared_prefix, multi_turn_chat

TARGET = 0.9


def small():
    return [
        generated_shared_prefix(num_groups=4, prompts_per_group=4, system_prompt_len=32, question_len=6,
                                output_len=4, order="shuffled", seed=3),
        few_shot(num_requests=16, num_tasks=3, examples_len=28, question_len=4, output_len=3, seed=1),
        multi_turn_chat(num_sessions=3, turns=3, system_prompt_len=12, user_len=4, output_len=6, seed=2),
    ]


def dense(f, hi):
    return {p: f(p) for p in range(1, hi + 1)}


def smallest_reaching(curve, goal):
    return min(p for p, h in curve.items() if h >= goal)


@pytest.mark.parametrize("ps", [1, 4])
def test_search_agrees_with_a_dense_sweep(ps):
    exact = 0
    for w in small():
        b = Bounds(w, ps)
        goal = TARGET * b.infinite().hit_tokens
        hi = pool_pages_needed(w, ps, distinct=b.distinct_pages)      # no policy evicts at or above it
        answers = {a.name: a for a in size(w, ["lru", "fifo"], TARGET, ps)}
        curves = {OPTIMAL: dense(lambda p: b.optimal(p * ps).hit_tokens, hi)}
        for pol in ("lru", "fifo"):
            curves[pol] = dense(lambda p: replay(w, p * ps, pol, ps).hit_tokens, hi)
        for name, curve in curves.items():
            a = answers[name]
            best = smallest_reaching(curve, goal)
            assert curve[a.capacity_pages] >= goal and a.hit_tokens == curve[a.capacity_pages], (w.name, name)
            assert a.lower_pages == 0 or curve[a.lower_pages] < goal
            assert a.capacity_pages - a.lower_pages <= max(1, int(0.01 * a.capacity_pages))
            assert all(a.probes[p] == curve[p] for p in a.probes)        # every probe is a real replay
            if not _violations(curve):                                    # monotone: the search is exact
                assert best <= a.capacity_pages <= best + max(1, int(0.01 * a.capacity_pages)), (w.name, name)
                exact += 1
        assert answers[OPTIMAL].capacity_pages <= min(answers[p].capacity_pages for p in ("lru", "fifo"))
        assert not _violations(curves[OPTIMAL])                           # Belady is a stack algorithm
    assert exact >= 3 * 2          # at least the optimum and one policy per workload were monotone and checked exactly


def test_search_is_within_one_percent_on_a_long_range():
    calls = []

    def f(p):
        calls.append(p)
        return p // 3

    found, lower, probes = search(f, goal=12_345, hi_max=1_000_000)
    assert found >= 3 * 12_345 and found <= 3 * 12_345 * 1.01 + 1 and f(lower) < 12_345
    assert len(set(calls)) <= 2 * 20 + 8          # a gallop and a bisection, not a scan
    assert search(f, goal=10 ** 9, hi_max=1000)[0] is None


def test_non_monotone_probes_are_reported():
    curve = {1: 0, 2: 5, 3: 9, 4: 7, 8: 10}
    assert _violations(curve) == [(3, 9, 4, 7)]
    a = SizeAnswer("fifo", 0.9, 9.0, 1, 3, 2, 9, 20, curve, _violations(curve))
    assert not a.monotone and "NOT MONOTONE: 3 tokens hit 9 but 4 hit only 7" in a.describe()
    assert a.to_dict()["monotone"] is False


def test_a_workload_with_nothing_to_hit_says_so():
    w = few_shot(num_requests=1, num_tasks=1, examples_len=8, question_len=2)
    out = size(w, ["lru"], TARGET, 1)
    assert all(a.capacity_pages is None and a.note == NO_HITS_NOTE for a in out)


def test_tokens_that_repeat_inside_a_page_are_still_nothing_to_hit():
    """Two requests share 3 examples tokens, less than a page of 4: tokens repeat, no whole page does."""
    w = few_shot(num_requests=2, num_tasks=1, examples_len=3, question_len=2)
    assert list(w.requests[0].prompt_ids()[:3]) == list(w.requests[1].prompt_ids()[:3])
    out = size(w, ["lru"], TARGET, 4)
    assert all(a.capacity_pages is None and a.note == NO_HITS_NOTE for a in out)


@pytest.mark.parametrize("target", [0, 1.5, float("nan"), True])
def test_bad_target(target):
    with pytest.raises(ValueError, match="--target must be a fraction in"):
        size(small()[0], ["lru"], target)


def test_size_subcommand_prints_tokens_and_gib(tmp_path, capsys):
    rc = main(["size", "--workload", "few-shot", "-p", "num_requests=24", "-p", "num_tasks=3", "-p", "examples_len=50",
               "-p", "question_len=6", "-p", "output_len=4", "--policies", "lru", "--page-size", "4", "--workers", "1",
               "--model-config", "llama-3.1-8b", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    w = few_shot(num_requests=24, num_tasks=3, examples_len=50, question_len=6, output_len=4)
    want = {a.name: a for a in size(w, ["lru"], TARGET, 4)}
    for name in (OPTIMAL, "lru"):
        t = want[name].capacity_tokens
        gib = t * 131072 / 2 ** 30
        assert gib < 1      # below 1 GiB the GiB are given to 3 significant digits (0.0146), not 2 decimals (0.01)
        assert f"{name}: {t:,} tokens = {t // 4:,} pages of 4 = {gib:.3g} GiB of Llama-3.1-8B KV" in out
    data = json.loads((tmp_path / "size.json").read_text())
    assert [a["policy"] for a in data["answers"]] == [OPTIMAL, "lru"]
    assert data["answers"][1]["capacity_bytes"] == want["lru"].capacity_tokens * 131_072


def test_size_subcommand_bad_input_exits_2(capsys):
    assert main(["size", "--workload", "few-shot", "--target", "2", "--workers", "1"]) == 2
    assert "--target must be a fraction" in capsys.readouterr().err
    assert main(["size", "--workload", "few-shot", "--kv-dtype", "fp8", "--workers", "1"]) == 2
    assert "--kv-dtype needs --model-config" in capsys.readouterr().err


def test_size_on_a_block_trace_defaults_to_its_block_size(mooncake_path, mooncake, tmp_path, capsys):
    assert main(["size", "--trace", str(mooncake_path), "--limit", "60", "--policies", "lru", "--workers", "1",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "page size 512 tokens: the trace's block size" in out
    want = size(mooncake.slice(0, 60), ["lru"], TARGET, 512)
    assert all("  " + a.describe() in out for a in want)
    data = json.loads((tmp_path / "size.json").read_text())
    assert data["page_size"] == 512 and [a["capacity_tokens"] for a in data["answers"]] == [a.capacity_tokens for a in want]
    assert main(["size", "--trace", str(mooncake_path), "--limit", "5", "--page-size", "64", "--workers", "1"]) == 2
    assert "--page-size 64 is smaller than this block trace's 512-token blocks" in capsys.readouterr().err
    (tmp_path / "f").write_text("")
    assert main(["size", "--workload", "few-shot", "--out", str(tmp_path / "f"), "--workers", "1"]) == 2
    cap = capsys.readouterr()
    assert "is a file; give a directory" in cap.err and "workload" not in cap.out     # before any work


def test_the_optimum_is_never_sized_below_the_smallest_request():
    """Six identical 10-token prompts (+4 output): a pool under 13 tokens rejects every request, and sweep blanks
    the optimum there; size answered "optimal: 5 tokens" from the page-level optimum's hits at 5 tokens."""
    from core.lab.workloads import TraceRequest, Workload
    w = Workload("same10", [TraceRequest(list(range(1, 11)), 4) for _ in range(6)])
    b = Bounds(w, 1)
    assert b.smallest_request_pages == 13 and b.optimal(5).hit_tokens == 0      # the old answer stood on hits here
    answers = {a.name: a for a in size(w, ["lru"], 0.5, 1)}
    opt, lru = answers[OPTIMAL], answers["lru"]
    assert opt.capacity_pages == 13 and opt.lower_pages == 12 and min(opt.probes) == 13
    assert lru.capacity_pages == 13
