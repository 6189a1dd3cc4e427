"""Fair scheduling: while a long prompt is prefilled in chunks, running decodes keep stepping, a short
request that arrives is admitted at the next step, and the chunk of a step shrinks while others decode
(step_budget.py) so their inter-token latency stays near its solo value. Outputs stay exact."""
from __future__ import annotations

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.engine.scheduler import INSERT_GROWTH
from core.engine.step_budget import (DECODE_WINDOW, FIRST_MIXED_TOKENS, FLOOR_FACTOR, FLOOR_STEPS, MIN_PREFILL_TOKENS,
                                      StepBudget)
from tests.tiny_models import reference_greedy, tiny_pair

LONG = [(7 * i) % 120 + 3 for i in range(400)]
SHORT = [5, 9, 2]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama")


def test_decodes_keep_stepping_while_a_long_prompt_is_prefilled_in_chunks(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=1024, max_prefill_tokens=64, mixed_step_ratio=0)
    stream = e.submit(SHORT, SamplingParams(max_new_tokens=30, ignore_eos=True))
    e.step()                                             # the stream's prefill; it decodes from now on
    long = e.submit(LONG, SamplingParams(max_new_tokens=3, ignore_eos=True))
    steps, tokens_during = 0, []
    while not long.done():
        before = len(stream.partial_ids()) if not stream.done() else None
        e.step()
        steps += 1
        if before is not None and not stream.done():
            tokens_during.append(len(stream.partial_ids()) - before)
    assert steps >= 400 // 64                            # the long prompt took several chunked steps
    assert tokens_during and set(tokens_during) == {1}   # and the stream got a token in every one of them
    while e.has_work():
        e.step()
    assert stream.result(0).token_ids == reference_greedy(ref, SHORT, 30)
    assert long.result(0).token_ids == reference_greedy(ref, LONG, 3)


def test_a_short_request_behind_a_long_prompt_is_admitted_at_the_next_step(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=1024, max_prefill_tokens=64, mixed_step_ratio=0)
    long = e.submit(LONG, SamplingParams(max_new_tokens=2, ignore_eos=True))
    e.step()
    e.step()                                             # two chunks in: 128 of 400 tokens computed
    short = e.submit(SHORT, SamplingParams(max_new_tokens=2, ignore_eos=True))
    e.step()
    assert len(short.partial_ids()) == 1                 # its prefill ran in the very next step: first token out
    assert not long.done()
    while e.has_work():
        e.step()
    assert short.result(0).token_ids == reference_greedy(ref, SHORT, 2)
    assert long.result(0).token_ids == reference_greedy(ref, LONG, 2)
    e.check_invariants()


def test_a_short_request_behind_two_long_prompts_is_admitted_at_the_next_step(pair):
    """The younger long prompt took the whole second half of each budget: the short one waited ~500 steps."""
    ref, runner = pair
    e = Engine(runner, pool_slots=2048, max_prefill_tokens=64, mixed_step_ratio=0)
    other = [(11 * i) % 120 + 4 for i in range(400)]
    longs = [e.submit(p, SamplingParams(max_new_tokens=2, ignore_eos=True)) for p in (LONG, other)]
    for _ in range(3):
        e.step()                                         # both admitted, both mid-prefill
    assert len(e.scheduler.running) == 2 and not any(h.partial_ids() for h in longs)
    short = e.submit(SHORT, SamplingParams(max_new_tokens=2, ignore_eos=True))
    e.step()
    assert len(short.partial_ids()) == 1 and not any(h.done() for h in longs)
    while e.has_work():
        e.step()
    got = [h.result(0).token_ids for h in [short] + longs]
    assert got == [reference_greedy(ref, p, 2) for p in (SHORT, LONG, other)]


