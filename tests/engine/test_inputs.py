"""How a prompt becomes token ids: text read as SGLang, vLLM and HF `tokenizer(text)` read it."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from core.engine.inputs import tokenize

VOCAB = {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}


def llama_like() -> PreTrainedTokenizerFast:
    """A word-level tokenizer that prepends a BOS, as Llama 3's and Mistral's do."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_text_gets_the_bos_its_tokenizer_adds_and_token_ids_are_taken_as_they_are():
    tok = llama_like()
    assert tokenize(tok, len(VOCAB), "hello world")[0] == [0, 3, 4]     # SGLang: tokenizer.encode(text)
    assert tokenize(tok, len(VOCAB), [3, 4])[0] == [3, 4]


def test_whitespace_is_text_and_only_the_empty_string_is_refused():
    tok = llama_like()
    assert tokenize(tok, len(VOCAB), "   ")[0] == [0]
    with pytest.raises(ValueError, match="empty prompt"):
        tokenize(tok, len(VOCAB), "")
