"""Engine metrics: hit rate (cumulative and recent), prefill computed vs skipped, throughput, TTFT."""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class EngineGauges:
    """What a scrape reads, as of the end of the engine's last step (published then, read without a lock)."""

    step: int = 0
    running: int = 0          # requests in the running batch
    waiting: int = 0          # requests queued (the scheduler's queue and the inbox)
    free_slots: int = 0
    num_slots: int = 0
    hit_rate_recent: float = 0.0

    @property
    def token_usage(self) -> float:
        """Share of KV slots not free (the tree and running requests), as SGLang's token_usage."""
        return (self.num_slots - self.free_slots) / self.num_slots if self.num_slots else 0.0


class EngineMetrics:
    def __init__(self, window: int = 20) -> None:
        self.window = window
        self._abort_lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prefill_computed = 0
        self.decode_tokens = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self._recent: deque[tuple[int, int]] = deque(maxlen=self.window)  # (cached, prompt) per admission
        self._ttfts: deque[float] = deque(maxlen=self.window)
        self._decode_times: deque[tuple[float, int]] = deque(maxlen=256)  # (time, tokens) per step

    def on_admit(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self._recent.append((cached_tokens, prompt_tokens))

    def on_abort(self) -> None:
        with self._abort_lock:   # an abort of a queued request counts without the engine lock
            self.requests_aborted += 1

    def on_step(self, prefill_tokens: int, decode_tokens: int) -> None:
        self.prefill_computed += prefill_tokens
        self.decode_tokens += decode_tokens
        self._decode_times.append((time.perf_counter(), decode_tokens))

    def recent_hit_rate(self) -> float:
        """Hit rate of the last `window` admissions (a glance; the counters give the true rate)."""
        recent_p = sum(p for _, p in self._recent)
        return sum(c for c, _ in self._recent) / recent_p if recent_p else 0.0

    def on_first_token(self, ttft: float) -> None:
        self._ttfts.append(ttft)

    def decode_tokens_per_s(self, horizon: float = 5.0) -> float:
        now = time.perf_counter()
        pts = [(t, n) for t, n in self._decode_times if now - t <= horizon]
        if len(pts) < 2:
            return 0.0
        span = pts[-1][0] - pts[0][0]
        return sum(n for _, n in pts[1:]) / span if span > 0 else 0.0

    def as_dict(self, free_slots: int, evictable_slots: int, locked_slots: int, in_use_slots: int,
                num_slots: int, evicted_tokens: int, waiting: int, running: int,
                retractions: int, step: int) -> dict[str, float]:
        last_ttft: Optional[float] = self._ttfts[-1] if self._ttfts else None
        return {
            "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "hit_rate_recent": self.recent_hit_rate(),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens_computed": self.prefill_computed,
            "prefill_tokens_skipped": self.cached_tokens,
            "decode_tokens": self.decode_tokens,
            "decode_tokens_per_s": self.decode_tokens_per_s(),
            "ttft_last": last_ttft if last_ttft is not None else float("nan"),
            "ttft_mean": sum(self._ttfts) / len(self._ttfts) if self._ttfts else float("nan"),
            "evicted_tokens": evicted_tokens,
            "free_slots": free_slots,
            "evictable_slots": evictable_slots,
            "locked_slots": locked_slots,
            "in_use_slots": in_use_slots,
            "num_slots": num_slots,
            "token_usage": (num_slots - free_slots) / num_slots if num_slots else 0.0,
            "waiting": waiting,
            "running": running,
            "requests_finished": self.requests_finished,
            "requests_aborted": self.requests_aborted,
            "retractions": retractions,
            "step": step,
        }
