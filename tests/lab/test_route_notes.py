"""`python -m core.lab route` explains one-sided routing: cache_aware (as sglang-router 0.3 does) and prefix_hash
can put all of a shared-prefix workload on one replica, and the output says why instead of leaving a bare 4.00."""
from __future__ import annotations

import json

from core.lab.__main__ import main
from core.lab.route_cli import one_sided_notes
from core.lab.routing import RouterConfig

ARGS = ["route", "--workload", "multi-turn-chat", "-p", "num_sessions=4", "-p", "turns=2", "-p", "system_prompt_len=64",
        "-p", "user_len=16", "-p", "output_len=8", "--capacity", "2000", "--replicas", "1,2"]


def notes_of(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("note:")]


def test_cache_aware_on_one_replica_is_explained_as_the_routers_own_behaviour(capsys):
    assert main(ARGS + ["--routing", "round_robin,cache_aware"]) == 0
    out = capsys.readouterr().out
    row = next(ln.split() for ln in out.splitlines() if ln.split()[:2] == ["2", "cache_aware"])
    assert row[-3:] == ["8", "0", "2.00"]           # 8 requests, all on the first replica
    assert notes_of(out) == [
        "note: cache_aware sent 8 of 8 requests to one replica at 2 replicas (imbalance 2.00): a request either "
        "follows its prefix to the replica that got it (a match above the cache threshold 0.3) or, matching less, "
        "goes to the least loaded replica, the first among equals, and the loads never differ by more than the "
        "balance threshold (64 requests in flight) that would move it; sglang-router's cache_aware does the same "
        "with this traffic. A lower --balance-abs-threshold or more concurrency (--concurrency, --overlap) "
        "spreads it."]


def test_prefix_hash_on_one_replica_names_the_shared_first_tokens(capsys):
    assert main(ARGS + ["--routing", "prefix_hash", "--prefix-tokens", "32"]) == 0
    assert notes_of(capsys.readouterr().out) == [
        "note: prefix_hash sent 8 of 8 requests to one replica at 2 replicas (imbalance 2.00): their first 32 tokens "
        "are the same, so they hash to the same replica; a larger --prefix-tokens spreads them."]


def test_even_routing_prints_no_note(capsys):
    assert main(ARGS + ["--routing", "round_robin,least_load"]) == 0
    assert notes_of(capsys.readouterr().out) == []


def test_a_mild_imbalance_or_a_single_replica_is_not_called_one_sided():
    base = {"routing": "cache_aware", "requests_per_replica": [5, 3]}
    rows = [dict(base, replicas=2, load_imbalance=1.5), dict(base, replicas=1, load_imbalance=1.0)]
    assert one_sided_notes(rows, RouterConfig()) == []
    assert len(one_sided_notes(rows + [dict(base, replicas=2, load_imbalance=1.51)], RouterConfig())) == 1


def test_a_capacity_in_bytes_says_route_takes_tokens_or_pages(capsys):
    """It said "give a model (--model-config ...)", a flag route does not have."""
    args = [a if a != "2000" else "5GiB" for a in ARGS]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --capacity '5GiB' is in bytes; route takes tokens") and "Traceback" not in err


def test_requests_larger_than_a_replica_are_counted_as_rejected_and_no_optimum_claims_hits(capsys, tmp_path):
    args = [a if a != "2000" else "40" for a in ARGS] + ["--routing", "round_robin", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:2] in (["1", "round_robin"], ["2", "round_robin"])]
    # replicas, routing, hit rate, one cache, rejected (no optimum: no request fits one cache of 40 or 80 tokens)
    assert [r[:5] for r in rows] == [["1", "round_robin", "0.0000", "0.0000", "8"],
                                     ["2", "round_robin", "0.0000", "0.0000", "8"]]
    assert notes_of(out) == [
        "note: every request found no room in a replica's pool of 40 tokens (round_robin at 1 replica) and was "
        "rejected, counted with no hits; the smallest request holds 87 tokens (prompt + output - 1, in whole "
        "pages): a larger "
        "--capacity serves them",
        "note: no optimum where one cache of all replicas' capacity holds no request either"]
    saved = json.loads((tmp_path / "route.json").read_text())["rows"]
    assert [(r["rejected"], r["rejected_per_replica"], r["single_cache_optimum"]) for r in saved] == \
        [(8, [8], None), (8, [4, 4], None)]


def test_a_bad_capacity_is_refused_before_the_trace_is_read(capsys, tmp_path):
    assert main(["route", "--trace", str(tmp_path / "not-read.jsonl"), "--capacity", "200x", "--replicas", "1"]) == 2
    err = capsys.readouterr().err
    assert "200x" in err and "not-read.jsonl" not in err
