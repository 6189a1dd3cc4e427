"""The two places `free_pages` can live (core/cache/slot_store.py) held to each other on long runs, as evictions free
them, and their errors naming the exact first offending slot of a page."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cache.allocator import SlotAllocator
from tests.cache.test_allocator import _outcome, state


# ----- long runs: the run store's block path (runs > slot_kernels.SHORT + BLOCK slots) ------------------------
@settings(max_examples=80, deadline=None, derandomize=True)
@given(ps=st.sampled_from([1, 2]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(1, 300), st.integers(0, 399), st.integers(0, 6)),
                    min_size=1, max_size=12))
def test_long_runs_give_the_same_results_and_errors_on_both_stores(ps, ops):
    """Frees of long runs of consecutive pages (as evictions free them), some broken by a gap, reversed, or
    spoiled by an already-free page, a repeat, a page outside the pool or slots off the page boundary: the run
    store (CPU kernels) and the ring store (torch) agree on every result and every error message."""
    n_pages = 400
    runs = SlotAllocator(n_pages * ps, page_size=ps)
    ring = SlotAllocator(n_pages * ps, page_size=ps, store="ring")
    held: list[int] = []                 # pages handed out, in the order they were
    for is_alloc, n, start, twist in ops:
        if is_alloc or not held:
            got, want = runs.alloc(n * ps), ring.alloc(n * ps)
            assert (got is None) == (want is None)
            if got is not None:
                assert got.tolist() == want.tolist()
                held.extend((got[::ps] // ps).tolist())
            continue
        lo = start % len(held)
        seg = held[lo:lo + n]
        pages = {0: seg, 1: seg[::-1], 2: seg[:len(seg) // 2] + seg[len(seg) // 2 + 3:],       # a gap
                 3: seg + [seg[0]],                                                            # a repeat
                 4: seg + [n_pages + 1],                                                       # outside
                 5: seg + runs.free_pages[:1].tolist(), 6: seg}[twist]                         # already free
        slots = [p * ps + i for p in pages for i in range(ps)]
        if twist == 6 and ps == 2:
            slots = [s + 1 for s in slots]                                                    # off the boundary
        out = _outcome(runs, slots)
        assert out == _outcome(ring, slots)
        if out[0] is None:
            held = [p for p in held if p not in set(pages)]
        elif twist in (3, 4) or (twist == 6 and ps == 2):
            assert ("twice" in out[0]) if twist == 3 else ("outside" in out[0] or "whole pages" in out[0])


def test_a_free_of_one_long_run_with_a_gap_frees_exactly_its_pages():
    a = SlotAllocator(300)
    a.alloc(300)
    slots = list(range(1, 101)) + list(range(104, 201))       # two runs, the break inside a compared block
    a.free(slots)
    assert a.free_pages.tolist() == slots and a.available() == 197
    assert a.is_free_mask().nonzero().flatten().tolist() == slots
    with pytest.raises(ValueError, match="double free: slot 120 is already free"):
        a.free(list(range(101, 104)) + list(range(120, 160)))   # 101..103 held, 120.. freed by the first call
    with pytest.raises(ValueError, match=r"same slot twice in one call \(slot 102\)"):
        a.free(list(range(101, 104)) + [102])
    assert a.free_pages.tolist() == slots                        # the rejected call changed nothing
    a.free(torch.arange(101, 104))
    assert a.free_pages.tolist() == slots + [101, 102, 103]
    assert a.alloc(150).tolist() == list(range(1, 101)) + list(range(104, 154))   # runs split where alloc stops
    assert a.free_pages.tolist()[:3] == [154, 155, 156] and a.available() == 50


@pytest.mark.parametrize("store", ["runs", "ring"])
def test_paged_free_errors_name_the_first_slot_of_the_page(store):
    a = SlotAllocator(16, page_size=4, store=store)     # pages 1..4 = slots 4..19
    assert a.alloc(8).tolist() == list(range(4, 12))
    a.free(list(range(8, 12)))                           # page 2 back
    before = state(a)
    for bad, match in [(list(range(8, 12)), r"double free: slot 8 is already free"),
                       (list(range(4, 8)) * 2, r"same slot twice in one call \(slot 4\)"),
                       (list(range(20, 24)), r"slot 20 outside the pool \(slots 4..19\)"),
                       (list(range(0, 4)), r"slot 0, which is padding")]:
        with pytest.raises(ValueError, match=match):
            a.free(bad)
        assert state(a) == before


# ----- what reaches the kernels: a tensor's address and length (slot_kernels give_runs_at / take_runs_at) -------
@pytest.mark.parametrize("store", ["runs", "ring"])
def test_free_of_strided_and_offset_views_frees_exactly_their_slots(store):
    """The run store hands the kernel `data_ptr()` of a contiguous tensor: a strided view (every other slot,
    a column of a 2-D tensor, a broadcast) is made contiguous first, and a view at an offset starts at its
    own first slot. Each frees exactly the slots it shows, and a broadcast slot is a repeat."""
    a = SlotAllocator(12, store=store)
    got = a.alloc(12)
    assert got.is_contiguous() and got.tolist() == list(range(1, 13))
    a.free(got[::2])                                     # 1, 3, 5, 7, 9, 11: stride 2
    assert a.free_pages.tolist() == [1, 3, 5, 7, 9, 11]
    a.free(got[7:8])                                     # 8: a view at an offset
    with pytest.raises(ValueError, match=r"^double free: slot 8 is already free"):
        a.free(got[7:10])                                # 8, 9, 10: the first offending slot is named
    a.free(got.reshape(6, 2)[:, 1][:2])                  # 2, 4: a column (stride 2) of a 2-D view
    with pytest.raises(ValueError, match=r"same slot twice in one call \(slot 6\)"):
        a.free(got[5:6].expand(3))                       # stride 0: slot 6 three times
    assert a.free_pages.tolist() == [1, 3, 5, 7, 9, 11, 8, 2, 4] and a.available() == 9
    a.free(torch.tensor([[6, 0], [12, 0]])[:, 0])        # 6, 12: stride 2 of a tensor we did not allocate
    assert a.free_pages.tolist() == [1, 3, 5, 7, 9, 11, 8, 2, 4, 6, 12]
    assert a.is_free_mask().nonzero().flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]


def test_alloc_writes_every_slot_of_a_fresh_tensor():
    """take_runs_at writes n * page_size slots at the new tensor's address: nothing before or after, and two
    allocs never share memory (torch.empty's leftovers never show)."""
    a = SlotAllocator(64, page_size=4)                  # pages 1..16 = slots 4..67
    x = a.alloc(8)
    y = a.alloc(12)
    assert x.tolist() == list(range(4, 12)) and y.tolist() == list(range(12, 24))
    assert x.data_ptr() != y.data_ptr() and x.untyped_storage().nbytes() == 8 * 4   # int32 slots
    a.free(torch.cat([y[4:8], x[:4]]))                  # pages 4 and 1, in that order
    z = a.alloc(52)
    assert z.tolist() == list(range(24, 68)) + list(range(16, 20)) + list(range(4, 8))
    assert a.available() == 0 and a.alloc(4) is None


def test_free_pages_bits_across_64_page_words():
    """The run store keeps a bit per page in 64-page words: runs that start, end or cross a word boundary are
    marked and checked page-exactly, a rejected free unmarks exactly its own pages, and the free mask reads
    the same bits back."""
    a = SlotAllocator(200)
    a.alloc(200)
    for run in [range(63, 66), [1], range(120, 194), [200], range(66, 120)]:   # crossing 64, 128, 192
        a.free(list(run))
    mask = [1, *range(63, 194), 200]
    assert a.is_free_mask().nonzero().flatten().tolist() == mask
    for bad, match in [([64], r"double free: slot 64 is"), ([62, 63], r"double free: slot 63 is"),
                       ([194, 195, 128], r"double free: slot 128 is"),
                       (list(range(2, 63)) + [2], r"same slot twice in one call \(slot 2\)")]:
        with pytest.raises(ValueError, match=match):
            a.free(bad)
        assert a.is_free_mask().nonzero().flatten().tolist() == mask and a.available() == len(mask)
    assert a.alloc(5).tolist() == [63, 64, 65, 1, 120]
    assert a.is_free_mask().nonzero().flatten().tolist() == [*range(66, 120), *range(121, 194), 200]
    a.free(list(range(2, 63)) + list(range(194, 200)))
    assert a.available() == 200 - 5 and a.is_free_mask()[0].item() is False
