"""IncrementalText: a request's output text decoded a window at a time is, after every token, exactly the
full decode of the output so far, with the default model's tokenizer (byte-level BPE: characters split
across tokens, special tokens skipped) and with a decoder that rewrites earlier text."""
import random

import pytest
from transformers import AutoTokenizer

from core.engine.detokenize import IncrementalText
from core.engine.model.loader import resolve_model


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model("default"))


def full(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def every_prefix_equals_the_full_decode(decode, ids):
    text = IncrementalText(decode)
    for i in range(1, len(ids) + 1):
        assert text.extend(ids[:i]) == decode(ids[:i]), i


def test_text_with_characters_split_across_tokens_matches_the_full_decode_after_every_token(tokenizer):
    ids = tokenizer.encode("Grüße aus Zürich 🦊🦊 — 東京は晴れ。 naïve café ½ ∑x² ok", add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode(ids[:i]) for i in range(1, len(ids)))   # a split character
    every_prefix_equals_the_full_decode(full(tokenizer), ids)


def test_random_ids_with_special_tokens_match_the_full_decode_after_every_token(tokenizer):
    rng = random.Random(7)
    specials = list(tokenizer.all_special_ids)
    for _ in range(20):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tokenizer)) for _ in range(60)]
        every_prefix_equals_the_full_decode(full(tokenizer), ids)


def test_a_decoder_that_rewrites_earlier_text_still_gets_the_full_decode():
    def decode(ids):   # a stand-in tokenizer whose last id 0 upper-cases everything before it
        text = "".join(chr(97 + i % 26) for i in ids)
        return text.upper() if ids and ids[-1] == 0 else text
    every_prefix_equals_the_full_decode(decode, [3, 4, 5, 0, 6, 7, 0, 8])


def test_ids_that_shrink_are_refused_with_what_to_pass(tokenizer):
    text = IncrementalText(full(tokenizer))
    text.extend([100, 200, 300])
    text.extend([100, 200, 300, 400])
    with pytest.raises(ValueError, match="pass the whole output so far"):
        text.extend([100])
