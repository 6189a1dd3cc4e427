"""SlotAllocator (free_pages) and KVPool."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cache.allocator import MAX_SLOTS, SLOT_DTYPE, SlotAllocator
from core.cache.kv_pool import KVPool


def state(a: SlotAllocator):
    return a.free_pages.tolist(), a.is_free_mask().tolist(), a.available()


# ----- allocation order -------------------------------------------------------------------------
def test_free_pages_starts_as_1_to_n_int32():
    a = SlotAllocator(11)
    assert a.free_pages.tolist() == list(range(1, 12))
    assert a.free_pages.dtype == torch.int32 and a.free_pages.device.type == "cpu"
    assert a.available() == 11
    assert a.is_free_mask().tolist() == [False] + [True] * 11
    assert a.alloc(2).dtype == torch.int32 and SLOT_DTYPE is torch.int32


def test_alloc_takes_from_the_front_free_appends_at_the_back():
    a = SlotAllocator(8)
    assert a.alloc(2).tolist() == [1, 2]
    assert a.alloc(3).tolist() == [3, 4, 5]
    assert a.free_pages.tolist() == [6, 7, 8]
    a.free(torch.tensor([4, 1]))
    assert a.free_pages.tolist() == [6, 7, 8, 4, 1]
    # a later alloc is not contiguous: it takes the front, then the freed slots in free order
    assert a.alloc(4).tolist() == [6, 7, 8, 4]
    assert a.free_pages.tolist() == [1]
    assert a.available() == 1


def test_alloc_returns_none_when_too_few_free_and_changes_nothing():
    a = SlotAllocator(4)
    a.alloc(3)
    before = state(a)
    assert a.alloc(2) is None
    assert state(a) == before
    assert a.alloc(1).tolist() == [4]
    assert a.alloc(1) is None


def test_free_accepts_lists_and_other_int_dtypes():
    a = SlotAllocator(6)
    a.alloc(6)
    a.free([3, 5])
    a.free(torch.tensor([[1], [2]], dtype=torch.int16))
    assert a.free_pages.tolist() == [3, 5, 1, 2]
    assert a.free_pages.dtype == torch.int32
    a.free([])  # empty is a no-op
    assert a.free_pages.tolist() == [3, 5, 1, 2]


def test_alloc_accepts_numpy_and_tensor_integers():
    a = SlotAllocator(6)
    assert a.alloc(np.int64(2)).tolist() == [1, 2]
    assert a.alloc(torch.tensor(2)).tolist() == [3, 4]


def test_clear_restores_startup_state():
    a = SlotAllocator(5)
    a.alloc(3)
    a.free([2])
    a.clear()
    assert state(a) == (list(range(1, 6)), [False] + [True] * 5, 5)


# ----- pages ----------------------------------------------------------------------------------------
def test_page_size_2_hands_out_whole_pages_and_never_page_0():
    a = SlotAllocator(8, page_size=2)
    assert a.free_pages.tolist() == [1, 2, 3, 4]  # page numbers
    assert a.available() == 8
    assert a.alloc(4).tolist() == [2, 3, 4, 5]   # pages 1, 2
    assert a.free_pages.tolist() == [3, 4]
    assert a.available() == 4
    a.free(torch.tensor([2, 3]))                  # page 1 back, at the back
    assert a.free_pages.tolist() == [3, 4, 1]
    assert a.alloc(6).tolist() == [6, 7, 8, 9, 2, 3]
    assert a.available() == 0
    assert a.is_free_mask().tolist() == [False] * 10


@pytest.mark.parametrize("ps", [1, 2, 4])
def test_page_p_covers_p_times_ps_to_p_times_ps_plus_ps_minus_1(ps):
    a = SlotAllocator(3 * ps, page_size=ps)
    slots = a.alloc(3 * ps).tolist()
    assert slots == list(range(ps, 4 * ps))       # pages 1..3; page 0 (slots 0..ps-1) is padding
    for p in (1, 2, 3):
        assert slots[(p - 1) * ps:p * ps] == [p * ps + i for i in range(ps)]
    assert a.alloc(ps) is None
    a.free(torch.tensor(slots[ps:2 * ps]))        # page 2
    assert a.free_pages.tolist() == [2]
    assert a.is_free_mask().nonzero().flatten().tolist() == list(range(2 * ps, 3 * ps))


def test_page_size_4_unaligned_alloc_and_partial_page_free_are_rejected():
    a = SlotAllocator(12, page_size=4)
    with pytest.raises(ValueError, match=r"alloc\(6\) is not page aligned.*multiple of 4.*8"):
        a.alloc(6)
    slots = a.alloc(8)
    before = state(a)
    with pytest.raises(ValueError, match="whole pages of 4"):
        a.free(slots[:2])
    with pytest.raises(ValueError, match="whole pages of 4"):
        a.free(torch.tensor([5, 6, 7, 8]))        # straddles pages 1 and 2
    assert state(a) == before


def test_num_slots_must_be_a_multiple_of_page_size():
    with pytest.raises(ValueError, match="use 8 or 12"):
        SlotAllocator(10, page_size=4)
    with pytest.raises(ValueError, match="page_size"):
        SlotAllocator(8, page_size=0)


# ----- bad input: ValueError that says what to change, state unchanged ---------------------------
@pytest.mark.parametrize("n, match", [
    (0, "positive slot count"),
    (-1, "positive slot count"),
    (2.5, "integer"),
    (True, "integer"),
])
def test_bad_alloc_counts(n, match):
    a = SlotAllocator(6)
    a.alloc(2)
    before = state(a)
    with pytest.raises(ValueError, match=match):
        a.alloc(n)
    assert state(a) == before


def test_unaligned_alloc_message_names_the_fix():
    a = SlotAllocator(8, page_size=2)
    before = state(a)
    with pytest.raises(ValueError, match=r"page_size=2.*multiple of 2.*for example 4"):
        a.alloc(3)
    assert state(a) == before


@pytest.mark.parametrize("bad, match", [
    ([2], "double free: slot 2 is already free"),            # freed twice
    ([3, 3], "same slot twice"),                              # twice in one call
    ([5], "already free .or was never handed out"),          # never handed out
    ([0], "padding"),                                         # slot 0
    ([12], "outside the pool"),                               # one past the end
    ([-1], "outside the pool"),
    ([1, 3, 0], "padding"),                                   # one bad index rejects the whole call
    ([1, 2, 0], "slot 2 is already free"),                    # the first problem in order is named
    ([1, 99], "outside the pool"),
    ([1, 2, 5], "never handed out"),
])
def test_bad_free_rejected_and_nothing_changes(bad, match):
    a = SlotAllocator(11)
    a.alloc(4)                  # 1..4 handed out
    a.free([2])                 # 2 back
    before = state(a)
    with pytest.raises(ValueError, match=match):
        a.free(torch.tensor(bad))
    assert state(a) == before


@pytest.mark.parametrize("n", [0, -3])
def test_pool_of_fewer_than_one_slot(n):
    with pytest.raises(ValueError, match="raise the pool size"):
        SlotAllocator(n)
    with pytest.raises(ValueError, match="raise the pool size"):
        KVPool(1, n, 1, 4)


def test_page_size_2_free_of_padding_page_and_out_of_range():
    a = SlotAllocator(4, page_size=2)   # pages 1, 2 -> slots 2..5
    a.alloc(4)
    before = state(a)
    with pytest.raises(ValueError, match="padding"):
        a.free([0, 1])
    with pytest.raises(ValueError, match=r"outside the pool \(slots 2..5\)"):
        a.free([6, 7])
    assert state(a) == before


# ----- a random alloc/free sequence against a deque model ----------------------------------------
@settings(max_examples=60, deadline=None, derandomize=True)
@given(ps=st.sampled_from([1, 2, 4]), ops=st.lists(st.tuples(st.booleans(), st.integers(1, 4)), max_size=30))
def test_allocator_matches_a_deque_model(ps, ops):
    a = SlotAllocator(8 * ps, page_size=ps)
    model = deque(range(1, 9))          # page numbers
    held: list[list[int]] = []          # pages per allocation
    for is_alloc, n in ops:
        if is_alloc:
            got = a.alloc(n * ps)
            if n > len(model):
                assert got is None
                continue
            pages = [model.popleft() for _ in range(n)]
            assert got.tolist() == [p * ps + i for p in pages for i in range(ps)]
            held.append(pages)
        elif held:
            pages = held.pop(n % len(held))
            a.free([p * ps + i for p in pages for i in range(ps)])
            model.extend(pages)
        assert a.free_pages.tolist() == list(model)
        assert a.available() == len(model) * ps
        assert a.is_free_mask().nonzero().flatten().tolist() == sorted(
            p * ps + i for p in model for i in range(ps))


# ----- KVPool -----------------------------------------------------------------------------------------
def test_kvpool_shapes_dtype_and_writes():
    pool = KVPool(num_layers=2, num_slots=11, num_kv_heads=3, head_dim=4, dtype=torch.float16, device="cpu")
    assert pool.k_buffer.shape == (2, 12, 3, 4) and pool.v_buffer.shape == (2, 12, 3, 4)
    assert pool.k_buffer.dtype == torch.float16 and pool.k_buffer.device.type == "cpu"
    assert pool.nbytes() == 2 * (2 * 12 * 3 * 4) * 2
    slots = torch.tensor([4, 7])
    k = torch.ones(2, 3, 4)
    v = torch.full((2, 3, 4), 2.0)
    pool.set_kv(1, slots, k, v)
    assert pool.k_buffer[1, 4].eq(1).all() and pool.v_buffer[1, 7].eq(2).all()
    assert pool.k_buffer[0].eq(0).all() and pool.k_buffer[1, 0].eq(0).all()   # padding untouched
    norms = pool.k_norms()
    assert norms.shape == (2, 12)
    assert norms[1, 4].item() == pytest.approx(12 ** 0.5) and norms[1, 5].item() == 0


def test_kvpool_with_pages_has_a_whole_padding_page():
    pool = KVPool(1, 8, 1, 2, page_size=4)
    assert pool.k_buffer.shape == (1, 12, 1, 2)


# ----- the compiled free() and its torch twin (used off the CPU) agree ---------------------------------
def _outcome(a: SlotAllocator, slots: list[int]):
    try:
        a.free(slots)
        error = None
    except ValueError as e:
        error = str(e)
    return error, a.free_pages.tolist(), a.is_free_mask().tolist(), a.available()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(ps=st.sampled_from([1, 2]), held=st.integers(0, 12),
       frees=st.lists(st.lists(st.integers(-2, 14), max_size=6), min_size=1, max_size=4))
def test_compiled_and_torch_free_give_the_same_result_and_error(ps, held, frees):
    kernel, twin = SlotAllocator(12 * ps, page_size=ps), SlotAllocator(12 * ps, page_size=ps, store="ring")
    assert kernel.use_kernel and not twin.use_kernel
    if held:
        assert kernel.alloc(held * ps).tolist() == twin.alloc(held * ps).tolist()
    for pages in frees:
        slots = [p * ps + i for p in pages for i in range(ps)]
        assert _outcome(kernel, slots) == _outcome(twin, slots)


@pytest.mark.parametrize("store", ["runs", "ring"])
@pytest.mark.parametrize("bad, match", [
    ([5, 1, 5], r"same slot twice in one call \(slot 5\)"),   # the second 5 is the first problem
    ([9, 2, 0], r"slot 9 is already free"),                   # the first problem in order is named
    ([1, 3, 99], r"slot 99 outside the pool"),
])
def test_free_names_the_first_problem_in_order(store, bad, match):
    a = SlotAllocator(11, store=store)
    a.alloc(8)                   # 1..8 held
    a.free([2])
    before = state(a)
    with pytest.raises(ValueError, match=match):
        a.free(bad)
    assert state(a) == before


def test_free_takes_any_iterable_of_integers_and_refuses_the_rest():
    a = SlotAllocator(8)
    a.alloc(8)
    a.free({2})
    a.free(s for s in (4, 3))
    a.free(np.array([7], dtype=np.uint8))
    assert a.free_pages.tolist() == [2, 4, 3, 7]
    before = state(a)
    for bad, match in [([1.0], "integer slot indices, got float64"), (["5"], "integer slot indices"),
                       (torch.tensor([1.5]), "torch.float32 tensor"), (torch.tensor([True]), "torch.bool tensor"),
                       (5, "a sequence of slot indices.*got int")]:
        with pytest.raises(ValueError, match=match):
            a.free(bad)
        assert state(a) == before


# ----- slot dtype ------------------------------------------------------------------------------------
def test_a_pool_too_large_for_int32_slot_ids_is_refused_before_any_memory_is_taken():
    with pytest.raises(ValueError, match=r"more than a pool can index .*int32"):
        SlotAllocator(MAX_SLOTS + 1)
    assert MAX_SLOTS + 2**16 <= torch.iinfo(SLOT_DTYPE).max + 1


def test_free_of_an_int64_id_past_int32_is_outside_the_pool_not_wrapped():
    """2**32 + 3 wraps to slot 3 in int32: it must be named as outside, and slot 3 stay held."""
    for page_size in (1, 4):
        a = SlotAllocator(16, page_size=page_size)
        held = a.alloc(16)
        before = state(a)
        with pytest.raises(ValueError, match=r"outside the pool"):
            a.free(torch.tensor([2**32 + 4 * page_size + s for s in range(page_size)], dtype=torch.int64))
        assert state(a) == before
        a.free(held)
        assert a.available() == 16


@pytest.mark.parametrize("page_size", [True, 0, 2.0, "4"])
def test_a_page_size_that_is_no_positive_integer_is_refused_as_the_lab_refuses_it(page_size):
    """True passed isinstance(int) and made a pool of 1-slot pages; the lab's sweep refused the same value."""
    with pytest.raises(ValueError, match="page_size must be a positive integer"):
        SlotAllocator(8, page_size=page_size)
