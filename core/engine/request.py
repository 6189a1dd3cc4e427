"""A request's life: its tokens, the slots it holds, and the handle a caller waits on."""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Collection, Iterator, Optional, Sequence, Union

import torch

from core.cache.allocator import SLOT_DTYPE
from core.cache.radix_cache import TreeNode
from core.engine.detokenize import IncrementalText
from core.engine.sampling import SamplingParams
from core.engine.special_stops import SpecialStops

WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"
_rids = itertools.count()


class Piece(str):
    """A streamed text delta. `tokens`: how many tokens the request had generated when it was queued, so a
    stream chunk pairs this text with its own ids, not with those generated since. `final`: that token ended the
    request ("length", "stop", "eos") and was queued before the request was marked done; its completion carries
    this text too, so a server that sends the completion as a stream's last chunk skips this piece instead of
    sending it twice (EngineHost's watcher)."""
    tokens: int
    final: bool

    def __new__(cls, text: str, tokens: int, final: bool) -> "Piece":
        piece = super().__new__(cls, text)
        piece.tokens, piece.final = tokens, final
        return piece


@dataclass(frozen=True)
class Completion:
    rid: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int          # prompt tokens served from the radix cache at (first) admission
    finish_reason: Optional[str]  # "length", "stop", "eos", "abort"
    ttft: Optional[float]       # seconds from submit to the first token
    total_time: float
    error: Optional[str] = None
    matched_stop: Union[str, int, None] = None   # what ended it: the stop string, or the EOS token id (SGLang's)
    retractions: int = 0        # times the scheduler took it back out to free memory (SGLang's num_retractions)


