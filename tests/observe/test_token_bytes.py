"""Labels decode whole runs of tokens: byte-level BPE splits "Ü" and "🚀" over several tokens, which
decoded one at a time each turn into "�" (issue 11: "Ünïcödé 🚀" showed as "��nïcödé ������")."""
from __future__ import annotations

import pytest

from core.observe.token_bytes import BYTE_ALPHABET, PENDING, TokenDecoder, token_bytes

TEXT = "Ünïcödé 🚀 won't"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from core.engine.model.loader import model_cache_root
    folder = next(p for p in model_cache_root().iterdir() if (p / "tokenizer.json").is_file())
    return AutoTokenizer.from_pretrained(folder)


def test_byte_alphabet_is_a_bijection_over_256_bytes():
    assert sorted(BYTE_ALPHABET.values()) == list(range(256))
    assert BYTE_ALPHABET["Ġ"] == 32 and BYTE_ALPHABET["A"] == 65


def test_unicode_round_trips_through_token_bytes(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = {i: tokenizer.decode([i]) for i in ids}
    assert "\ufffd" in "".join(pieces.values())                  # the bug: one token at a time
    raw = dict(zip(ids, token_bytes(tokenizer, ids)))
    dec = TokenDecoder(pieces, raw)
    assert dec(ids) == TEXT == tokenizer.decode(ids)
    labels = dec.pieces(ids)
    assert len(labels) == len(ids) and "".join(labels).replace(PENDING, "") == TEXT
    assert labels[0] == PENDING and labels[1] == "Ü"       # "\xc3" then "\x9c"
    assert not any("\ufffd" in x for x in labels)


def test_decoder_without_bytes_falls_back_to_pieces():
    dec = TokenDecoder({1: "Why", 2: " my"})
    assert dec([1, 2, 3]) == "Why my⟨3⟩" and dec.pieces([1, 2]) == ["Why", " my"]


def test_a_run_cut_inside_a_character_shows_one_replacement_not_garbage():
    dec = TokenDecoder({}, {1: b"\xc3", 2: b"\x9c", 3: b"x"})
    assert dec([1, 2, 3]) == "Üx"
    assert dec([2, 3]) == "\ufffdx"                # a node edge that starts mid-character
    assert dec.pieces([1, 2, 3]) == [PENDING, "Ü", "x"]
    assert dec.pieces([1]) == ["\ufffd"]           # the run ends before the character does
