"""Engine: submit / step / background loop over a real model, the radix cache and the slot pool.

`step()` is one deterministic scheduler step (tests and the walkthrough drive it by hand);
`start()` runs the same steps in a thread so callers (the dashboard, the CLI) never block on
generation. Everything a viewer needs comes out of `snapshot()` as an immutable value.
"""
from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import OrderedDict
from typing import Optional, Sequence, Union

import numpy as np
import torch

from core.forward_batch import ForwardBatch
from core.memory import SlotAllocator
from core.metrics import EngineMetrics
from core.model import ModelRunner
from core.radix_cache import RadixCache
from core.eviction import get_policy
from core.request import ABORTED, FINISHED, RUNNING, Completion, Request, RequestHandle
from core.sampling import SamplingParams, sample
from core.scheduler import SCHEDULE_POLICIES, Scheduler
from core import snapshot as snap

Prompt = Union[str, Sequence[int], Sequence[dict]]
DEFAULT_POOL_SLOTS = 8192
KEEP_FINISHED = 200
SWITCH_INTERVAL_S = 0.0002   # finished requests kept for the dashboard's request table


class Engine:
    def __init__(self, model: Union[str, ModelRunner] = "default", pool_slots: int = DEFAULT_POOL_SLOTS,
                 page_size: int = 1, eviction_policy: str = "lru", schedule_policy: str = "lpm",
                 device: str = "auto", max_running_requests: int = 32, max_prefill_tokens: int = 2048,
                 disable_radix_cache: bool = False, event_capacity: int = 100_000) -> None:
        get_policy(eviction_policy)  # fail fast, before a model load
        if schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"unknown schedule policy {schedule_policy!r}; choose one of: {', '.join(SCHEDULE_POLICIES)}")
        if not isinstance(pool_slots, int) or pool_slots < max(1, page_size):
            raise ValueError(f"pool_slots must be at least one page ({page_size}), got {pool_slots!r}; raise pool_slots")
        self.runner = model if isinstance(model, ModelRunner) else ModelRunner(model, device=device)
        self.tokenizer = self.runner.tokenizer
        self.device = self.runner.device
        self.pool = self.runner.make_pool(pool_slots, page_size)
        self.allocator = SlotAllocator(pool_slots, device=self.device, page_size=page_size)
        self.cache = RadixCache(self.allocator, page_size=page_size, eviction_policy=eviction_policy,
                                disable=disable_radix_cache, event_capacity=event_capacity)
        self.scheduler = Scheduler(self.cache, self.allocator, schedule_policy, max_running_requests,
                                   max_prefill_tokens)
        self.config = dict(pool_slots=pool_slots, page_size=page_size, eviction_policy=eviction_policy,
                           schedule_policy=schedule_policy, max_running_requests=max_running_requests,
                           max_prefill_tokens=max_prefill_tokens, disable_radix_cache=disable_radix_cache)
        self.metrics = EngineMetrics()
        self.step_count = 0
        self.last_error: Optional[str] = None
        size = pool_slots + page_size
        self.slot_tokens = np.full(size, -1, dtype=np.int64)   # last token written per slot
        self.k_norms = np.zeros((self.runner.num_layers, size), dtype=np.float32)
        self._requests: "OrderedDict[str, Request]" = OrderedDict()
        self._inbox: list[Request] = []
        self._lock = threading.RLock()
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._version = 0
        self._snap: Optional[tuple] = None
        self._pieces: dict[int, str] = {}

    # ----- submitting --------------------------------------------------------------------------
    def tokenize(self, prompt: Prompt) -> tuple[list[int], str]:
        """Raw text (no special tokens added), token ids, or chat messages (the chat template)."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt: type some text")
            if self.tokenizer is None:
                raise ValueError("this engine's model has no tokenizer; submit token ids")
            return list(self.tokenizer.encode(prompt, add_special_tokens=False)), prompt
        prompt = list(prompt)
        if not prompt:
            raise ValueError("empty prompt: pass at least one token or chat message")
        if all(isinstance(m, dict) for m in prompt):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("this model has no chat template; submit raw text instead")
            if any("role" not in m or "content" not in m for m in prompt):
                raise ValueError("chat messages need 'role' and 'content' keys")
            out = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = out["input_ids"] if hasattr(out, "keys") else out
            text = self.tokenizer.decode(ids) if self.tokenizer else ""
            return [int(t) for t in ids], text
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.runner.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.runner.vocab_size - 1})")
            text = self.tokenizer.decode(prompt) if self.tokenizer else ""
            return [int(t) for t in prompt], text
        raise ValueError("a prompt is a string, a list of token ids, or a list of chat messages {'role','content'}")

    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None, rid: Optional[str] = None,
               extra_key: Optional[str] = None) -> RequestHandle:
        """Queue a request (thread-safe). Bad input raises ValueError here and queues nothing."""
        params = params if params is not None else SamplingParams()
        params.validate()
        ids, text = self.tokenize(prompt)
        pool, ps = self.allocator.num_slots, self.allocator.page_size
        need = len(ids) + params.max_new_tokens - 1
        if len(ids) > pool:
            raise ValueError(f"prompt of {len(ids):,} tokens does not fit a pool of {pool:,} slots; raise pool_slots")
        if need + (-need) % ps > pool:
            raise ValueError(f"prompt of {len(ids):,} tokens plus max_new_tokens={params.max_new_tokens} needs "
                             f"{need:,} slots, more than the pool's {pool:,}; lower max_new_tokens or raise pool_slots")
        if len(ids) + params.max_new_tokens > self.runner.max_context_len:
            raise ValueError(f"prompt of {len(ids):,} tokens plus max_new_tokens={params.max_new_tokens} exceeds the "
                             f"model's context of {self.runner.max_context_len:,} tokens; shorten the prompt")
        req = Request(ids, params, text, rid, extra_key)
        req.generator = params.make_generator(self.device)
        with self._wake:
            if req.rid in self._requests:
                raise ValueError(f"request id {req.rid!r} is already in use; pick another rid")
            self._requests[req.rid] = req
            self._inbox.append(req)
            self._version += 1
            self._wake.notify()
        return RequestHandle(req)

    def generate(self, prompts: Sequence[Prompt], params: Optional[SamplingParams] = None,
                 timeout: Optional[float] = None) -> list[Completion]:
        handles = [self.submit(p, params) for p in prompts]
        if self._thread is None:
            while not all(h.done() for h in handles):
                if not self.step() and not all(h.done() for h in handles):
                    raise RuntimeError("engine is idle but requests are unfinished")
        return [h.result(timeout) for h in handles]

    def abort(self, rid: str) -> bool:
        """Release everything request `rid` holds, at any stage. False if it is unknown or done."""
        with self._lock:
            req = self._requests.get(rid)
            if req is None or req.state in (FINISHED, ABORTED):
                return False
            with self._wake:
                if req in self._inbox:
                    self._inbox.remove(req)
            self.scheduler.abort(req)
            self.metrics.requests_aborted += 1
            self._complete(req, "abort")
            return True

    # ----- stepping ----------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        with self._wake:
            new, self._inbox = self._inbox, []
        for req in new:
            self.scheduler.add(req)

    def has_work(self) -> bool:
        return bool(self._inbox or self.scheduler.waiting or self.scheduler.running)

    def step(self) -> bool:
        """One scheduler step: admit, run one mixed batch, sample, cache. False when idle."""
        with self._lock:
            self._drain_inbox()
            sched = self.scheduler
            items = sched.schedule()
            if not items:
                return False
            for it in items:
                if not it.req.counted:
                    it.req.counted = True
                    self.metrics.on_admit(len(it.req.prompt_ids), it.req.cached_tokens or 0)
            try:
                batch = ForwardBatch.build([(it.tokens, it.req.kv_slots, it.new_slots) for it in items],
                                           device=self.device)
                logits = self.runner.forward(batch, self.pool)
            except Exception as exc:  # a model failure fails this batch, not the engine
                self.last_error = f"{type(exc).__name__}: {exc}"
                for it in items:
                    sched.drop(it)
                    if it.req in sched.running:
                        sched.running.remove(it.req)
                    sched.release(it.req, cache_kv=False)
                    it.req.error = self.last_error
                    self._complete(it.req, "abort")
                self._after_step()
                return True
            self._record_kv(batch)
            prefill = sum(max(0, min(len(it.req.prompt_ids), it.req.computed + len(it.tokens)) - it.req.computed)
                          for it in items)
            to_sample = [(i, it.req) for i, it in enumerate(items) if sched.commit(it)]
            decodes = 0
            if to_sample:
                rows = torch.tensor([i for i, _ in to_sample], device=logits.device)
                toks = sample(logits[rows], [r.params for _, r in to_sample], [r.generator for _, r in to_sample])
                for (_, req), tok in zip(to_sample, toks):
                    decodes += 1
                    self._append_token(req, tok)
            self.metrics.on_step(prefill, decodes)
            self._after_step()
            return True

    def _after_step(self) -> None:
        self.step_count += 1
        self.cache.tick()
        self._version += 1

    def _record_kv(self, batch: ForwardBatch) -> None:
        slots = batch.out_slots
        self.slot_tokens[slots.cpu().numpy()] = batch.input_ids.cpu().numpy()
        norms = torch.linalg.vector_norm(self.pool.k_buffer[:, slots].float(), dim=(-2, -1))
        self.k_norms[:, slots.cpu().numpy()] = norms.cpu().numpy()

    def _append_token(self, req: Request, tok: int) -> None:
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
            self.metrics.on_first_token(req.first_token_time - req.submit_time)
        req.output_ids.append(tok)
        reason = None
        if tok in self.runner.eos_token_ids and not req.params.ignore_eos:
            reason = "eos"
        text = self._decode(req.output_ids)
        for s in req.params.stop:
            at = text.find(s)
            if at >= 0:
                text, reason = text[:at], "stop"
        if reason is None and len(req.output_ids) >= req.params.max_new_tokens:
            reason = "length"
        req.output_text = text
        # hold back what could still turn out to be the start of a stop string
        hold = 0 if reason is not None else max((len(s) - 1 for s in req.params.stop), default=0)
        safe = len(text) - hold
        if safe > req.streamed_len and text[:req.streamed_len] == req.streamed_text:
            req.stream_queue.put(text[req.streamed_len:safe])
            req.streamed_text = text[:safe]
        if reason is not None:
            self.scheduler.finish(req)
            self.metrics.requests_finished += 1
            self._complete(req, reason)

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _complete(self, req: Request, reason: str) -> None:
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        if reason == "abort":
            req.state = ABORTED
        req.stream_queue.put(None)
        req.done.set()
        self._version += 1
        done = [rid for rid, r in self._requests.items() if r.done.is_set()]
        for rid in done[:max(0, len(done) - KEEP_FINISHED)]:
            del self._requests[rid]

    # ----- background loop ---------------------------------------------------------------------
    def start(self) -> "Engine":
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        # The loop thread needs the GIL back after each of the ~1,000 torch ops of a forward; with
        # the default 5 ms switch interval a busy caller thread (a dashboard) stalls it for seconds.
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._loop, name="radix-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception:  # never let the loop die; record and keep serving
                self.last_error = traceback.format_exc(limit=3)
                busy = False
            if not busy:
                with self._wake:
                    if not self._inbox and not self._stop.is_set():
                        self._wake.wait(timeout=0.05)

    # ----- control -----------------------------------------------------------------------------
    def reset_cache(self) -> None:
        """Empty the tree and free every slot; refused while requests hold slots."""
        with self._lock:
            if self.scheduler.running:
                raise ValueError(f"{len(self.scheduler.running)} request(s) are running; "
                                 f"wait for them or abort them before resetting the cache")
            self.cache.reset()
            self.metrics.reset()
            self._version += 1

    def check_invariants(self) -> None:
        with self._lock:
            self.cache.check_invariants(self.scheduler.held_slots())

    # ----- views -------------------------------------------------------------------------------
    def token_piece(self, tok: int) -> str:
        if tok not in self._pieces:
            self._pieces[tok] = self.tokenizer.decode([tok]) if self.tokenizer is not None else str(tok)
        return self._pieces[tok]

    def snapshot(self, wait: bool = True) -> snap.EngineSnapshot:
        """An immutable view of everything; rebuilt only when something changed.

        With `wait=False` a viewer never stalls behind a running step: while a step holds the
        engine, it gets the view as of the previous step (the dashboard refreshes on time)."""
        if not self._lock.acquire(timeout=0.02 if not wait and self._snap is not None else -1):
            return self._snap[1]
        try:
            key = (self.cache.events.last_seq, self._version, self.step_count)
            if self._snap is not None and self._snap[0] == key:
                return self._snap[1]
            cache_view = self.cache.snapshot()
            held = self.scheduler.held_slots().cpu().numpy()
            states = snap.slot_states(cache_view, self.slot_tokens >= 0, held)
            pool = snap.PoolView(num_layers=self.runner.num_layers, num_slots=self.allocator.num_slots,
                                 page_size=self.allocator.page_size, states=snap.frozen_array(states),
                                 slot_tokens=snap.frozen_array(self.slot_tokens),
                                 k_norms=snap.frozen_array(self.k_norms))
            reqs = tuple(self._request_view(r) for r in self._requests.values())
            counts = np.bincount(states, minlength=len(snap.SLOT_STATES))
            metrics = self.metrics.as_dict(
                free_slots=self.allocator.available(), evictable_slots=int(counts[snap.EVICTABLE]),
                locked_slots=int(counts[snap.LOCKED] + counts[snap.IN_USE]), in_use_slots=int(counts[snap.IN_USE]),
                num_slots=self.allocator.num_slots, evicted_tokens=self.cache.evicted_tokens,
                waiting=len(self.scheduler.waiting) + len(self._inbox), running=len(self.scheduler.running),
                retractions=self.scheduler.retractions, step=self.step_count)
            toks = {t for n in cache_view.nodes for t in n.token_ids}
            for ev in self.cache.events.since(max(0, cache_view.seq - 2000)):  # evicted text stays nameable
                if ev.kind == "evict":
                    toks.update(ev.token_ids)
            toks.update(int(t) for t in np.unique(self.slot_tokens) if t >= 0)
            view = snap.EngineSnapshot(seq=cache_view.seq, step=self.step_count, cache=cache_view, pool=pool,
                                       requests=reqs, metrics=metrics,
                                       token_text={t: self.token_piece(t) for t in sorted(toks)})
            self._snap = (key, view)
            return view
        finally:
            self._lock.release()

    @staticmethod
    def _request_view(r: Request) -> snap.RequestView:
        c = r.completion()
        return snap.RequestView(rid=r.rid, state=r.state, prompt_tokens=len(r.prompt_ids),
                                cached_tokens=r.cached_tokens or 0, output_tokens=len(r.output_ids),
                                prompt_text=r.prompt_text, output_text=r.output_text,
                                finish_reason=r.finish_reason, ttft=c.ttft,
                                total_time=c.total_time if r.done.is_set() else None, error=r.error)

    def events_since(self, seq: int) -> list:
        return self.cache.events.since(seq)
