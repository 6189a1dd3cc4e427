"""The fused elementwise C kernels every fp32 forward on a CPU runs (residual add + RMSNorm, RoPE, SiLU * up):
equal to the torch ops they replace (RoPE bit for bit, the others to fp32 rounding), and a row's result the same
bits whatever the number of rows around it, below and above the size where rows are split across threads: these
kernels add no batch dependence of their own (only the int8 projections' fp32 sums differ between a decode step
and a prefill chunk)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.engine.model import native_kernels
from core.engine.model.native_layers import apply_rope, decode_chunks, rope_tables
from tests.engine.model.require_kernels import require_kernels

ROWS = [1, 5, 63, 64, 300]   # 64: native_kernels.h PAR_ROWS, where rows go to the OpenMP threads


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()


def data(m: int, n: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(m, n, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("m", ROWS)
def test_rope_equals_apply_rope_bit_for_bit_on_strided_qkv_rows(m):
    cos, sin = rope_tables(1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)), 1.0, 4096, torch.float32)
    pos = torch.randint(0, 4096, (m,), generator=torch.Generator().manual_seed(m))
    c, s = cos.index_select(0, pos), sin.index_select(0, pos)
    qkv = data(m, 960, m)
    qk = qkv[:, :768].view(m, 12, 64)                   # q and k heads of a fused QKV row: strided rows
    out = native_kernels.rope(qk, c, s)
    assert out.shape == (m, 12, 64) and out.is_contiguous()
    assert torch.equal(out, apply_rope(qk, c[:, None], s[:, None]))


@pytest.mark.parametrize("m", ROWS)
def test_add_rms_norm_adds_in_place_and_normalises_like_torch(m):
    x, delta, w = data(m, 576, m), data(m, 576, m + 1), torch.rand(576) + 0.5
    want_x = x + delta
    want_y = F.rms_norm(want_x.double(), (576,), w.double(), 1e-5)
    y = native_kernels.add_rms_norm(x, delta, w, 1e-5)
    assert torch.equal(x, want_x)
    torch.testing.assert_close(y.double(), want_y, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("m", ROWS)
def test_silu_mul_equals_silu_of_gate_times_up(m):
    gu = data(m, 3072, m, scale=8.0)
    want = F.silu(gu[:, :1536].double()) * gu[:, 1536:].double()
    torch.testing.assert_close(native_kernels.silu_mul(gu).double(), want, rtol=2e-6, atol=1e-6)


def test_silu_mul_runs_a_width_past_the_last_whole_vector():
    gu = data(3, 2 * 21, 9, scale=8.0)                 # 21: two 8-lane vectors and 5 left, one 16-lane and 5
    want = F.silu(gu[:, :21].double()) * gu[:, 21:].double()
    torch.testing.assert_close(native_kernels.silu_mul(gu).double(), want, rtol=2e-6, atol=1e-6)


def test_silu_mul_keeps_nan_and_saturates_at_the_extremes():
    gate = torch.tensor([float("nan"), -200.0, 200.0, 0.0] + [1.0] * 12)   # 16: one AVX-512 vector
    out = native_kernels.silu_mul(torch.cat([gate, torch.ones(16)])[None])[0]
    assert out[0].isnan() and out[1] == 0.0 and out[2] == 200.0 and out[3] == 0.0


def test_a_row_gets_the_same_bits_alone_and_among_hundreds():
    cos, sin = rope_tables(1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)), 1.0, 512, torch.float32)
    many_x, many_d, w = data(300, 576, 1), data(300, 576, 2), torch.rand(576) + 0.5
    gu, qk = data(300, 3072, 3), data(300, 768, 4).view(300, 12, 64)
    pos = torch.arange(300)
    x_all = many_x.clone()
    y_all = native_kernels.add_rms_norm(x_all, many_d, w, 1e-5)
    s_all = native_kernels.silu_mul(gu)
    r_all = native_kernels.rope(qk, cos[pos], sin[pos])
    for i in (0, 63, 64, 299):
        x_one = many_x[i:i + 1].clone()
        assert torch.equal(native_kernels.add_rms_norm(x_one, many_d[i:i + 1], w, 1e-5), y_all[i:i + 1])
        assert torch.equal(native_kernels.silu_mul(gu[i:i + 1].contiguous()), s_all[i:i + 1])
        assert torch.equal(native_kernels.rope(qk[i:i + 1], cos[i:i + 1], sin[i:i + 1]), r_all[i:i + 1])


def test_the_elementwise_kernels_refuse_what_they_would_misread_with_what_to_pass():
    """The C kernels read raw pointers: a wrong dtype, a short table or an odd width must be an error, not
    garbage read past the end."""
    qk = torch.randn(4, 3, 8)
    cos, sin = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="cos must be contiguous fp32"):
        native_kernels.rope(qk, cos.double(), sin)
    with pytest.raises(ValueError, match=r"sin must be contiguous fp32 \[4, 8\]"):
        native_kernels.rope(qk, cos, sin[:3])
    with pytest.raises(ValueError, match="D even"):
        native_kernels.rope(torch.randn(4, 3, 7), cos[:, :7].contiguous(), sin[:, :7].contiguous())
    with pytest.raises(ValueError, match="fp32 CPU rows"):
        native_kernels.rope(qk.double(), cos, sin)
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="updates x in place"):
        native_kernels.add_rms_norm(torch.randn(8, 4).t(), None, torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="delta must be fp32"):
        native_kernels.add_rms_norm(x, torch.randn(4, 7), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="8 contiguous fp32"):
        native_kernels.add_rms_norm(x, None, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match=r"\[M, 2I\]"):
        native_kernels.silu_mul(torch.randn(4, 7))
    strided = torch.randn(8, 4).t()                                    # a transposed gate | up: copied, not misread
    assert torch.equal(native_kernels.silu_mul(strided), native_kernels.silu_mul(strided.contiguous()))


def test_kernels_turned_off_raise_a_clear_error_rather_than_crash():
    previous = native_kernels.set_enabled(False)
    try:
        with pytest.raises(RuntimeError, match="not available here"):
            native_kernels.silu_mul(torch.randn(2, 8))
    finally:
        native_kernels.set_enabled(previous)
    assert native_kernels.silu_mul(torch.zeros(2, 8)).tolist() == [[0.0] * 4] * 2


def test_a_second_build_loads_beside_the_first_and_use_module_switches_every_wrapper_to_it(tmp_path):
    """benchmarks/bench_kernels_ab.py holds two builds (two revisions' sources) in one process and switches the
    wrappers between them step by step: a second build is a separate module with its own state (set_amx's switch
    applied to it), the wrappers call whichever use_module made current, and they compute the same."""
    head = native_kernels.built()
    out = tmp_path / "second.so"
    native_kernels.compile_module(native_kernels.SOURCES, out)
    second = native_kernels.load_module(out)
    assert second is not head and second.__file__ == str(out)
    x = data(5, 96, 7)
    expected = native_kernels.silu_mul(x)
    tiles = bool(head.kv8_tiles())
    previous = native_kernels.set_amx(False)
    try:
        assert native_kernels.use_module(second) is head
        assert native_kernels.built() is second and not second.kv8_tiles()   # set_amx(False) reached it
        assert torch.equal(native_kernels.silu_mul(x), expected)
        native_kernels.set_amx(True)   # and reaches the current build
        assert bool(second.kv8_tiles()) == tiles
    finally:
        assert native_kernels.use_module(head) is second
        native_kernels.set_amx(previous)
    assert native_kernels.built() is head
    for wrong in (None, "second.so", torch):
        with pytest.raises(TypeError, match="a build of these kernels"):
            native_kernels.use_module(wrong)
    assert native_kernels.built() is head
    with pytest.raises(RuntimeError, match="failed"):
        bad = tmp_path / "bad.c"
        bad.write_text("this is not C")
        native_kernels.compile_module([bad], tmp_path / "bad.so")


def test_decode_attention_refuses_inputs_the_kernel_would_misread():
    q = torch.randn(2, 4, 16)
    k = torch.randn(10, 2, 16)
    slots = torch.tensor([[1, 2, 3], [4, 5, 0]])
    first, lens = torch.zeros(2, dtype=torch.int64), torch.tensor([3, 2])
    scratch, out = torch.empty(2 * 2 * 1 * 2 * 18), torch.empty(2, 4, 16)
    ok = dict(q=q, k_buf=k, v_buf=k.clone(), slots=slots, first=first, lens=lens, scale=0.25, chunk=32, nchunks=1,
              scratch=scratch, out=out)
    native_kernels.decode_attention(**ok)
    want = F.scaled_dot_product_attention(q[:, :, None], k[slots].permute(0, 2, 1, 3).repeat_interleave(2, 1),
                                          k[slots].permute(0, 2, 1, 3).repeat_interleave(2, 1), scale=0.25,
                                          attn_mask=(torch.arange(3)[None, :] < lens[:, None])[:, None, None])
    torch.testing.assert_close(out, want[:, :, 0], atol=1e-6, rtol=0)
    for bad, match in ((dict(slots=slots.int()), "int64"), (dict(lens=lens[:1]), r"lens \[2\]"),
                       (dict(scratch=scratch[:10]), "scratch needs"), (dict(k_buf=k.double()), "pool layer"),
                       (dict(q=torch.randn(2, 3, 16)), "do not fit"), (dict(out=out[:, :2]), "out must be"),
                       (dict(row_chunks=torch.tensor([32, 0])), "row_chunks must be"),
                       (dict(row_chunks=torch.tensor([32, native_kernels.MAX_CHUNK + 1])), "row_chunks must be"),
                       (dict(row_chunks=torch.tensor([32])), "row_chunks must be"),
                       (dict(row_chunks=torch.tensor([1, 1])), "row_chunks must be"),   # 1 chunk of 1 < 3 keys
                       (dict(row_chunks=torch.tensor([32, 32], dtype=torch.int32)), "row_chunks must be")):
        with pytest.raises(ValueError, match=match):
            native_kernels.decode_attention(**{**ok, **bad})


def test_a_decodes_attention_is_the_same_bits_whatever_it_is_batched_with():
    """decode_chunks sizes each row's chunks from its own length: row 0 alone, and beside a far longer row (which
    once set every row's chunk size, and so the order of row 0's sums), gives the same bits."""
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(3000, 3, 64, generator=g), torch.randn(3000, 3, 64, generator=g)
    q = torch.randn(2, 9, 64, generator=g)
    lens = torch.tensor([700, 2900])
    table = torch.zeros(2, 2900, dtype=torch.int64)
    table[0, :700] = torch.randperm(2999, generator=g)[:700] + 1
    table[1] = torch.randperm(2999, generator=g)[:2900] + 1

    def attend(rows: list[int]) -> torch.Tensor:
        sub_lens = lens[rows].contiguous()
        row_chunks, nch = decode_chunks(sub_lens, torch.get_num_threads())
        out = torch.empty(len(rows), 9, 64)
        native_kernels.decode_attention(q[rows], k, v, table[rows][:, :int(sub_lens.max())].contiguous(),
                                        torch.zeros(len(rows), dtype=torch.int64), sub_lens, 0.125, 0, nch,
                                        torch.empty(len(rows) * 3 * nch * 3 * 66), out, row_chunks=row_chunks)
        return out

    alone, both = attend([0]), attend([0, 1])
    assert torch.equal(alone[0], both[0])
    assert decode_chunks(torch.tensor([700, 2900]), 2)[0].tolist() == [64, 192]   # 16 chunks a row on 2 threads
    want = F.scaled_dot_product_attention(q[:1, :, None], k[table[0, :700]].permute(1, 0, 2)[None].repeat_interleave(
        3, 1), v[table[0, :700]].permute(1, 0, 2)[None].repeat_interleave(3, 1), scale=0.125)[:, :, 0]
    torch.testing.assert_close(alone, want, atol=2e-6, rtol=0)


def test_a_decode_beside_an_extends_rows_keeps_its_own_chunks():
    """A decode batched with a short extend's rows (one-row run beside a run of 3 sharing a slot row: the
    `segments` path) gives the bits it gives alone: runs split every SEG_CHUNK keys, the decode by its length."""
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(2000, 3, 64, generator=g), torch.randn(2000, 3, 64, generator=g)
    q = torch.randn(4, 9, 64, generator=g)
    lens = torch.tensor([1300, 1498, 1499, 1500])   # the decode (96-key chunks of its own, not 64), the extend
    table = torch.zeros(4, 1500, dtype=torch.int64)
    table[0, :1300] = torch.randperm(1999, generator=g)[:1300] + 1
    table[1:] = torch.randperm(1999, generator=g)[:1500] + 1
    first = torch.zeros(4, dtype=torch.int64)

    def attend(rows: list[int], segments) -> torch.Tensor:
        sub = lens[rows].contiguous()
        row_chunks, nch = decode_chunks(sub, 2)
        chunk = native_kernels.SEG_CHUNK if segments is not None else 0
        if segments is not None:
            nch = max(nch, -(-int(sub.max()) // chunk))
        out = torch.empty(len(rows), 9, 64)
        native_kernels.decode_attention(q[rows], k, v, table[rows][:, :int(sub.max())].contiguous(), first[rows],
                                        sub, 0.125, chunk, nch, torch.empty(len(rows) * 3 * nch * 3 * 66), out,
                                        segments, row_chunks)
        return out

    alone = attend([0], None)
    beside = attend([0, 1, 2, 3], torch.tensor([0, 1, 4]))
    assert torch.equal(alone[0], beside[0])
    runs_alone = attend([1, 2, 3], torch.tensor([0, 3]))
    assert torch.equal(runs_alone, beside[1:])
