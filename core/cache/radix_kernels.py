"""The radix tree's one per-token loop, the prefix compare of `match_prefix` / `insert`, compiled with numba.

Why compiled: an edge and the rest of a prompt are compared to find where they part. numpy compares both
runs in full (a bool array as long as the shorter run, then an argmax over it), however early they differ;
this loop stops at the first block that differs and allocates nothing. On the Mooncake replay the edges are
thousands of tokens long and most compares part within the first block or run to the end of the edge.
"""
from __future__ import annotations

import numpy as np
from numba import njit

SHORT = 16   # tokens compared one by one before the runs are compared in blocks
BLOCK = 64   # tokens compared per block: long enough to vectorise, short enough to stop soon after a mismatch


@njit(cache=True, nogil=True)
def prefix_len(a: np.ndarray, b: np.ndarray, start: int) -> int:
    """Length of the common prefix of `a` and `b[start:]` (int64 runs): a scalar look at the first tokens,
    then blocks compared without early exit (a loop the compiler vectorises), then a scalar tail."""
    n = min(a.shape[0], b.shape[0] - start)
    j = 0
    short = min(n, SHORT)
    while j < short and a[j] == b[start + j]:
        j += 1
    if j < short:
        return j
    while j + BLOCK <= n:
        x = a[j:j + BLOCK]
        y = b[start + j:start + j + BLOCK]
        differs = 0
        for t in range(BLOCK):
            differs |= x[t] ^ y[t]
        if differs:
            break
        j += BLOCK
    while j < n and a[j] == b[start + j]:
        j += 1
    return j


def load() -> None:
    """Compile now (or load from numba's on-disk cache), so the first match_prefix does not stall."""
    x = np.zeros(1, dtype=np.int64)
    prefix_len(x, x, 0)