def test_prompts_waiting_for_the_system_prompt_being_prefilled_take_no_budget_from_it(pair):
    """Three prompts sharing the prompt being prefilled are held back until it is cached (in-batch prefix
    sharing); the half of each step kept for waiting requests was kept for them too and went unused, so the
    shared prompt was prefilled at half speed: 64, 96, 128, ... instead of 64, 128, 192, ..."""
    ref, runner = pair
    progress = {}
    for sharers in (0, 3):
        e = Engine(runner, pool_slots=2048, max_prefill_tokens=64, mixed_step_ratio=0)
        first = e.submit(LONG[:256] + [1, 2, 3], SamplingParams(max_new_tokens=1))
        rest = [e.submit(LONG[:256] + [10 + i], SamplingParams(max_new_tokens=1)) for i in range(sharers)]
        progress[sharers] = []
        while not first.done():
            e.step()
            r = e.requests.get(first.rid)
            progress[sharers].append(len(r.prompt_ids) if r is None or first.done() else r.computed)
        while e.has_work():
            e.step()
        assert [h.result(0).token_ids for h in rest] == [reference_greedy(ref, LONG[:256] + [10 + i], 1)
                                                       for i in range(sharers)]
        assert [h.result(0).cached_tokens for h in rest] == [256] * sharers        # and they found it cached
        e.check_invariants()
    assert progress[3] == progress[0] == [64, 128, 192, 256, 259]


def test_a_short_prompt_admitted_in_part_behind_a_long_one_finishes_its_prefill_at_the_following_step(pair):
    """The short prompt (12 tokens) is larger than what waiting requests are owed (half of a 16-token
    budget), so it is admitted with a first chunk of 8 and becomes a chunked prefill itself. Its last 4
    tokens go before the long prompt's next chunk (shortest remaining first), not after the long prompt's
    remaining ~380 tokens; the long prompt still advances in that step."""
    ref, runner = pair
    e = Engine(runner, pool_slots=1024, max_prefill_tokens=16, mixed_step_ratio=0)
    long = e.submit(LONG, SamplingParams(max_new_tokens=2, ignore_eos=True))
    e.step()
    short_prompt = [(11 * i) % 100 + 4 for i in range(12)]
    short = e.submit(short_prompt, SamplingParams(max_new_tokens=2, ignore_eos=True))
    e.step()                                              # admitted: 8 of its 12 tokens, the long one 8 more
    assert short.partial_ids() == []
    e.step()                                              # its last 4 tokens: first token out
    assert len(short.partial_ids()) == 1
    assert e.scheduler.running and not long.done()
    computed = {len(r.fill_ids): r.computed for r in e.scheduler.running}
    assert computed[len(LONG)] == 16 + 8 + 12             # 16, then 8 (half owed to the short), then 16 - 4
    while e.has_work():
        e.step()
    assert short.result(0).token_ids == reference_greedy(ref, short_prompt, 2)
    assert long.result(0).token_ids == reference_greedy(ref, LONG, 2)
    e.check_invariants()


def test_the_long_prompt_still_advances_every_step_while_short_requests_keep_coming(pair):
    _, runner = pair
    e = Engine(runner, pool_slots=2048, max_prefill_tokens=64, max_running_requests=64, mixed_step_ratio=0)
    long = e.submit(LONG, SamplingParams(max_new_tokens=1, ignore_eos=True))
    e.step()
    steps = 1
    while not long.done():
        e.submit([steps] * 40, SamplingParams(max_new_tokens=1, ignore_eos=True))   # a 40-token arrival a step
        e.step()
        steps += 1
    # arrivals are owed at most half of the 64-token budget: the long prompt gets >= 32 tokens every step
    assert steps <= 1 + (400 - 64 + 31) // 32


def test_the_step_budget_keeps_a_mixed_step_near_ratio_decode_steps():
    b = StepBudget(max_tokens=2048, ratio=2.5)
    assert b.tokens(decoding=3) == 2048                  # nothing measured yet: the whole budget
    for _ in range(5):
        b.observe(0.020, prefill_tokens=0, decodes=3)    # a decode-only step: 20 ms
    assert b.decode_s == pytest.approx(0.020)
    assert b.tokens(decoding=3) == FIRST_MIXED_TOKENS    # before any mixed step: a small first cap
    b.observe(0.020 + 16 * 0.0005, prefill_tokens=16, decodes=3)     # each prefill token: 0.5 ms more
    assert b.tokens(decoding=3) == 32                    # would fit 60, grows at most 2x a step
    b.observe(0.020 + 32 * 0.0005, prefill_tokens=32, decodes=3)
    assert b.tokens(decoding=3) == int(1.5 * 0.020 / 0.0005) == 60   # 20 ms + 60 x 0.5 ms = 2.5 x 20 ms
    assert b.tokens(decoding=0) == 2048                  # nothing decodes: the whole budget
    assert StepBudget(max_tokens=2048, ratio=0, decode_s=0.02).tokens(5) == 2048   # 0: no cap


