"""Engine: submit / step / background loop over a real model, the radix cache and the slot pool.

`step()` is one deterministic scheduler step (tests and the walkthrough drive it by hand);
`start()` runs the same steps in a thread so callers (the dashboard, the CLI) never block on
generation. Everything a viewer needs comes out of `snapshot()` as an immutable value.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import time
import traceback
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache
from core.engine import engine_snapshot, generate, inputs
from core.engine.config import EngineConfig
from core.engine.engine_loop import EngineLoop
from core.engine.engine_metrics import EngineGauges, EngineMetrics
from core.engine.inputs import Prompt
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.runner import ModelRunner
from core.engine.request import ABORTED, Completion, Request, RequestHandle
from core.engine.request_table import RequestTable
from core.engine.sampling import SamplingParams, sample_isolated
from core.engine.scheduler import Scheduler
from core.engine.sigint_guard import SigintGuard
from core.engine.special_stops import special_stops, special_texts
from core.engine.step_budget import FLOOR_FACTOR, StepBudget
from core.observe import snapshot as snap
from core.observe.invariants import check_cache_invariants
from core.observe.token_bytes import token_bytes

SNAPSHOT_WAIT_S = 2.0        # longest a stale reader waits for the running step to publish
WATCH_S = 5.0                # a viewer that read a snapshot this recently gets one published after every step


class Engine:
    def __init__(self, model: Union[str, ModelRunner] = "default", config: Optional[EngineConfig] = None,
                 **settings: Any) -> None:
        """`model`: a name or path (loaded here) or a loaded ModelRunner. `settings`: any EngineConfig field
        (pool_slots=..., eviction_policy=...), applied over `config` (default: EngineConfig's defaults).
        Every setting is checked before the model loads."""
        config = (config or EngineConfig()).replace(**settings)
        if isinstance(model, (str, os.PathLike)):
            config = config.replace(model=os.fspath(model))
        self.config = config = config.validate()
        self.runner = model if isinstance(model, ModelRunner) else inputs.load_model(
            model, config.device, config.model_impl, config.dtype, config.kv_cache_dtype, not config.disable_cuda_graph)
        # what runs, as it runs (a runner built elsewhere brings its own code path and numerics)
        self.config = config = config.replace(model_impl=self.runner.impl, dtype=self.runner.numerics,
                                              kv_cache_dtype=self.runner.kv_cache_dtype)
        self.tokenizer = self.runner.tokenizer
        self._special_texts = special_texts(self.tokenizer)
        self.device = self.runner.device
        pool_slots, page_size = config.pool_slots, config.page_size
        self.pool = inputs.make_pool(self.runner, pool_slots, page_size)
        # the slot bookkeeping (allocator, tree, requests' slots) stays on the CPU whatever the model's device, so
        # one code path runs everywhere; ForwardBatch.build copies a step's slots to the pool's device
        self.allocator = SlotAllocator(pool_slots, device="cpu", page_size=page_size)
        self.cache = RadixCache(self.allocator, page_size=page_size, eviction_policy=config.eviction_policy,
                                disable=config.disable_radix_cache, event_capacity=config.event_capacity)
        self.cache.events.budget_bytes = config.event_budget_bytes
        self.scheduler = Scheduler(self.cache, self.allocator, config.schedule_policy, config.max_running_requests,
                                   config.max_prefill_tokens)
        self.step_budget = StepBudget(config.max_prefill_tokens, config.mixed_step_ratio,
                                      rows_computed=self.runner.rows_computed,
                                      floor_factor=1.0 if self.runner.cuda_graph else FLOOR_FACTOR)
        self.metrics = EngineMetrics()
        self.step_count = 0
        self.instance_id = secrets.token_hex(8)   # in every snapshot: a viewer tells a replaced engine by it
        self.last_error: Optional[str] = None
        size = pool_slots + page_size
        self.slot_tokens = np.full(size, -1, dtype=np.int64)   # last token written per slot
        self.k_norms = np.zeros((self.runner.num_layers, size), dtype=np.float32)
        # Lock discipline: `_lock` serialises engine state (a step, abort, snapshot); the request table's own
        # lock (request_table.py) is held only for a few dict/list operations, always after `_lock`.
        self.requests = RequestTable()
        self._lock = threading.RLock()
        self._ending: Optional[list[Request]] = None   # during a step: the requests it ended, told at its end
        self.loop = EngineLoop(self.step, self.requests, on_error=self._loop_error)
        self._version = 0
        # Publication: at the end of every step the engine publishes its gauges, and while someone read a
        # snapshot in the last WATCH_S seconds the whole snapshot too; readers take them without the lock.
        self._snap: Optional[snap.EngineSnapshot] = None
        self._gauges = EngineGauges(num_slots=self.allocator.num_slots, free_slots=self.allocator.available())
        self._watched_until = 0.0
        self._published = threading.Condition()
        self._pieces: dict[int, str] = {}

    # ----- submitting --------------------------------------------------------------------------
    def tokenize(self, prompt: Prompt) -> tuple[list[int], str]:
        """Raw text (with its tokenizer's special tokens, as SGLang reads text), token ids, or chat messages (the
        chat template): inputs.tokenize."""
        return inputs.tokenize(self.tokenizer, self.runner.vocab_size, prompt)

    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None, rid: Optional[str] = None,
               extra_key: Optional[str] = None) -> RequestHandle:
        """Queue a request (thread-safe). Bad input raises ValueError here and queues nothing.

        The request runs with a frozen copy of `params` made here: changing `params` afterwards
        affects only requests submitted later."""
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params = params.frozen()
        inputs.check_logit_bias(params, self.runner.vocab_size)
        inputs.check_rid(rid)
        inputs.check_extra_key(extra_key)
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
        req.special_stops = special_stops(self.tokenizer, params.stop, self._special_texts)
        req.generator = params.make_generator(self.device)
        self.requests.submit(req)
        return RequestHandle(req)

    def generate(self, prompts: Sequence[Prompt], params: Optional[SamplingParams] = None,
                 timeout: Optional[float] = None) -> list[Completion]:
        """Submit all, wait for all, all or nothing (generate.py)."""
        return generate.generate(self, prompts, params, timeout)

    def abort(self, rid: str) -> bool:
        """Release everything request `rid` holds, at any stage. False if it is unknown or done.

        A request still in the inbox holds nothing yet: it ends at once, without waiting for a running step
        (which holds the engine lock for its whole forward)."""
        req = self.requests.withdraw_queued(rid)
        if req is not None:   # viewers see it through the table (gauges count the inbox; version its changes)
            self.metrics.on_abort()
            self._complete(req, "abort", now=True)   # no step's lock held: maybe mid-step
            return True
        with self._lock, SigintGuard():   # a Ctrl-C waits until the slots are back (sigint_guard.py)
            req = self.requests.withdraw(rid)
            if req is None:
                return False
            try:
                self.scheduler.abort(req)
            finally:                  # its caller hears the end even when giving back its slots failed
                self.metrics.on_abort()
                self._complete(req, "abort")
                self._publish()
            return True

    # ----- stepping ----------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        for req in self.requests.take_inbox():
            self.scheduler.add(req)

    def has_work(self) -> bool:
        return bool(self.requests.queued() or self.scheduler.waiting or self.scheduler.running)

    def step(self) -> bool:
        """One scheduler step: admit, run one mixed batch, sample, cache. False when idle.

        A failure is confined to the request it belongs to (that request ends with `error` set and
        gives back its slots); a model failure fails the batch it ran. Nothing is left half-committed: on the
        main thread a Ctrl-C is held back while the tree, the slots and the requests change (sigint_guard.py)
        and raised in the model's forward or once the step is whole."""
        with self._lock, SigintGuard() as guard:
            self._ending = []
            try:
                return self._step_locked(guard)
            finally:
                # the requests this step ended are told only now, after its gauges and version are out: a
                # client that has its answer sees the step counted
                ending, self._ending = self._ending, None
                for req in ending:
                    self._signal(req)

    def _step_locked(self, guard: SigintGuard) -> bool:
        self._drain_inbox()
        sched = self.scheduler
        try:
            items = sched.schedule(self.step_budget.tokens(sched.decoding()))
        finally:
            failed = sched.take_failed()
            for req, exc in failed:
                self._fail(req, exc, released=True)
        if not items:
            if failed:
                self._after_step()
            return bool(failed)
        for it in items:
            if not it.req.counted:
                it.req.counted = True
                self.metrics.on_admit(len(it.req.prompt_ids), it.req.cached_tokens or 0)
        started = time.perf_counter()
        try:
            batch = ForwardBatch.build([(it.tokens, it.req.kv_slots, it.new_slots) for it in items],
                                       device=self.device,
                                       prompt=[it.req.computed < len(it.req.prompt_ids) for it in items])
            with guard.interruptible():   # writes only this batch's new slots; its failure path below
                logits = self.runner.forward(batch, self.pool)
            self._record_kv(batch)
        except BaseException as exc:  # a model failure fails this batch, not the engine; so does Ctrl-C
            for it in items:
                sched.drop(it)
                self._fail(it.req, exc)
            self._after_step()
            if not isinstance(exc, Exception):
                raise
            return True
        prefill = sum(max(0, min(len(it.req.prompt_ids), it.req.computed + len(it.tokens)) - it.req.computed)
                      for it in items)
        to_sample: list[tuple[int, Request]] = []
        committed, decodes = 0, 0
        got: set[int] = set()   # id() of the requests this step gave their token
        try:
            for i, it in enumerate(items):
                try:
                    if sched.commit(it):
                        if it.req.params.max_new_tokens == 0:
                            self._finish(it.req, "length")    # prefill only (SGLang's cache_prefix)
                        else:
                            to_sample.append((i, it.req))
                except Exception as exc:
                    self._fail(it.req, exc)
                committed = i + 1
            for req, tok in self._sample(logits, to_sample):
                try:
                    self._append_token(req, tok)
                    decodes += 1
                except Exception as exc:
                    self._fail(req, exc)
                got.add(id(req))
        except BaseException as exc:
            self._interrupted(items, committed, {id(r) for _, r in to_sample} - got, exc)
            raise
        self.metrics.on_step(prefill, decodes)
        singles = sum(1 for it in items if len(it.tokens) == 1)
        self.step_budget.observe(time.perf_counter() - started, batch.num_tokens - singles, singles)
        self._after_step()
        return True

    def _sample(self, logits: torch.Tensor, to_sample: list[tuple[int, Request]]) -> list[tuple[Request, int]]:
        """One token per request; a request whose sampling fails fails alone."""
        got, failed = sample_isolated(logits, [i for i, _ in to_sample], [r for _, r in to_sample],
                                      sorted(self.runner.eos_token_ids))
        for req, exc in failed:
            self._fail(req, exc)
        return got

    def _fail(self, req: Request, exc: BaseException, released: bool = False) -> None:
        """End `req` with an error and give back what it holds (uncached)."""
        self.last_error = f"{type(exc).__name__}: {exc}"
        if not released:
            try:
                self.scheduler.discard(req)
            except Exception:
                self.last_error += "; releasing it failed: " + traceback.format_exc(limit=2)
        req.error = self.last_error
        if req.finish_reason is None:
            self.metrics.on_abort()
            self._complete(req, "abort")

    def _interrupted(self, items: list, committed: int, unsampled: set[int], exc: BaseException) -> None:
        """Ctrl-C (step runs on the CLI's main thread) between a step's forward and its tokens: each request
        left half done (items from `committed` on; committed ones in `unsampled`, owed a token) ends with an
        error and gives back its slots."""
        for i, it in enumerate(items):
            if it.req.finish_reason is not None:
                continue
            if i >= committed:
                self.scheduler.drop(it)
                self._fail(it.req, exc)
            elif id(it.req) in unsampled:
                self._fail(it.req, exc)
        self._after_step()

    def _after_step(self) -> None:
        self.step_count += 1
        self.cache.tick()
        self._version += 1
        self._publish()

    def _publish(self) -> None:
        """End of a step (engine lock held): the gauges always; the snapshot while someone watches."""
        sched = self.scheduler
        self._gauges = EngineGauges(step=self.step_count, running=len(sched.running), waiting=len(sched.waiting),
                                    free_slots=self.allocator.available(), num_slots=self.allocator.num_slots,
                                    hit_rate_recent=self.metrics.recent_hit_rate())
        if time.monotonic() < self._watched_until:
            self._refresh_snapshot()

    def _record_kv(self, batch: ForwardBatch) -> None:
        slots = batch.out_slots
        self.slot_tokens[slots.cpu().numpy()] = batch.input_ids.cpu().numpy()
        norms = self.pool.k_norms(slots)
        self.k_norms[:, slots.cpu().numpy()] = norms.cpu().numpy()

    def _append_token(self, req: Request, tok: int) -> None:
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
            self.metrics.on_first_token(req.first_token_time - req.submit_time)
        reason = req.append_token(tok, self.runner.eos_token_ids, self._decode)
        if reason is not None:
            self._finish(req, reason)

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req)
        self.metrics.requests_finished += 1
        self._complete(req, reason)

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _complete(self, req: Request, reason: str, now: bool = False) -> None:
        """End `req`; its caller hears of it at once (`now`, or outside a step) or when the step ends."""
        req.finish_reason = reason
        req.finish_time = time.perf_counter()
        if reason == "abort":
            req.state = ABORTED
        self.requests.finished(req.rid)
        if now or self._ending is None:
            self._signal(req)
        else:
            self._ending.append(req)

    @staticmethod
    def _signal(req: Request) -> None:
        req.stream_queue.put(None)
        req.done.set()

    # ----- background loop (engine_loop.py) ---------------------------------------------------------
    def start(self) -> "Engine":
        self.loop.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.loop.stop(timeout)

    @property
    def running(self) -> bool:
        return self.loop.running

    def _loop_error(self, trace: str) -> None:
        self.last_error = trace

    # ----- control -----------------------------------------------------------------------------
    def reset_cache(self) -> None:
        """Empty the tree and free every slot; refused while requests hold slots."""
        with self._lock, SigintGuard():
            if self.scheduler.running:
                raise ValueError(f"{len(self.scheduler.running)} request(s) are running; "
                                 f"wait for them or abort them before resetting the cache")
            self.cache.reset()
            self.metrics.reset()
            self._version += 1
            self._publish()

    def check_invariants(self) -> None:
        with self._lock:
            check_cache_invariants(self.cache, self.scheduler.held_slots())

    # ----- views (the snapshot is built in engine_snapshot.py) ---------------------------------
    def version(self) -> int:
        """A number that changes whenever anything a viewer sees changed (requests, steps, the cache)."""
        return hash((self._version, self.requests.changes, self.cache.events.last_seq, self.step_count))

    def request_tokens(self, rid: str) -> Optional[dict]:
        """{"prompt_ids", "output_ids"} of a request still in the engine's table (the last finished ones
        stay), or None: a viewer walks the tree with them to show the path the request matched."""
        return self.requests.tokens(rid)

    def token_bytes(self, token_ids: Sequence[int]) -> list[bytes]:
        """Each token's raw bytes, so a viewer decodes whole runs (byte-level BPE splits characters)."""
        if self.tokenizer is None:
            return [str(int(t)).encode() for t in token_ids]
        return token_bytes(self.tokenizer, token_ids)

    def token_piece(self, tok: int) -> str:
        """A token decoded alone, once per distinct token (the snapshot's token_text)."""
        piece = self._pieces.get(tok)
        if piece is None:
            piece = self._pieces[tok] = self.tokenizer.decode([tok]) if self.tokenizer is not None else str(tok)
        return piece

    def gauges(self) -> EngineGauges:
        """Running, waiting, token usage and the recent hit rate as of the last finished step (never waits;
        `waiting` also counts requests submitted since, not yet drained into the scheduler)."""
        g = self._gauges
        inbox = self.requests.queued()
        return dataclasses.replace(g, waiting=g.waiting + inbox) if inbox else g

    def snapshot(self, wait: bool = True) -> snap.EngineSnapshot:
        """An immutable view of everything: the engine as of its last finished step.

        `wait=True` takes the engine lock and always describes the engine right now. With `wait=False`
        a viewer never waits behind a running step: it gets the snapshot the engine published at the end
        of its last step (reading marks the engine watched, so it publishes after every step from then
        on); only a snapshot older than the last finished step (nobody watched) waits for the next."""
        self._watched_until = time.monotonic() + WATCH_S
        if wait or self._snap is None:
            with self._lock:
                return self._refresh_snapshot()
        if self._lock.acquire(blocking=False):        # between steps: describe the engine right now
            try:
                return self._refresh_snapshot()
            finally:
                self._lock.release()
        with self._published:                         # a step is running: its end publishes (we watch now)
            self._published.wait_for(lambda: self._snap.step >= self.step_count or not self.running,
                                     timeout=SNAPSHOT_WAIT_S)
        return self._snap

    def _refresh_snapshot(self) -> snap.EngineSnapshot:
        """The snapshot of the engine now (engine lock held): rebuilt only when something changed."""
        version = self.version()
        if self._snap is None or self._snap.version != version:
            table, inbox = self.requests.listing()
            self._snap = engine_snapshot.build(self, table, inbox, version)
            with self._published:
                self._published.notify_all()
        return self._snap

    def events_since(self, seq: int, limit: Optional[int] = None) -> list:
        """Events after `seq`, oldest first; with `limit`, only the first `limit` of them."""
        return self.cache.events.since(seq, limit)
