"""The engine requests behind one OpenAI call (or one SGLang /generate call): a choice per (prompt, n), tokenized
once per prompt, fed to the engine through at most `max_request_share` queue positions, and ended the way they ended.

Building parameters, tokenizing, submitting and aborting run on the worker pool, never on the event loop. The
engine request of choice i is `<response id>-<i>`, so the response id (which a stream's first chunk carries) names
them all to the abort routes; the host knows each run by its response id, so an abort of the whole response, or
of all of a caller's requests, also ends the choices not submitted yet. A choice that ends by an abort answers,
on the OpenAI routes, with an OpenAI error, not 200 with finish_reason "abort" (which is not an OpenAI finish
reason): 503 `server_shutting_down` when the server drained it at shutdown, 400 `request_aborted` when its owner
(or the admin) aborted it; a stream ends with that error as an event, then `data: [DONE]`. (SGLang's /generate
answers an owner's abort with what the choice had: native_routes.py.)
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from fastapi import Request

from core.engine import inputs
from core.engine.request import Completion, Piece, RequestHandle
from core.engine.sampling import ParamError, SamplingParams
from core.server.auth import Caller
from core.server.cpu_pool import CpuPool
from core.server.errors import APIError
from core.server.host import CLIENT_ABORT, DISCONNECT, SHUTDOWN, EngineHost
from core.server.openai_protocol import MAX_CHOICES

DISCONNECT_POLL_S = 0.5


_CANCEL = object()     # posted by cancel_pending: end the choices not submitted yet


@dataclass
class Event:
    """What happened to one choice: a text piece (with the token ids generated and the prompt tokens found cached
    when it was sent), or its end (the completion, None if it never finished, and why it was aborted)."""
    choice: int
    text: Optional[str] = None
    ids: list[int] = field(default_factory=list)
    cached: int = 0
    tokens: int = 0                 # a piece's: the tokens generated when it was sent
    completion: Optional[Completion] = None
    reason: Optional[str] = None

    @property
    def is_piece(self) -> bool:
        return self.text is not None


@dataclass
class Choice:
    index: int
    prompt_index: int
    ids: list[int]
    params: SamplingParams
    key: Optional[str] = None       # its cache namespace (cache_salt / extra_key)


def fit_error(host: EngineHost, engine, n_ids: int, params: SamplingParams, prompt_param: str,
              max_param: str) -> Optional[APIError]:
    """Why `n_ids` prompt tokens plus max_new_tokens cannot run on `engine` (naming the field to change). A
    logit_bias outside the vocabulary is the params' own error: ChoiceRun checks it once per sampling spec, and
    Engine.submit checks every request."""
    pool, ps = engine.allocator.num_slots, engine.allocator.page_size
    context = engine.runner.max_context_len
    if n_ids > pool:
        return APIError(400, f"prompt of {n_ids:,} tokens does not fit a pool of {pool:,} slots; shorten the "
                             f"{prompt_param}", prompt_param, "context_length_exceeded")
    if n_ids >= context:
        return APIError(400, f"prompt of {n_ids:,} tokens does not fit the model's context of {context:,} tokens; "
                             f"shorten the {prompt_param}", prompt_param, "context_length_exceeded")
    m = params.max_new_tokens
    need = n_ids + m - 1
    if need + (-need) % ps > pool:
        return APIError(400, f"prompt of {n_ids:,} tokens plus {max_param}={m:,} needs {need:,} slots, more than the "
                             f"pool's {pool:,}; lower {max_param} to at most {room(engine, n_ids):,}", max_param,
                        "context_length_exceeded")
    if n_ids + m > context:
        return APIError(400, f"prompt of {n_ids:,} tokens plus {max_param}={m:,} exceeds the model's context of "
                             f"{context:,} tokens; lower {max_param} to at most {room(engine, n_ids):,}", max_param,
                        "context_length_exceeded")
    return None


def room(engine, n_ids: int) -> int:
    """The most new tokens a prompt of `n_ids` may ask for: to the end of the model's context and of the pool
    (fit_error's two limits), as SGLang clamps an unset max_tokens to the context."""
    return min(engine.runner.max_context_len - n_ids, engine.allocator.num_slots - n_ids + 1)


def abort_error(rid: str, reason: Optional[str], c: Optional[Completion]) -> APIError:
    """How a choice that did not finish normally is answered."""
    if c is not None and c.error:
        return APIError(500, f"the engine failed this request: {c.error}", code="engine_error")
    if reason == SHUTDOWN:
        return APIError(503, "the server is shutting down and ended this request before it finished; retry it",
                        code="server_shutting_down", headers={"Retry-After": "5"})
    if reason == CLIENT_ABORT:
        got = len(c.token_ids) if c is not None else 0
        return APIError(400, f"request {rid} was aborted (POST /state/requests/{{id}}/abort) after {got} "
                             f"token(s)", code="request_aborted")
    return APIError(500, "the request ended without a result; see the server log", code="engine_error")


class RunBody(Protocol):
    """What a run reads of a request body: openai_protocol's SamplingFields, native_protocol's GenerateRequest."""

    @property
    def choices_per_prompt(self) -> int: ...
    def params(self, choice: int = 0, prompt: int = 0) -> SamplingParams: ...
    def open_ended(self, prompt: int = 0) -> bool: ...
    def sampling_key(self, prompt: int = 0) -> int: ...
    def namespace(self, prompt: int = 0) -> Optional[str]: ...
    def max_tokens_param(self) -> str: ...
    def param_error(self, exc: ParamError) -> APIError: ...


class ChoiceRun:
    def __init__(self, host: EngineHost, pool: CpuPool, caller: Caller, body: RunBody, response_id: str,
                 stream: bool, with_ids: bool = False) -> None:
        self.host, self.pool, self.caller, self.body = host, pool, caller, body
        self.response_id, self.stream = response_id, stream
        self.with_ids = with_ids       # a piece carries the token ids so far (SGLang's cumulative chunks)
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[Choice] = []
        self.handles: dict[int, RequestHandle] = {}
        self.done: dict[int, Completion] = {}
        self.reserved = 0
        self.next = 0
        self.closed = False
        self.cancelled = False          # its owner aborted the whole response (cancel_pending)
        # Submitting a choice and cancelling the rest exclude each other, so an abort of the response sees each
        # choice either in the engine (the host's inflight) or not submitted yet, never between the two.
        self._submit_lock = threading.Lock()
        self.engine = None
        self.tasks: set[asyncio.Task] = set()
        self._asked = time.monotonic()  # when next_event last asked whether the client is still there

    # ----- start ---------------------------------------------------------------------------------
    async def start(self, prompts: list, prompt_param: str) -> None:
        """Reserve queue positions, tokenize, check every choice fits, submit the first window."""
        n = self.body.choices_per_prompt
        total = len(prompts) * n
        if total > MAX_CHOICES:
            raise APIError(400, f"{len(prompts):,} prompts x n={n} is {total:,} choices, more than {MAX_CHOICES:,} in "
                                f"one request; split it", prompt_param, "invalid_value")
        params = await self.pool.run(self._params, len(prompts), n, self.host.engine.runner.vocab_size)
        keys = [self.body.namespace(pi) for pi in range(len(prompts))]
        self.engine = self.host.reserve(min(total, self.host.max_request_share))
        self.reserved = min(total, self.host.max_request_share)
        try:
            tokenized = await self.pool.run(self._tokenize_all, prompts, prompt_param)
            max_param = self.body.max_tokens_param()
            for pi, ids in enumerate(tokenized):
                for j in range(n):
                    p = params[pi][j]
                    if self.body.open_ended(pi):    # min_new_tokens clipped to the room too, as SGLang does
                        most = max(1, room(self.engine, len(ids)))
                        p = dataclasses.replace(p, max_new_tokens=most, min_new_tokens=min(p.min_new_tokens, most))
                    err = fit_error(self.host, self.engine, len(ids), p, prompt_param, max_param)
                    if err is not None:
                        raise err
                    self.choices.append(Choice(len(self.choices), pi, ids, p, keys[pi]))
            self.host.add_run(self.response_id, self.caller, self)
            for _ in range(self.reserved):
                await self._submit_next()
        except BaseException:
            self.close()
            raise

    def _params(self, prompts: int, n: int, vocab_size: int) -> list[list[SamplingParams]]:
        """Validated params of every choice, built once per distinct sampling spec (an OpenAI body has one: a
        batch of 2,048 prompts with a 1,024-entry logit_bias builds n of them, not 2,048 n)."""
        built: dict[tuple[int, int], SamplingParams] = {}
        out = []
        for pi in range(prompts):
            row = []
            for j in range(n):
                key = (self.body.sampling_key(pi), j)
                if key not in built:
                    p = self.body.params(j, pi)
                    try:
                        inputs.check_logit_bias(p, vocab_size)
                    except ParamError as exc:
                        raise self.body.param_error(exc) from None       # named as the client named it
                    built[key] = p
                row.append(built[key])
            out.append(row)
        return out

    def _tokenize_all(self, prompts: list, prompt_param: str) -> list[list[int]]:
        return [self.host.prepare(self.engine, p, prompt_param)[0] for p in prompts]

    def cancel_pending(self) -> int:
        """(Any thread.) Its owner aborted the whole response: the choices not submitted yet end as aborted,
        with nothing generated, instead of being submitted as the others end. How many there were; every choice
        submitted before this returned is in the host's inflight, for the caller to abort."""
        with self._submit_lock:
            if self.cancelled:
                return 0
            self.cancelled = True
            pending = len(self.choices) - self.next
        self._post(_CANCEL)
        return pending

    def _cancel_now(self) -> None:
        with self._submit_lock:
            never_sent, self.next = self.choices[self.next:], len(self.choices)
        for c in never_sent:
            never = Completion(rid=f"{self.response_id}-{c.index}", text="", token_ids=[], prompt_tokens=len(c.ids),
                               cached_tokens=0, finish_reason="abort", ttft=None, total_time=0.0)
            self.queue.put_nowait(Event(c.index, completion=never, reason=CLIENT_ABORT))

    async def _submit_next(self) -> None:
        try:
            await self.pool.run(self._submit_one)
        except ParamError as exc:
            raise self.body.param_error(exc) from None
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    def _submit_one(self) -> None:
        """(Worker pool.) Submit the next choice, unless none is left or the response was closed or cancelled."""
        with self._submit_lock:
            if self.closed or self.cancelled or self.next >= len(self.choices):
                return
            c = self.choices[self.next]
            self.next += 1
            rid = f"{self.response_id}-{c.index}"
            on_done = lambda comp, reason, i=c.index: self._post(Event(i, completion=comp, reason=reason))  # noqa
            self.handles[c.index] = self.host.submit(self.engine, c.ids, c.params, c.key, self.caller, rid,
                                                     self._on_piece(c.index), on_done)

    def _on_piece(self, i: int) -> Optional[Callable[[Piece, RequestHandle], None]]:
        """What a streamed choice does with each text piece; with ids, the ones generated up to that piece."""
        if not self.stream:
            return None
        return lambda t, h: self._post(Event(i, t, h.partial_ids(t.tokens) if self.with_ids else [], h.cached_tokens(),
                                             t.tokens))

    def _refill(self) -> None:
        if self.next < len(self.choices) and not self.closed and not self.cancelled:
            task = asyncio.ensure_future(self._submit_next())
            self.tasks.add(task)
            task.add_done_callback(self._refilled)

    def _refilled(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._post(task.exception())

    def _post(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shutting down): nobody is listening
            pass

    # ----- consuming ---------------------------------------------------------------------------------
    async def next_event(self, request: Optional[Request] = None) -> Event:
        """The next piece or end of a choice; raises the error a refill met. With `request`, polls for a client
        that went away (-> 499, everything aborted)."""
        while True:
            # asked every DISCONNECT_POLL_S however fast the events come: a batch whose answers kept arriving
            # never timed out below, so a client that left it was never noticed (2,000 prompts ran on 40 s)
            if request is not None and time.monotonic() - self._asked >= DISCONNECT_POLL_S:
                self._asked = time.monotonic()
                if await request.is_disconnected():
                    self.close()
                    raise APIError(499, "the client closed the connection; its requests were aborted") from None
            try:
                item = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S) if request else \
                    await self.queue.get()
            except asyncio.TimeoutError:
                continue
            if item is _CANCEL:
                self._cancel_now()
                continue
            if isinstance(item, BaseException):
                raise item
            if not item.is_piece:
                self.done[item.choice] = item.completion
                self._refill()
            return item

    def finished(self, i: int, c: Optional[Completion], reason: Optional[str]) -> Completion:
        if c is None or c.error or c.finish_reason == "abort":
            raise abort_error(f"{self.response_id}-{i}", reason, c)
        return c

    async def wait_all(self, request: Request) -> list[Completion]:
        while len(self.done) < len(self.choices):
            e = await self.next_event(request)
            self.finished(e.choice, e.completion, e.reason)
        return [self.done[i] for i in range(len(self.choices))]

    def close(self) -> None:
        """Abort what still runs (on the worker pool) and give back the queue positions; idempotent."""
        with self._submit_lock:      # a choice being submitted now is in handles once this lock is ours
            if self.closed:
                return
            self.closed = True
            handles = list(self.handles.items())
        self.host.drop_run(self.response_id)
        for t in self.tasks:
            t.cancel()
        for i, h in handles:
            if i not in self.done and not h.done():
                self.pool.fire(self.host.abort, h.rid, DISCONNECT)
        self.host.release(self.reserved)
        self.reserved = 0