def test_the_step_budget_shrinks_the_chunk_as_the_prompt_grows():
    """Deep into a long prompt a token's attention costs more (more keys): each mixed step's measured cost per
    token sets the next cap, so the chunk shrinks and the mixed step stays at ~ratio decode steps; a very slow
    prefill still advances by MIN_PREFILL_TOKENS."""
    b = StepBudget(max_tokens=2048, ratio=2.5, decode_s=0.010)
    n = b.tokens(decoding=1)
    for keys in range(0, 6000, 250):
        per_token = 0.0004 + 0.0005 * keys / 1000        # 0.4 ms a token plus 0.5 ms per thousand keys
        b.observe(0.010 + n * per_token, prefill_tokens=n, decodes=1)
        n, before = b.tokens(decoding=1), n
        assert n == max(MIN_PREFILL_TOKENS, min(2 * before, int(0.015 / per_token + 1e-9)))
    assert n == int(0.015 / (0.0004 + 0.0005 * 5.75)) == 4
    b.observe(1.0, prefill_tokens=n, decodes=1)          # a very slow step
    assert b.tokens(decoding=1) == MIN_PREFILL_TOKENS


def test_where_even_the_smallest_mixed_step_breaks_the_ratio_the_chunk_grows_past_the_floor():
    """As measured on an H200: decode steps replay a CUDA graph (2.5 ms), a step carrying prefill runs eagerly
    (45 ms whatever its chunk, plus 5 us a token). No chunk keeps 2.5 decode steps; the cap falls to the floor,
    FLOOR_STEPS floor steps measure that fixed cost, and from then on a chunk may add (ratio - 1) decode steps on
    top of it: hundreds of tokens a step instead of 2 (a 6,000-token prompt took 35 s at the floor)."""
    b = StepBudget(max_tokens=2048, ratio=2.5)
    for _ in range(5):
        b.observe(0.0025, prefill_tokens=0, decodes=1)
    cost = lambda n: 0.045 + n * 5e-6   # noqa: E731
    caps = [b.tokens(decoding=1)]
    for _ in range(16):
        b.observe(cost(caps[-1]), prefill_tokens=caps[-1], decodes=1)
        caps.append(b.tokens(decoding=1))
    assert caps[:FLOOR_STEPS + 2] == [FIRST_MIXED_TOKENS] + [MIN_PREFILL_TOKENS] * FLOOR_STEPS + [4]
    assert b.floor_s() == pytest.approx(cost(2))
    # settled where the chunk adds 1.5 decode steps to the floor step: 5 us x (752 - 2) = 3.75 ms
    assert caps[-3:] == [752, 752, 752]
    assert cost(caps[-1]) == pytest.approx(b.floor_s() + 1.5 * 0.0025, rel=0.01)
    b.observe(0.0025, prefill_tokens=0, decodes=1)   # a decode-only step: between prompts, the floor is re-measured
    assert b.floor_s() is None


def test_with_floor_factor_one_a_floor_just_above_the_target_is_the_base():
    """Where decode steps replay CUDA graphs (the engine passes floor_factor 1): at batch 32 a graph decode step of
    8 ms against eager mixed steps of 70 ms is 3.5x the target, under FLOOR_FACTOR, yet the gap is the eager launch
    path, not the chunk: the floor is the base and the chunk grows."""
    caps = {}
    for factor in (FLOOR_FACTOR, 1.0):
        b = StepBudget(max_tokens=2048, ratio=2.5, decode_s=0.008, floor_factor=factor)
        n = MIN_PREFILL_TOKENS
        for _ in range(FLOOR_STEPS + 8):
            b.observe(0.070 + n * 2e-6, prefill_tokens=n, decodes=32)
            n = b.tokens(decoding=32)
        caps[factor] = n
    assert caps[FLOOR_FACTOR] == MIN_PREFILL_TOKENS
    assert caps[1.0] == 2 ** 10   # doubling from the floor, 8 steps after FLOOR_STEPS floor steps, toward 6,002


