"""Where nothing fits (every request is larger than the pool), every policy rejects every request and the lab
gives no optimum there: a blank row and a note, not the page-level optimum's hits that no such pool can have."""
from __future__ import annotations

import json
import math

from core.lab.__main__ import main
from core.lab.optimal import Bounds, smallest_request_pages
from core.lab.sweep import OPTIMAL, run_sweep
from core.lab.size import size_optimal
from core.lab.workloads import TraceRequest, Workload, few_shot, generated_shared_prefix

GSP = dict(num_groups=3, prompts_per_group=4, system_prompt_len=64, question_len=8, output_len=4, seed=2)


def test_the_smallest_request_is_its_prompt_and_output_minus_one_in_whole_pages():
    w = generated_shared_prefix(**GSP)            # every request: 64 + 8 prompt, 4 output -> 75 tokens held
    assert smallest_request_pages(w, 1) == 75 and smallest_request_pages(w, 16) == 5
    b = Bounds(w, 1)
    assert not b.anything_fits(74) and b.anything_fits(75)


def test_a_sweep_gives_no_optimum_where_every_policy_rejects_everything():
    w = generated_shared_prefix(**GSP)
    res = run_sweep(w, [74, 150], ["lru", "lfu"], workers=1)
    small = [p for p in res.points if p.capacity_tokens == 74]
    assert [(p.rejected, p.hit_tokens) for p in small] == [(12, 0), (12, 0)]
    assert res.unfit_capacities == [74] and [b.capacity_tokens for b in res.optimal] == [150]
    df = res.table()
    opt = df[(df.policy == OPTIMAL) & (df.capacity_tokens == 74)].iloc[0]
    assert math.isnan(opt["hit_rate"]) and math.isnan(opt["optimal_hit_rate"]) and math.isnan(opt["gap_to_optimal"])
    pol = df[(df.policy != OPTIMAL) & (df.capacity_tokens == 74)]
    assert pol["optimal_hit_rate"].isna().all() and pol["gap_to_optimal"].isna().all()
    assert (df[df.capacity_tokens == 150]["optimal_hit_rate"] == res.optimal[0].hit_rate).all()
    assert res.nothing_fits_note() == (
        "at 74 tokens nothing fits: the smallest request holds 75 tokens (prompt + output - 1, in whole pages), "
        "more than the pool, "
        "so every policy rejects every request there and no optimum is given (hit rate 0 is all any pool that "
        "small can do)")
    assert run_sweep(w, [75, 150], ["lru"], workers=1).nothing_fits_note() is None


def test_the_cli_prints_blank_optimum_cells_and_the_note_for_few_shot_at_2k(tmp_path, capsys):
    rc = main(["sweep", "--workload", "few-shot", "-p", "num_requests=16", "--capacities", "2k,8k",
               "--policies", "lru,lfu", "--workers", "1", "--quiet", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    held = smallest_request_pages(few_shot(num_requests=16), 1)       # 3,072 examples + a question + 31 output
    assert held > 2000
    assert (f"note: at 2,000 tokens nothing fits: the smallest request holds {held:,} tokens (prompt + output - 1, "
            "in whole pages), more than the pool, so every policy rejects every request there") in out
    row = next(ln for ln in out.splitlines() if ln.split()[:2] == [OPTIMAL, "2000"])
    # hit rate, optimum and gap are blank; the three <NA> are evictions, evicted tokens and rejected, as on every
    # optimum row
    assert row.split() == [OPTIMAL, "2000", "2000", "<NA>", "<NA>", "<NA>"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["no_optimum"]["capacities"] == [2000] and "nothing fits" in data["no_optimum"]["why"]
    assert [b["capacity_tokens"] for b in data["optimal"]] == [8000]
    csv = (tmp_path / "results.csv").read_text().splitlines()
    assert next(ln for ln in csv if ln.startswith(f"{OPTIMAL},2000,")).split(",")[3:6] == ["", "", ""]


def test_requests_larger_than_the_pool_give_the_optimum_no_hits_while_smaller_ones_run():
    """Ten 1,000-token requests sharing 900 tokens and ten unrelated 20-token ones: below 1,000 tokens every
    policy rejects the long ones, so nothing can hit. The optimum, admitting pages, had claimed 0.79 at 999."""
    shared = list(range(1000, 1900))
    reqs = []
    for i in range(10):
        reqs.append(TraceRequest(shared + [5000 + 100 * i + j for j in range(100)], output=[7]))
        reqs.append(TraceRequest([20000 + 20 * i + j for j in range(20)], output=[7]))
    w = Workload("big-and-small", reqs)
    b = Bounds(w, 1)
    assert b.anything_fits(999)                         # the small ones fit: the point is drawn
    assert b.optimal(999).hit_tokens == 0 and b.optimal(500).hit_tokens == 0
    assert b.optimal(1000).hit_tokens == 9 * 900         # each long one after the first hits the shared 900
    res = run_sweep(w, [999, 1000], ["lru"], workers=1)
    assert [(p.capacity_tokens, p.rejected, p.hit_tokens > 0) for p in res.points] == [(999, 10, False),
                                                                                        (1000, 0, False)]
    assert [b.hit_tokens for b in res.optimal] == [0, 8100]   # lru lets the 20-token ones push the prefix out
    assert size_optimal(b, 0.9).capacity_tokens == 1000
