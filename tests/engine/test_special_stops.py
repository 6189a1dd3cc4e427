"""A stop string that names a special token ("<|im_end|>") ends the answer, as in SGLang: the output text
skips special tokens, so it had never matched, and an `ignore_eos` chat ran on into the next turn."""
from __future__ import annotations

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams



def chat(tok) -> str:
    return tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False,
                                   add_generation_prompt=True)


def test_a_special_token_stop_string_ends_an_ignore_eos_answer(smollm2_runner):
    e = Engine(smollm2_runner, pool_slots=512)
    tok = smollm2_runner.tokenizer
    prompt = chat(tok)
    free = e.generate([prompt], SamplingParams(max_new_tokens=40, ignore_eos=True))[0]
    full = tok.decode(free.token_ids, skip_special_tokens=False)
    assert "<|im_end|>" in full                          # the model closes its turn, then goes on
    for stop in (["<|im_end|>"], ["<|im_end|>\n<|im_start|>"], ["never there", "<|im_start|>"]):
        got = e.generate([prompt], SamplingParams(max_new_tokens=40, ignore_eos=True, stop=stop))[0]
        assert got.finish_reason == "stop" and got.matched_stop == stop[-1]
        # it ends at the first token whose output, special tokens kept, holds the stop string
        first = next(n for n in range(1, 41) if stop[-1] in tok.decode(free.token_ids[:n], skip_special_tokens=False))
        assert got.token_ids == free.token_ids[:first] and first < 20
        assert got.text == tok.decode(got.token_ids, skip_special_tokens=True)


def test_plain_stop_strings_still_cut_the_text(smollm2_runner):
    e = Engine(smollm2_runner, pool_slots=512)
    got = e.generate([chat(smollm2_runner.tokenizer)], SamplingParams(max_new_tokens=40, stop=["Paris"]))[0]
    assert got.finish_reason == "stop" and got.matched_stop == "Paris" and got.text == "The capital of France is "