def test_a_floor_within_floor_factor_of_the_target_keeps_the_ratio_rule():
    """Floor steps above the target but within FLOOR_FACTOR of it (a CPU deep into a long prompt: 55 ms against
    2.5 x 9 ms): the cap stays the plain feedback on decode steps, at the floor."""
    b = StepBudget(max_tokens=2048, ratio=2.5, decode_s=0.009)
    for _ in range(FLOOR_STEPS + 3):
        b.observe(0.055, prefill_tokens=b.tokens(decoding=1), decodes=1)
    assert b.floor_s() == pytest.approx(0.055)
    assert 0.055 < FLOOR_FACTOR * 2.5 * 0.009
    assert b.tokens(decoding=1) == MIN_PREFILL_TOKENS


def test_one_slow_decode_step_does_not_loosen_the_cap():
    """A decode step's cost is the median of the recent ones: one step slowed by something else on the machine
    (here 0.5 s) must not raise the mixed-step target for the whole of the next long prefill."""
    b = StepBudget(max_tokens=2048, ratio=2.5)
    for seconds in [0.020] * 10 + [0.500] + [0.020] * 2:
        b.observe(seconds, prefill_tokens=0, decodes=1)
    assert b.decode_s == pytest.approx(0.020)


def test_a_burst_of_slowed_decode_steps_before_a_long_prompt_does_not_loosen_the_cap():
    """As measured through the server: the client building a 6,000-token request and the server admitting it slowed
    the 15 decode steps before the prompt's first chunk from 9 ms to 14-31 ms. The median of the last 16 took that
    burst for the decode cost (17 ms) and every mixed step of the prefill aimed at 2.5 x 17 ms."""
    b = StepBudget(max_tokens=2048, ratio=2.5)
    burst = [0.014, 0.017, 0.022, 0.019, 0.018, 0.019, 0.023, 0.021, 0.016, 0.024, 0.014, 0.031, 0.012, 0.020, 0.025]
    for seconds in [0.009] * 20 + burst:
        b.observe(seconds, prefill_tokens=0, decodes=1)
    assert b.decode_s == pytest.approx(0.009)
    b.observe(0.009 + 16 * 0.001, prefill_tokens=16, decodes=1)   # 1 ms a prefill token
    assert b.tokens(decoding=1) == int(1.5 * 0.009 / 0.001) == 13