class Request:
    """Scheduler-side state. `kv_slots` hold the K/V of fill_ids[:computed]; the first
    `tree_len` of them belong to the radix tree (locked through `last_node`), the rest and
    `tail_slots` (unused slots of a partly filled page) belong to this request."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, prompt_text: str = "",
                 rid: Optional[str] = None, extra_key: Optional[str] = None) -> None:
        self.rid = rid if rid is not None else f"r{next(_rids)}"
        self.prompt_ids = list(prompt_ids)
        self.prompt_text = prompt_text
        self.params = params
        self.extra_key = extra_key
        self.output_ids: list[int] = []
        self.output_text = ""
        self._text: Optional[IncrementalText] = None   # output_ids' text, decoded a window a token
        self.streamed_text = ""     # the prefix of output_text already sent to stream()
        self.state = WAITING
        self.finish_reason: Optional[str] = None
        self.matched_stop: Union[str, int, None] = None
        self.special_stops: Optional[SpecialStops] = None   # stop strings naming special tokens (the engine sets)
        self.error: Optional[str] = None
        self.generator: Optional[torch.Generator] = None
        self.kv_slots = torch.empty(0, dtype=SLOT_DTYPE)
        self.tail_slots = torch.empty(0, dtype=SLOT_DTYPE)
        self.tree_len = 0
        self.inserted_len = 0       # tokens this request put into the tree so far (SGLang's cache_inserted_len)
        self.last_node: Optional[TreeNode] = None
        self.cached_tokens: Optional[int] = None
        self.admissions: list[int] = []  # cached tokens found at each admission (re-admission after retraction too)
        self.admit_order = 0
        self.arrival = 0            # order of arrival in the waiting queue (Scheduler.add)
        self.overtaken = 0          # later arrivals admitted before it while it waited (lpm's starvation bound)
        self.counted = False        # admitted once: counted in the hit-rate metrics
        self.submit_time = time.perf_counter()
        self.first_token_time: Optional[float] = None
        self.finish_time: Optional[float] = None
        self.done = threading.Event()
        self.stream_queue: "queue.Queue[Optional[Piece]]" = queue.Queue()

    @property
    def fill_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def streamed_len(self) -> int:
        return len(self.streamed_text)

    @property
    def computed(self) -> int:
        return int(self.kv_slots.numel())

    def append_token(self, tok: int, eos_token_ids: Collection[int], decode: Callable[[list[int]], str]) -> Optional[str]:
        """Take one sampled token: the output text extended (a window decoded: detokenize.py), what of it
        is safe to stream queued, and the finish reason if this token ends the request ("eos", "stop",
        "length"), else None (SGLang's check_finished). Before min_new_tokens no EOS ends it (the sampler holds
        EOS back then, as SGLang's min_new_tokens does); a stop string ends it at any length, as in SGLang 0.5.23."""
        self.output_ids.append(tok)
        reason = None
        early = len(self.output_ids) < self.params.min_new_tokens
        if tok in eos_token_ids and not self.params.ignore_eos and not early:
            reason, self.matched_stop = "eos", tok
        if self._text is None:
            self._text = IncrementalText(decode)
        text = self._text.extend(self.output_ids)
        for s in self.params.stop:
            at = text.find(s)
            if at >= 0:
                text, reason, self.matched_stop = text[:at], "stop", s
        if reason is None and self.special_stops is not None:   # "<|im_end|>": not in the text (special_stops.py)
            hit = self.special_stops.find(self.output_ids)
            if hit is not None:
                reason, self.matched_stop = "stop", hit
        if reason is None and len(self.output_ids) >= self.params.max_new_tokens:
            reason = "length"
        self.output_text = text
        safe = text[:stream_safe_len(text, self.params.stop, reason is not None)]
        if len(safe) > self.streamed_len and safe.startswith(self.streamed_text):
            self.stream_queue.put(Piece(safe[self.streamed_len:], len(self.output_ids), reason is not None))
            self.streamed_text = safe
        return reason

    def own_slots(self) -> torch.Tensor:
        return torch.cat([self.kv_slots[self.tree_len:], self.tail_slots])

    def completion(self) -> Completion:
        end = self.finish_time or time.perf_counter()
        ttft = None if self.first_token_time is None else self.first_token_time - self.submit_time
        return Completion(rid=self.rid, text=self.output_text, token_ids=list(self.output_ids),
                          prompt_tokens=len(self.prompt_ids), cached_tokens=self.cached_tokens or 0,
                          finish_reason=self.finish_reason, ttft=ttft, total_time=end - self.submit_time,
                          error=self.error, matched_stop=self.matched_stop if self.finish_reason in ("eos", "stop")
                          else None, retractions=max(0, len(self.admissions) - 1))


def stream_safe_len(text: str, stop: Sequence[str], finished: bool) -> int:
    """How much of `text` can be streamed now: all of it once finished; before that, everything
    but an incomplete UTF-8 tail (decoded as U+FFFD) and the longest suffix that could still grow
    into a stop string. Holding back only that keeps the stream a prefix of the final text."""
    if finished:
        return len(text)
    end = len(text)
    while end and text[end - 1] == "\ufffd" and len(text) - end < 4:  # a UTF-8 character is at most 4 bytes
        end -= 1
    hold = 0
    for s in stop:
        hold = max(hold, _stop_prefix_held(text, end, s, hold))
    return end - hold


def _stop_prefix_held(text: str, end: int, s: str, beyond: int) -> int:
    """The longest k (beyond < k < len(s)) with text[:end] ending in s[:k], else 0. Such a suffix starts
    where s's first character sits and ends in s[k - 1], so only those places are compared, longest first
    (str.find and startswith run in C), instead of every k with a slice each (quadratic in len(s) at
    every token, while the engine lock is held)."""
    last = text[end - 1] if end else ""
    j = text.find(s[0], max(0, end - len(s) + 1), end)
    while j != -1 and end - j > beyond:
        if s[end - j - 1] == last and s.startswith(text[j:end]):
            return end - j
        j = text.find(s[0], j + 1, end)
    return 0


class RequestHandle:
    """What `Engine.submit` returns: wait for the result or stream the text as it comes."""

    def __init__(self, req: Request) -> None:
        self._req = req
        self.rid = req.rid

    def done(self) -> bool:
        return self._req.done.is_set()

    def partial_text(self) -> str:
        """The text generated so far (all of it once done): what Ctrl-C in the CLI prints."""
        return self._req.output_text

    def partial_ids(self, upto: Optional[int] = None) -> list[int]:
        """The token ids generated so far, or the first `upto` of them (a copy): how far a running request got."""
        return self._req.output_ids[:upto]

    def cached_tokens(self) -> int:
        """Prompt tokens its (first) admission found in the radix cache; 0 before it is admitted."""
        return self._req.cached_tokens or 0

    def result(self, timeout: Optional[float] = None) -> Completion:
        if not self._req.done.wait(timeout):
            raise TimeoutError(f"request {self.rid} did not finish within {timeout} s "
                               f"(is the engine loop started? call Engine.start() or Engine.step())")
        return self._req.completion()

    def stream_available(self) -> str:
        """The streamed text that has arrived and not been read yet, without waiting."""
        parts = []
        while True:
            try:
                piece = self._req.stream_queue.get_nowait()
            except queue.Empty:
                return "".join(parts)
            if piece is None:
                self._req.stream_queue.put(None)  # keep the end marker for stream()
                return "".join(parts)
            parts.append(piece)

    def stream(self, timeout: Optional[float] = None) -> Iterator[Piece]:
        """Text deltas as tokens arrive; ends when the request finishes or is aborted."""
        while True:
            piece = self._req.stream_queue.get(timeout=timeout)
            if piece is None:
                return
            yield piece
