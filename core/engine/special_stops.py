"""Stop strings that name special tokens ("<|im_end|>", "<|im_start|>"): the output text skips special tokens,
so such a stop could never be found there, and an answer run with `ignore_eos` (or past a special token that is
not EOS) went on into the next turn. SGLang looks for stop strings in a decode of the output's tail that keeps
special tokens (Req.check_finished: the last stop_str_max_len + 1 tokens); so does `SpecialStops.find`. The
visible text is left as it is: the special token is not in it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence


@dataclass(frozen=True)
class SpecialStops:
    stops: tuple[str, ...]                  # the request's stop strings that contain a special token's text
    window: int                             # output tokens decoded: the longest one's tokens + 1
    decode: Callable[[list[int]], str]      # the tokenizer's decode, special tokens kept

    def find(self, output_ids: Sequence[int]) -> Optional[str]:
        """The first of `stops` in the output's last `window` tokens, or None."""
        tail = self.decode(list(output_ids[-self.window:]))
        return next((s for s in self.stops if s in tail), None)


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens (its named ones and the added tokens marked special)."""
    texts = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added))
    return tuple(t for t in texts if t)


def special_stops(tokenizer: Any, stop: Sequence[str], specials: Sequence[str]) -> Optional[SpecialStops]:
    """The SpecialStops of a request's `stop` strings, or None when none names a special token."""
    mine = tuple(s for s in stop if any(t in s for t in specials))
    if tokenizer is None or not mine:
        return None
    window = max(len(tokenizer.encode(s, add_special_tokens=False)) for s in mine) + 1
    return SpecialStops(mine, window, lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
