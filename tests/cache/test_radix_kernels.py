"""The tree's compiled prefix compare (core/cache/radix_kernels.py, behind radix_node.common_len): the exact length
wherever the runs part (in the first tokens, in a block, in the tail after the blocks), from any start,
rounded down to whole pages, against numpy's full compare."""
from __future__ import annotations

import numpy as np
import pytest

from core.cache.radix_kernels import BLOCK, SHORT, prefix_len
from core.cache.radix_node import RadixKey, common_len


def _reference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differs = np.nonzero(a[:n] != b[:n])[0]
    return int(differs[0]) if differs.size else n


@pytest.mark.parametrize("where", [0, 1, SHORT - 1, SHORT, SHORT + 1, SHORT + BLOCK - 1, SHORT + BLOCK,
                                   SHORT + 3 * BLOCK + 5, 999, 1000 - 1])
def test_the_first_difference_anywhere_is_found_exactly(where):
    a = np.arange(1000, dtype=np.int64) * 7
    b = a.copy()
    b[where] = -1
    b[where + 1:] = a[where + 1:]          # only one token differs: a block compare that misses it overruns
    assert prefix_len(a, b, 0) == where == _reference(a, b)
    assert prefix_len(b, a, 0) == where


@pytest.mark.parametrize("na, nb", [(0, 0), (0, 5), (5, 0), (16, 16), (80, 200), (200, 80), (1000, 1000)])
def test_equal_runs_match_to_the_shorter_end(na, nb):
    a, b = np.arange(na, dtype=np.int64), np.arange(nb, dtype=np.int64)
    assert prefix_len(a, b, 0) == min(na, nb)


def test_a_start_offset_compares_against_the_rest_of_the_prompt():
    prompt = np.arange(500, dtype=np.int64)
    edge = prompt[100:300].copy()
    assert prefix_len(edge, prompt, 100) == 200
    edge[150] = 0
    assert prefix_len(edge, prompt, 100) == 150
    assert prefix_len(edge, prompt, 101) == 0                  # off by one token: nothing in common
    assert prefix_len(edge, prompt, 500) == 0 and prefix_len(edge, prompt, 600) == 0   # past the end


def test_random_runs_agree_with_numpy():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 400))
        a = rng.integers(0, 3, n).astype(np.int64)
        b = a.copy() if rng.random() < 0.7 else rng.integers(0, 3, n).astype(np.int64)
        if n and rng.random() < 0.5:
            b[int(rng.integers(0, n))] += 1
        b = b[:int(rng.integers(0, n + 1))]
        start = int(rng.integers(0, 3))
        assert prefix_len(a, np.concatenate([np.full(start, 9, np.int64), b]), start) == _reference(a, b)


def test_common_len_rounds_down_to_whole_pages_and_takes_strided_keys():
    a = np.arange(100, dtype=np.int64)
    b = a.copy()
    b[37] = -5
    assert [common_len(a, b, ps) for ps in (1, 2, 4, 16, 64)] == [37, 36, 36, 32, 0]
    assert common_len(a[::2], b[::2], 1) == 50 and common_len(a[1::2], b[1::2], 1) == 18   # 37 is odd
    assert common_len(RadixKey(a).token_ids, RadixKey(list(b)).token_ids, 1, 0) == 37
