"""A sampled token's text: the whole output decoded again (what the engine did) against a window (IncrementalText).

At output token n of a greedy generation, side by side with the default model's tokenizer: the
tokenizer's own `decode` of the n ids (HF transformers, skip_special_tokens) and IncrementalText.extend,
which decodes only the ids since the previous window; both give the same text (tests/engine/test_detokenize.py).

    .venv/bin/python benchmarks/bench_detokenize.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_engine import corpus_text  # noqa: E402
from core.engine.detokenize import IncrementalText  # noqa: E402
from core.engine.model.loader import resolve_model  # noqa: E402

REPEAT = 50   # tokens timed at each length (the fastest of 3 passes over them)


def whole_per_token(decode, ids: list[int], n: int) -> float:
    """Seconds a token, decoding all of ids[:i] for the last REPEAT tokens before n (fastest of 3 passes)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for i in range(n - REPEAT, n):
            decode(ids[:i])
        best = min(best, (time.perf_counter() - start) / REPEAT)
    return best


def window_per_token(decode, ids: list[int], n: int) -> float:
    """The same tokens through IncrementalText (brought to n - REPEAT untimed, afresh for each pass)."""
    best = float("inf")
    for _ in range(3):
        text = IncrementalText(decode)
        for i in range(1, n - REPEAT):
            text.extend(ids[:i])
        start = time.perf_counter()
        for i in range(n - REPEAT, n):
            text.extend(ids[:i])
        best = min(best, (time.perf_counter() - start) / REPEAT)
    return best


def main() -> None:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("default"))
    ids = tokenizer.encode(corpus_text(), add_special_tokens=False)
    while len(ids) < 8000:
        ids = ids + ids

    def decode(x: list[int]) -> str:
        return tokenizer.decode(x, skip_special_tokens=True)

    print("output tokens   whole output decoded   a window (IncrementalText)   ratio")
    for n in (100, 500, 2000, 8000):
        whole, window = whole_per_token(decode, ids, n), window_per_token(decode, ids, n)
        print(f"{n:>13}   {whole * 1e6:>17.0f} us   {window * 1e6:>23.0f} us   {whole / window:>5.1f}x")


if __name__ == "__main__":
    main()