def test_a_lasting_change_in_the_decode_cost_is_followed_within_the_window():
    """At one batch, a lasting rise (the machine slower for good) is the cost after 3/4 of DECODE_WINDOW steps; a
    fall after a quarter of it."""
    b = StepBudget(max_tokens=2048, ratio=2.5)
    for _ in range(DECODE_WINDOW):
        b.observe(0.010, prefill_tokens=0, decodes=1)
    for _ in range(DECODE_WINDOW * 3 // 4):
        assert b.decode_s == pytest.approx(0.010)
        b.observe(0.030, prefill_tokens=0, decodes=1)
    assert b.decode_s == pytest.approx(0.030)
    for _ in range(DECODE_WINDOW // 4 + 1):
        b.observe(0.005, prefill_tokens=0, decodes=1)
    assert b.decode_s == pytest.approx(0.005)


def test_each_batch_has_its_own_decode_cost():
    """A 16-request decode step costs more than a 1-request one: a mixed step with 16 decodes is measured against
    16 decodes' step. Against the 1-request step its decodes would read as dear prefill tokens (cap 3, not 30)."""
    b = StepBudget(max_tokens=2048, ratio=2.5)
    for _ in range(20):
        b.observe(0.010, prefill_tokens=0, decodes=1)
        b.observe(0.040, prefill_tokens=0, decodes=16)
    assert (b.decode_cost(1), b.decode_cost(16)) == (pytest.approx(0.010), pytest.approx(0.040))
    assert b.decode_cost(12) == pytest.approx(0.040) and b.decode_cost(4) == pytest.approx(0.010)   # the nearest
    b.observe(0.040 + 16 * 0.002, prefill_tokens=16, decodes=16)   # 2 ms a prefill token
    assert b.tokens(decoding=16) == int(1.5 * 0.040 / 0.002) == 30


def test_chunked_and_whole_prefill_give_the_same_tokens_with_the_budget_on(pair):
    ref, runner = pair
    for budget in (16, 64, 2048):
        e = Engine(runner, pool_slots=1024, max_prefill_tokens=budget)
        hs = [e.submit(LONG, SamplingParams(max_new_tokens=4, ignore_eos=True)),
              e.submit(SHORT, SamplingParams(max_new_tokens=12, ignore_eos=True))]
        while e.has_work():
            e.step()
        assert hs[0].result(0).token_ids == reference_greedy(ref, LONG, 4)
        assert hs[1].result(0).token_ids == reference_greedy(ref, SHORT, 12)


def test_a_long_prompt_in_tiny_chunks_enters_the_tree_in_few_nodes_and_whole_at_its_end(pair):
    """Chunks of 2 tokens (what the fairness cap gives a long prompt beside a stream): mid-prompt, new tokens
    enter the tree once they are 1/INSERT_GROWTH of what it holds of the prompt, so the request's path stays
    short (a node per chunk was a chain every later chunk walked 4 times), lags by at most that share, and the
    prefill's end inserts the rest. Outputs stay exact; the slots the tree does not hold yet are the request's."""
    ref, runner = pair
    e = Engine(runner, pool_slots=1024, max_prefill_tokens=2, mixed_step_ratio=0)
    long = e.submit(LONG, SamplingParams(max_new_tokens=3, ignore_eos=True))
    req = e.requests.get(long.rid)
    while not long.partial_ids():
        e.step()
        e.check_invariants()
        if not long.partial_ids():
            assert req.computed - req.tree_len <= max(2, req.tree_len // INSERT_GROWTH + 1)
    path, node = 0, req.last_node
    while node is not e.cache.root_node:
        path, node = path + 1, node.parent
    assert req.tree_len == len(LONG)                     # the whole prompt is in the tree from its last chunk
    assert path == len(e.snapshot().cache.nodes) - 1     # one chain: the prompt's nodes
    assert path <= 64 + 64 * 2                           # 200 chunks; 64 + 64 ln(400 / 128) ~ 137 nodes
    while e.has_work():
        e.step()
    assert long.result(0).token_ids == reference_greedy(ref, LONG, 3)
    e.check_invariants()


def test_a_capped_mixed_step_fills_the_rows_the_int8_kernel_computes_anyway():
    """The int8 FMA kernel runs 3 or more rows in blocks of 4: beside one decode, a prefill held to 2 tokens (3
    rows) takes 3 (4 rows) for the same projections; 5-8 rows fill to 8; 9-11 to 11 where the CPU has AMX (from
    12 the tiles run, flat in price) and to 12 where it has not (the weight panels take over from 32 rows). With
    a16 (w8a16_gemm: VNNI or AVX2, AMX or not) rows go in pairs. fp32 computes row by row: nothing to fill."""
    from core.engine.model.native_int8 import gemv_blocks
    from core.engine.model.native_linear import AMX_MIN_ROWS, PANEL_MIN_ROWS, many_rows
    from core.engine.model.runner import ModelRunner
    from tests.engine.model.require_kernels import require_kernels
    from tests.tiny_models import CONFIGS
    from transformers import AutoModelForCausalLM
    require_kernels()
    ref, fp32 = tiny_pair("llama")
    assert [fp32.rows_computed(n) for n in range(1, 12)] == list(range(1, 12))
    runner = ModelRunner.from_hf(AutoModelForCausalLM.from_config(CONFIGS["llama"]()).eval(), device="cpu",
                                 numerics="int8")
    nine_to_eleven = {AMX_MIN_ROWS: 11, PANEL_MIN_ROWS: 12}[many_rows(runner.native.a16)]
    blocks = gemv_blocks(CONFIGS["llama"]().hidden_size)   # built without AVX-512: w8_gemv row by row, no blocks
    if runner.native.a16:   # w8a16_gemm: rows in pairs, an odd count fills to the next even one
        assert [runner.rows_computed(n) for n in range(1, 12)] == [2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12]
    elif not blocks:        # AVX2: a row costs a row, nothing to fill
        assert [runner.rows_computed(n) for n in range(1, 12)] == list(range(1, 12))
    else:
        assert [runner.rows_computed(n) for n in range(1, 12)] == [1, 2, 4, 4, 8, 8, 8, 8] + [nine_to_eleven] * 3
    # ratio 1: a mixed step may take no more than a decode step, so after the first (FIRST_MIXED_TOKENS) the cap
    # sits at its floor, MIN_PREFILL_TOKENS = 2, for the whole prompt
    e = Engine(runner, pool_slots=1024, max_prefill_tokens=64, mixed_step_ratio=1.0)
    stream = e.submit(SHORT, SamplingParams(max_new_tokens=300, ignore_eos=True))
    for _ in range(3):
        e.step()
    long = e.submit(LONG, SamplingParams(max_new_tokens=3, ignore_eos=True))
    chunks = []
    while not long.partial_ids():
        before = e.metrics.prefill_computed
        e.step()
        chunks.append(e.metrics.prefill_computed - before)
    # the first mixed chunk: FIRST_MIXED_TOKENS + 1 decode = 17 rows, on the tiles with AMX; without, the FMA
    # kernel's blocks of 4 make it 20 rows, so the prompt fills 19 of them (a16's pairs: 18 rows, 17)
    # (AVX2, no blocks: the first cap, then the floor itself)
    first = 17 if runner.native.a16 else {AMX_MIN_ROWS: FIRST_MIXED_TOKENS, PANEL_MIN_ROWS: 19}[many_rows(False)]
    fill = 3   # 1 decode + 3 prompt tokens: one block of 4 rows (a16: 2 pairs)
    if not runner.native.a16 and not blocks:
        first, fill = FIRST_MIXED_TOKENS, MIN_PREFILL_TOKENS
    assert chunks[0] == first
    assert set(chunks[1:-1]) == {fill} and 1 <= chunks[-1] <= fill
    assert not stream.done()
    while e.has_work():
        e.step()
    e.check_invariants()
    assert len(long.result(0).token_ids) == 3 and len(stream.result(0).token_ids) == 300


def test_the_filled_rows_never_pass_max_prefill_tokens():
    """A fill is a cheaper chunk, not a bigger budget: with max_prefill_tokens 3 beside 3 decodes (rows 5 -> 8 would
    ask for 5 tokens) a step still carries at most 3 prefill tokens."""
    from core.engine.model.runner import ModelRunner
    from core.engine.model.native_int8 import gemv_blocks
    from tests.engine.model.require_kernels import require_kernels
    from tests.tiny_models import CONFIGS
    from transformers import AutoModelForCausalLM
    require_kernels()
    runner = ModelRunner.from_hf(AutoModelForCausalLM.from_config(CONFIGS["llama"]()).eval(), device="cpu",
                                 numerics="int8")
    e = Engine(runner, pool_slots=1024, max_prefill_tokens=3, mixed_step_ratio=1.0)   # the cap at its floor, 2
    streams = [e.submit([5 + i, 9, 2], SamplingParams(max_new_tokens=100, ignore_eos=True)) for i in range(3)]
    while not all(s.partial_ids() for s in streams):
        e.step()
    for _ in range(2):
        e.step()                                         # decode-only steps: measured, so the cap applies
    long = e.submit(LONG[:60], SamplingParams(max_new_tokens=2, ignore_eos=True))
    chunks = []
    while not long.partial_ids():
        before = e.metrics.prefill_computed
        e.step()
        chunks.append(e.metrics.prefill_computed - before)
    if not runner.native.a16 and not gemv_blocks(CONFIGS["llama"]().hidden_size):
        # built without AVX-512: rows one by one, no block to fill; the first cap, then the floor
        assert chunks[0] == 3 and set(chunks[1:-1]) == {MIN_PREFILL_TOKENS} and chunks[-1] <= MIN_PREFILL_TOKENS
    else:
        assert set(chunks[:-1]) == {3} and chunks[-1] <= 3
    for h in [long] + streams:
        e.abort(h.rid)
    e.check_invariants()
