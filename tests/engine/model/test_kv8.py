"""The int8 KV pool (kv8_attention.c, core/engine/model/kv8.py, KVPool(dtype=torch.int8)): K and V stored as int8
with one fp32 scale per (slot, head) row, attended in exact integer sums. Checked here: the C store writes the bits
KVPool.set_kv writes in torch; a query row's result is the same bits decoded, prefilled whole or in any chunks, on
any thread count; the attention is fp32 attention on the dequantized pool to ~1 %, within the pool's own error;
a NaN stays in its request;
the model's greedy tokens are the same with the radix cache on and off; bad input is refused with what to
change."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from core.cache.kv_pool import KVPool, quantize_int8
from core.engine.engine import Engine
from core.engine.inputs import pool_bytes
from core.engine.model import kv8, native_kernels
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.native_llama import NativeLlama
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from tests.engine.model.require_kernels import require_kernels
from tests.engine.model.test_decode_layers import counted, make_ref
from tests.engine.model.test_one_order import two_turns

H, KVH, D = 9, 3, 64
SCALE = D ** -0.5
D64 = dict(hidden_size=384, num_attention_heads=6, num_key_value_heads=2)   # head_dim 64, 3 query heads a group


def require_kv8() -> None:
    """The kernels built with AVX512-VNNI or AVX2 alone, or (elsewhere) the int8 pool refused with what to use instead."""
    require_kernels()
    if kv8.kv8_fits(torch.device("cpu"), H, KVH, D):
        return
    with pytest.raises(ValueError, match="AVX512-VNNI"):
        NativeLlama.from_hf(make_ref(0, **D64), dtype="int8", kv_dtype="int8")
    assert NativeLlama.from_hf(make_ref(0, **D64), dtype="int8").kv_dtype is torch.float32
    pytest.skip("built with neither AVX512-VNNI nor AVX2 alone: the int8 pool is refused, and int8 keeps an fp32 pool")


def filled(m: int, seed: int = 0, pool_slots: int = 3000) -> tuple[KVPool, torch.Tensor]:
    """One layer of an int8 pool holding m keys at scattered slots (an outlier channel in K, as real K has)."""
    g = torch.Generator().manual_seed(seed)
    pool = KVPool(1, pool_slots, KVH, D, dtype=torch.int8)
    slots = torch.randperm(pool_slots, generator=g)[:m] + 1
    k = torch.randn(m, KVH, D, generator=g) * 2
    k[:, :, 5] *= 20
    pool.set_kv(0, slots, k, torch.randn(m, KVH, D, generator=g))
    return pool, slots


def layer(pool: KVPool) -> tuple:
    return pool.k_buffer[0], pool.v_buffer[0], pool.k_scale[0], pool.v_scale[0]


def test_the_c_store_writes_the_bits_kvpool_set_kv_writes_in_torch():
    require_kv8()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, KVH, D, generator=g) * torch.rand(40, KVH, 1, generator=g) * 10
    x[0, 0] = 0                                   # a zero row: scale 0, values 0
    x[1, 1, 7] = float("nan")                     # not finite: scale NaN, values 0
    x[2, 2, 0] = float("-inf")
    x[3, 0] = 1e-41                               # subnormal values: still quantized
    x[4, 1] = torch.arange(D) - 31.5              # ties at .5 after scaling go to even
    slots = torch.randperm(100, generator=g)[:40] + 1
    pool = KVPool(1, 100, KVH, D, dtype=torch.int8)
    kv8.kv8_store(x, pool.k_buffer[0], pool.k_scale[0], slots)
    q, s = quantize_int8(x)
    assert torch.equal(pool.k_buffer[0, slots], q)
    got = pool.k_scale[0, slots]
    assert torch.equal(torch.isnan(got), torch.isnan(s)) and bool(torch.isnan(got[1, 1]) and torch.isnan(got[2, 2]))
    ok = ~torch.isnan(s)
    assert torch.equal(got[ok].view(torch.int32), s[ok].view(torch.int32))
    assert got[0, 0] == 0 and not q[0, 0].any() and not q[1, 1].any() and got[3, 0] > 0
    assert int(q.abs().max()) == 127


def test_attention_is_fp32_attention_over_the_dequantized_pool_to_about_the_pools_own_error():
    """int8 queries (as K's rows) and int16 softmax weights: ~1 % of the output's norm, less than storing K and V as
    int8 already moves it from fp32 attention over the original K/V (measured 1.04-1.35x that error alone)."""
    require_kv8()
    g = torch.Generator().manual_seed(5)
    m, n = 1000, 100
    k = torch.randn(m, KVH, D, generator=g) * 2
    k[:, :, 5] *= 5                                   # an outlier channel, as real K has
    v = torch.randn(m, KVH, D, generator=g)
    pool = KVPool(1, m + 8, KVH, D, dtype=torch.int8)
    slots = torch.randperm(m + 8, generator=g)[:m] + 1
    pool.set_kv(0, slots, k, v)
    q = torch.randn(n, H, D, generator=g)
    out = kv8.kv8_attention(q, *layer(pool), slots, SCALE)
    mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)

    def attention(kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk.transpose(0, 1)[None],
                                              vv.transpose(0, 1)[None], attn_mask=mask, scale=SCALE,
                                              enable_gqa=True)[0].transpose(0, 1)

    stored = attention(pool.k_values(slots)[0], pool.v_buffer[0, slots].float() * pool.v_scale[0, slots][..., None])
    exact = attention(k, v)
    rel = lambda a, b: float((a - b).norm() / b.norm())   # noqa: E731
    assert 1e-4 < rel(out, stored) < 0.02
    assert rel(out, exact) < 1.5 * rel(stored, exact)


@pytest.fixture
def restore_threads(request):
    previous = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(previous))


@pytest.mark.parametrize("m", [1, 40, 1300])
def test_a_row_is_the_same_bits_decoded_or_prefilled_whole_or_in_chunks_on_any_threads(m, restore_threads):
    require_kv8()
    pool, slots = filled(m, seed=m)
    n = min(m, 70)
    q = torch.randn(n, H, D, generator=torch.Generator().manual_seed(m))
    whole = kv8.kv8_attention(q, *layer(pool), slots, SCALE)
    # chunks of 1-5 tokens (3-15 rows: read in place on AVX2 up to FEW_MAX = 12, RB = 4 rows at a time) and
    # longer ones (the transposed block), all against the whole prompt
    cuts = sorted({0, n, *[c for c in (1, 3, 6, 10, 15, 33, 40, 69) if c < n]})
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        chunks = torch.cat([kv8.kv8_attention(q[a:b], *layer(pool), slots[: m - n + b], SCALE)
                            for a, b in zip(cuts, cuts[1:])])
        assert torch.equal(chunks, whole), threads
        lens = torch.arange(m - n + 1, m + 1)
        decoded = kv8.kv8_decode(q, *layer(pool), slots[None].expand(n, m).contiguous(), lens, SCALE)
        assert torch.equal(decoded, whole), threads


def bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 values as their bits (NaN payloads included), for equality that holds for NaN rows too"""
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("d,heads,kv_heads", [(64, 9, 3), (128, 8, 2), (64, 4, 1), (64, 8, 4), (64, 16, 8),
                                            (64, 10, 5)])
def test_keys_in_one_run_of_slots_give_the_bits_they_give_at_scattered_slots(d, heads, kv_heads, restore_threads):
    """A pool allocated in order holds a request's keys in one run of slots: few rows (decode rows, chunks of up to 4
    tokens) then find a block's rows by arithmetic, ask for them as one span, ask for the next block's lines while
    the block runs (unpack_keys, ahead8), and split a full block's scales into heads by vectors (split_scales: 1, 2,
    3 and 4 KV heads; 5 and 8 copy them one by one). The same keys at scattered slots take the per-key path, and at
    slots in runs broken every few keys both, block by block: the same bits everywhere. Contexts from 1 key to
    past a segment (512 keys), so a run ends inside a block, at a segment's end and at the context's end; short
    contexts split work items by head (the run of one head is not one span)."""
    require_kv8()
    g = torch.Generator().manual_seed(d + heads)
    m = 1500
    k, v = torch.randn(m, kv_heads, d, generator=g) * 2, torch.randn(m, kv_heads, d, generator=g)
    k[700, 0, 3] = float("nan")   # one NaN key: rows that see it are NaN in every layout
    run = torch.arange(1, m + 1)
    scattered = torch.randperm(m + 200, generator=g)[:m] + 1
    broken = run + torch.arange(m) // 37 * 5   # runs of 37 slots, 5 skipped between
    q = torch.randn(4, heads, d, generator=g) * 3
    scale = d ** -0.5
    outs = {}
    for name, slots in (("run", run), ("scattered", scattered), ("broken", broken)):
        pool = KVPool(1, int(slots.max()) + 1, kv_heads, d, dtype=torch.int8)
        pool.set_kv(0, slots, k, v)
        parts = (pool.k_buffer[0], pool.v_buffer[0], pool.k_scale[0], pool.v_scale[0])
        for threads in (1, 2):
            torch.set_num_threads(threads)
            lens = torch.tensor([1, 64, 65, 130, 512, 699, 700, 1100, m])
            rows = q[torch.arange(lens.numel()) % 4]
            decode = kv8.kv8_decode(rows, *parts, slots[None].expand(lens.numel(), m).contiguous(), lens, scale)
            chunks = [kv8.kv8_attention(q[:n], *parts, slots[:c], scale) for n, c in ((4, 600), (2, 65), (3, 1100))]
            outs[name, threads] = [decode, *chunks]
    first = outs["run", 1]
    for key, got in outs.items():
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, first)), key
    decode = first[0]
    assert bool(torch.isnan(decode[7:, :heads // kv_heads]).all()) and bool(torch.isfinite(decode[:7]).all())


@pytest.mark.parametrize("d,heads,kv_heads,m", [(64, 9, 3, 700), (128, 8, 2, 300), (256, 7, 1, 150), (64, 16, 1, 200),
                                                (192, 12, 3, 90)])
def test_a_prompt_chunks_many_rows_are_the_same_bits_on_amx_tiles_as_on_avx512(d, heads, kv_heads, m, request):
    """Where the CPU has AMX-INT8, a chunk's rows past FEW_MAX (12) run on tiles (kv8_amx_block.h); set_amx(False)
    or kv8.set_tiles(False) runs them on the AVX-512 kernels. Chunks of 1-70 tokens, shuffled slots, a NaN key, a zero value row, a zero
    query, and decode rows of 16 query heads a group (16 rows a KV head: tiles too): the same bits either way."""
    require_kv8()
    request.addfinalizer(lambda: native_kernels.set_amx(True))
    # built as w8a16_amx_gemm is (AVX512-VNNI and AMX-INT8), on a CPU that has the tiles
    assert kv8.tiles_here() == bool(native_kernels.built().w8a16_amx_ready())
    assert not kv8.tiles_here() or "amx_int8" in native_kernels.cpu_flags().split()
    g = torch.Generator().manual_seed(d + heads + m)
    pool = KVPool(1, m + 40, kv_heads, d, dtype=torch.int8)
    slots = torch.randperm(m + 39, generator=g)[:m] + 1
    k, v = torch.randn(m, kv_heads, d, generator=g) * 2, torch.randn(m, kv_heads, d, generator=g)
    k[m // 3, 0, 1], v[m // 2] = float("nan"), 0.0
    pool.set_kv(0, slots, k, v)
    parts = (pool.k_buffer[0], pool.v_buffer[0], pool.k_scale[0], pool.v_scale[0])
    n = min(m, 70)
    q = torch.randn(n, heads, d, generator=g) * 3
    q[7] = 0.0
    scale = d ** -0.5
    cuts = [0, 5, 18, 50, n]

    def run() -> list[torch.Tensor]:
        outs = [kv8.kv8_attention(q[a:b], *parts, slots[: m - n + b], scale) for a, b in zip(cuts, cuts[1:])]
        outs.append(kv8.kv8_attention(q, *parts, slots, scale))
        lens = torch.tensor([m, m // 2, 1])
        outs.append(kv8.kv8_decode(q[:3], *parts, slots[None].expand(3, m).contiguous(), lens, scale))
        return outs

    tiles = run()
    native_kernels.set_amx(False)
    assert not kv8.tiles_here()
    fma = run()
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(tiles, fma))
    native_kernels.set_amx(True)   # the pool's tiles alone off: the projections' tiles untouched
    assert kv8.set_tiles(False) is True and not kv8.tiles_here()
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(run(), fma))
    assert kv8.set_tiles(True) is False
    whole, group, first = tiles[-2], heads // kv_heads, max(0, m // 3 - (m - n))   # the NaN key's first row
    assert bool(torch.isnan(whole[first:, :group]).all()) and bool(torch.isfinite(whole[:first]).all())
    assert bool(torch.isfinite(whole[:, group:]).all())
    assert torch.equal(bits(torch.cat(tiles[:4])), bits(tiles[4]))   # chunked == whole


def test_many_threads_at_once_get_their_own_rows_bits_while_the_tiles_switch_on_and_off():
    """Six Python threads (each its own OpenMP team, each thread its own tile configuration) attend chunks of 40-47
    tokens (tiles where the CPU has them) over their own pools, one of them switching kv8.set_tiles on and off under
    the others: every output is the bits it has alone."""
    require_kv8()
    cases = []
    for i in range(8):
        pool, slots = filled(300 + 97 * i, seed=i, pool_slots=1200)
        q = torch.randn(40 + i, H, D, generator=torch.Generator().manual_seed(i))
        cases.append((q, layer(pool), slots, kv8.kv8_attention(q, *layer(pool), slots, SCALE)))
    wrong: list[tuple[int, int]] = []

    def work(k: int) -> None:
        for r in range(12):
            q, parts, slots, alone = cases[(k + r) % len(cases)]
            if k == 0:
                kv8.set_tiles(r % 2 == 1)
            if not torch.equal(bits(kv8.kv8_attention(q, *parts, slots, SCALE)), bits(alone)):
                wrong.append((k, r))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        kv8.set_tiles(True)
    assert wrong == []


def test_a_nan_in_one_requests_keys_stays_in_that_request():
    require_kv8()
    pool, slots = filled(600)
    q = torch.randn(2, H, D, generator=torch.Generator().manual_seed(1))
    table = torch.stack([slots[:300], slots[300:]])
    lens = torch.tensor([300, 300])
    alone = kv8.kv8_decode(q[1:], *layer(pool), table[1:].contiguous(), lens[1:], SCALE)
    bad = torch.randn(1, KVH, D)
    bad[0, 1, 3] = float("nan")
    pool.set_kv(0, slots[10:11], bad, torch.randn(1, KVH, D))
    out = kv8.kv8_decode(q, *layer(pool), table, lens, SCALE)
    assert bool(torch.isnan(out[0, 3:6]).all()) and bool(torch.isfinite(out[0, :3]).all())   # head group 1 only
    assert torch.equal(out[1:], alone)


@pytest.mark.parametrize("at", [5, 63, 64, 130])
def test_a_nan_key_or_value_changes_no_row_before_it(at):
    """A token whose K and V are NaN (stored: scale NaN, values 0) is a future key to the rows before it: they
    come out the bits they have when the chunk ends before it, in its block or the next."""
    require_kv8()
    pool, slots = filled(200, seed=at)
    q = torch.randn(40, H, D, generator=torch.Generator().manual_seed(at))
    m0 = max(0, at - 20)                           # the chunk's 40 rows: positions m0 .. m0 + 39, `at` among them
    before = kv8.kv8_attention(q[: at - m0], *layer(pool), slots[:at], SCALE)
    nan = torch.full((1, KVH, D), float("nan"))
    pool.set_kv(0, slots[at:at + 1], nan, nan)
    out = kv8.kv8_attention(q, *layer(pool), slots[: m0 + 40], SCALE)
    assert torch.equal(out[: at - m0], before)
    assert bool(torch.isnan(out[at - m0:]).all())   # the NaN token's own row and every row after it


def test_bad_input_is_refused_with_what_to_change():
    require_kv8()
    pool, slots = filled(50)
    q = torch.randn(5, H, D)
    with pytest.raises(ValueError, match="multiple of 64"):
        small = KVPool(1, 60, KVH, 32, dtype=torch.int8)
        kv8.kv8_attention(torch.randn(5, H, 32), *layer(small), slots, SCALE)
    with pytest.raises(ValueError, match="int8 pool layer"):
        kv8.kv8_attention(q, pool.k_buffer[0].float(), pool.v_buffer[0], pool.k_scale[0], pool.v_scale[0], slots,
                          SCALE)
    with pytest.raises(ValueError, match="slots must lie in"):
        kv8.kv8_attention(q, *layer(pool), torch.cat([slots, torch.tensor([10 ** 6])]), SCALE)
    with pytest.raises(ValueError, match="m >= the 5 queries"):
        kv8.kv8_attention(q, *layer(pool), slots[:3], SCALE)
    with pytest.raises(ValueError, match="keys must number"):
        kv8.kv8_decode(q[:1], *layer(pool), slots[None].contiguous(), torch.tensor([0]), SCALE)
    with pytest.raises(ValueError, match="positive finite scale"):
        kv8.kv8_attention(q, *layer(pool), slots, float("nan"))
    with pytest.raises(ValueError, match="kv8_store takes fp32"):
        kv8.kv8_store(torch.randn(2, KVH, D, dtype=torch.float64), pool.k_buffer[0], pool.k_scale[0], slots[:2])


def test_the_pool_counts_its_scales_and_shows_the_k_it_holds():
    pool = KVPool(2, 10, KVH, D, dtype=torch.int8)
    assert pool.nbytes() == 2 * 2 * 11 * KVH * D + 2 * 2 * 11 * KVH * 4
    k = torch.randn(3, KVH, D)
    pool.set_kv(1, torch.tensor([2, 5, 7]), k, k)
    norms = pool.k_norms(torch.tensor([5]))
    assert norms.shape == (2, 1) and norms[0, 0] == 0
    assert abs(float(norms[1, 0]) - float(k[1].norm())) < 0.01 * float(k[1].norm())
    assert KVPool(1, 10, KVH, D).k_scale is None
    assert pool_bytes(2, KVH, D, torch.int8, 11) == pool.nbytes()   # what the engine checks against free memory


def test_int8_numerics_default_to_the_int8_pool_where_its_kernels_run():
    require_kv8()
    assert NativeLlama.from_hf(make_ref(0, **D64), dtype="int8").kv_dtype is torch.int8
    assert NativeLlama.from_hf(make_ref(0, **D64), dtype="int8", kv_dtype="fp32").kv_dtype is torch.float32
    assert NativeLlama.from_hf(make_ref(0, **D64), dtype="fp32").kv_dtype is torch.float32   # HF's own bits
    assert NativeLlama.from_hf(make_ref(0), dtype="int8").kv_dtype is torch.float32          # head_dim 32
    with pytest.raises(ValueError, match="head_dim a multiple of 64"):
        NativeLlama.from_hf(make_ref(0), dtype="int8", kv_dtype="int8")
    with pytest.raises(ValueError, match="fp32 activations"):
        NativeLlama.from_hf(make_ref(0, **D64), dtype="bf16", kv_dtype="int8")
    with pytest.raises(ValueError, match="only the native path"):
        ModelRunner.from_hf(make_ref(0, **D64), device="cpu", impl="hf", kv_cache_dtype="int8")


@pytest.mark.parametrize("numerics", ["int8", "fp32"])
def test_greedy_tokens_are_the_same_with_the_cache_on_and_off_over_an_int8_pool(numerics):
    require_kv8()
    turns = {}
    for on in (True, False):
        runner = ModelRunner.from_hf(make_ref(4, **D64), device="cpu", impl="native", numerics=numerics,
                                     kv_cache_dtype="int8")
        assert runner.native.kv8 and runner.kv_cache_dtype == "int8"
        turns[on] = two_turns(runner, on)
    assert turns[True] == turns[False]


def test_the_one_call_decode_step_writes_and_reads_the_int8_pool_as_the_loop_does():
    require_kv8()
    native = NativeLlama.from_hf(make_ref(0, **D64), dtype="int8", kv_dtype="int8")
    assert native.decode_layers is not None
    pools, logits = [], []
    for one_call in (True, False):
        pool = native.make_pool(512)
        slots = torch.arange(1, 71)
        native.forward(ForwardBatch.build([(list(range(3, 73)), [], slots)]), pool)
        batch = ForwardBatch.build([([9], slots, torch.tensor([80]))])
        calls = counted(native)
        if not one_call:
            layers, native.decode_layers = native.decode_layers, None
        logits.append(native.forward(batch, pool))
        if not one_call:
            native.decode_layers = layers
        assert len(calls) == (1 if one_call else 0)
        pools.append(pool)
    assert torch.equal(logits[0], logits[1])
    for name in ("k_buffer", "v_buffer", "k_scale", "v_scale"):
        assert torch.equal(getattr(pools[0], name), getattr(pools[1], name)), name
    assert bool((pools[0].k_scale[:, 80] > 0).all())   # the step's own K written, with its scales


def test_the_engine_heatmap_reads_the_int8_pool():
    require_kv8()
    runner = ModelRunner.from_hf(make_ref(1, **D64), device="cpu", impl="native", numerics="int8")
    engine = Engine(runner, pool_slots=256)
    engine.generate([[5, 6, 7, 8]], SamplingParams(max_new_tokens=2))
    got = engine.k_norms[:, 1:5]
    want = engine.pool.k_norms(torch.arange(1, 5)).numpy()
    assert got.shape == want.shape and (got == want).all() and (got > 0).all()
