"""EngineHost: the one engine a server serves, its queue positions, who owns each request, and rebuilds.

Admission: every engine request holds one of `max_queue_requests` queue positions, taken with
`reserve` before anything is tokenized (503 with Retry-After when none is left, while rebuilding
or while draining for shutdown). One HTTP request reserves at most `max_request_share` positions
and feeds its prompts through them, so a request with 300 prompts cannot take the whole queue.

Tokenizing (`prepare`) takes no lock: the engine is fixed while positions are reserved (a rebuild
or a flush waits for none to be held). A prompt whose length in characters alone proves it can
never fit is refused before the tokenizer sees it.

Every request the server submits goes through `submit`, which starts a watcher thread that drains
the request's `RequestHandle.stream()` (a blocking queue) and hands pieces to a callback (the routes
hop them onto the event loop with `call_soon_threadsafe`). Each request is owned by the caller
that submitted it: only that caller (or the admin) may abort it or read its tokens.
"""
from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.request import Completion, Piece, RequestHandle
from core.engine.sampling import SamplingParams
from core.server.auth import Caller
from core.server.errors import APIError
from core.server.model_store import ModelRoots, default_roots, release_memory
from core.server.prompt_size import counted_messages, prompt_chars, tokens_per_message
from core.server.prometheus import ServerMetrics

EngineFactory = Callable[[EngineConfig], Engine]
OnPiece = Optional[Callable[[Piece, RequestHandle], None]]   # (text piece, the request it came from)
OnDone = Optional[Callable[[Optional[Completion], Optional[str]], None]]   # (completion, why it was aborted)
KEEP_OWNERS = 4096           # owners remembered for finished requests, besides every running one's
QUIET_GRACE_S = 2.0          # a request that just ended gives its queue position back a moment after its answer
BYTES_MARGIN = 2             # a prompt is refused unread only past twice what could ever fit
SHUTDOWN, CLIENT_ABORT, DISCONNECT = "shutdown", "aborted", "disconnect"


def new_id(prefix: str) -> str:
    """An unguessable id (96 random bits): knowing one request's id says nothing about another's."""
    return f"{prefix}-{secrets.token_hex(12)}"


class EngineHost:
    def __init__(self, engine: Engine, factory: Optional[EngineFactory] = None, model: str = "default",
                 served_model_name: Optional[str] = None, max_queue_requests: int = 1024,
                 kv_events_config: Optional[str] = None, model_roots: Optional[ModelRoots] = None,
                 max_request_share: Optional[int] = None) -> None:
        self.engine = engine
        self.kv_events_config = kv_events_config
        self.kv_publisher = self._publish(engine)     # a bad config raises ValueError before serving
        self.factory = factory
        self.model = model
        self._served_name = served_model_name
        self.max_queue_requests = max_queue_requests
        self.max_request_share = min(max_queue_requests, max_request_share or max(1, max_queue_requests // 8))
        self.model_roots = model_roots or ModelRoots(default_roots(model), model)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)   # notified when a request leaves or a position frees
        self.inflight: dict[str, RequestHandle] = {}
        self.reserved = 0
        self.draining = False
        self.owners: "OrderedDict[str, str]" = OrderedDict()
        self.runs: dict[str, tuple[Optional[str], Any]] = {}   # response id -> (owner identity, its ChoiceRun)
        self.abort_reasons: dict[str, str] = {}
        self._rebuilding = False
        self._size_limits: dict[str, tuple[int, Optional[int], int]] = {}
        self.generation = 0          # bumps on rebuild and flush: part of version()
        self.metrics = ServerMetrics(self)

    @property
    def served_model_name(self) -> str:
        return self._served_name or self.model

    def config(self) -> dict[str, Any]:
        """The served engine's settings (EngineConfig as a dict), under the model name it was asked for."""
        return {**self.engine.config.as_dict(), "model": self.model}

    def version(self) -> int:
        e = self.engine
        return hash((id(e), self.generation, e.version()))

    def _publish(self, engine: Engine):
        """KV cache events of `engine` on ZMQ (--kv-events-config, SGLang's JSON), or None."""
        if not self.kv_events_config:
            return None
        from core.kv_events.publish_config import attach_publisher
        return attach_publisher(engine, self.kv_events_config)

    # ----- admission ---------------------------------------------------------------------------
    def reserve(self, n: int) -> Engine:
        """Hold `n` queue positions (503 when the server cannot take them now); the engine they are for."""
        with self._lock:
            if self.draining:
                raise APIError(503, "the server is shutting down and takes no new requests; retry on another "
                                    "replica or after it restarts", code="server_shutting_down")
            if self._rebuilding:
                raise APIError(503, "the engine is being rebuilt with new settings; retry in a few seconds")
            if self.reserved + n > self.max_queue_requests:
                raise APIError(503, f"the server has {self.reserved} requests in flight and {n} more would pass its "
                                    f"limit (--max-queue-requests {self.max_queue_requests}); retry later",
                               code="queue_full")
            self.reserved += n
            return self.engine

    def release(self, n: int) -> None:
        with self._lock:
            self.reserved = max(0, self.reserved - n)
            self._changed.notify_all()

    def _limits(self, engine: Engine) -> tuple[int, Optional[int], int]:
        """(tokens a prompt may hold, the characters past which text cannot fit, the fewest tokens the chat
        template adds for a message), worked out once per engine (by instance id: a rebuilt engine may take the
        freed one's address). A token is at most the vocabulary's longest piece in bytes, a character at least
        one byte."""
        key = engine.instance_id
        if key not in self._size_limits:
            fits = min(engine.allocator.num_slots, engine.runner.max_context_len)
            tok = engine.tokenizer
            chars, each = None, 0
            if tok is not None:
                longest = max((len(p.encode("utf-8", "replace")) for p in tok.get_vocab()), default=1)
                chars, each = BYTES_MARGIN * max(longest, 1) * fits, tokens_per_message(engine.tokenize)
            self._size_limits = {key: (fits, chars, each)}
        return self._size_limits[key]

    def char_limit(self, engine: Engine) -> Optional[int]:
        """Characters past which a text prompt cannot fit this engine, whatever it tokenizes to."""
        return self._limits(engine)[1]

    def check_chars(self, engine: Engine, chars: int, prompt_param: str = "prompt") -> None:
        """400 context_length_exceeded when `chars` characters of text are more than any prompt `engine` can hold,
        said before a tokenizer spends seconds on them."""
        limit = self.char_limit(engine)
        if limit is not None and chars > limit:
            raise APIError(400, f"the {prompt_param} has {chars:,} characters, more than any prompt this engine can "
                                f"hold ({limit:,} at most: {engine.allocator.num_slots:,} slots); shorten it",
                           prompt_param, "context_length_exceeded")

    def check_size(self, engine: Engine, prompt: Any, prompt_param: str = "prompt") -> None:
        """check_chars, and for a chat: 400 context_length_exceeded when it has more user and assistant messages
        than any prompt of `engine` can hold, at the fewest tokens its template adds for one."""
        self.check_chars(engine, prompt_chars(prompt), prompt_param)
        n = counted_messages(prompt)
        fits, _, each = self._limits(engine) if n else (0, None, 0)
        if each and n * each > fits:
            raise APIError(400, f"the chat has {n:,} user and assistant messages, and the chat template adds at "
                                f"least {each} tokens for each: more than any prompt this engine can hold "
                                f"({fits:,} tokens); send fewer messages", prompt_param, "context_length_exceeded")

    def prepare(self, engine: Engine, prompt: Any, prompt_param: str = "prompt") -> tuple[list[int], int]:
        """(token ids, prompt length) of `prompt`, tokenized without any lock; 400 context_length_exceeded
        when its text alone proves it can never fit (as OpenAI answers a prompt over the context), 400 (naming
        `prompt_param`) when the engine refuses it."""
        self.check_size(engine, prompt, prompt_param)
        try:
            ids, _ = engine.tokenize(prompt)
        except ValueError as exc:
            raise APIError(400, str(exc), prompt_param) from exc
        return ids, len(ids)

    # ----- requests ----------------------------------------------------------------------------
    def submit(self, engine: Engine, ids: list[int], params: SamplingParams, extra_key: Optional[str],
               caller: Caller, rid: str, on_piece: OnPiece = None, on_done: OnDone = None,
               internal: bool = False) -> RequestHandle:
        """Queue token ids on `engine` under a reserved position (ValueError: the engine's verdict), in the
        caller's cache namespace, owned by the caller. `internal` (the health probe): no owner to remember and
        nothing counted in /metrics, as SGLang sends its probe with log_metrics off."""
        handle = engine.submit(ids, params, rid=rid, extra_key=caller.cache_key(extra_key))
        with self._lock:
            self.inflight[handle.rid] = handle
            if not internal:
                self.owners[handle.rid] = caller.identity
                self._forget_finished_owners()
        threading.Thread(target=self._watch, args=(handle, on_piece, on_done, internal), daemon=True,
                         name=f"radix-watch-{handle.rid}").start()
        return handle

    def _forget_finished_owners(self) -> None:
        """Keep the owner of every request in flight, however many newer ones came since (else its owner could no
        longer abort it or read its tokens), and of the newest KEEP_OWNERS finished ones. Caller holds the lock."""
        excess = len(self.owners) - len(self.inflight) - KEEP_OWNERS
        stale: list[str] = []
        for rid in self.owners if excess > 0 else ():       # oldest first; running ones are skipped
            if rid not in self.inflight:
                stale.append(rid)
                if len(stale) == excess:
                    break
        for rid in stale:
            del self.owners[rid]

    def _watch(self, handle: RequestHandle, on_piece: OnPiece, on_done: OnDone, internal: bool = False) -> None:
        completion: Optional[Completion] = None
        try:
            for piece in handle.stream():
                # the finishing token's text: the completion carries it, as a stream's last chunk
                if on_piece is not None and not piece.final:
                    on_piece(piece, handle)
            completion = handle.result()
        finally:
            with self._lock:   # by handle: a finished request's rid may be taken again (RequestTable.submit)
                mine = self.inflight.get(handle.rid) is handle
                if mine:
                    del self.inflight[handle.rid]
                reason = self.abort_reasons.pop(handle.rid, None) if mine else None
                self._changed.notify_all()
            if completion is not None and not internal:
                self.metrics.on_finish(completion)   # before on_done: a client that has its answer sees it counted
            if on_done is not None:
                on_done(completion, reason)

    def abort(self, rid: str, reason: str = CLIENT_ABORT) -> bool:
        with self._lock:
            if rid in self.inflight:
                self.abort_reasons.setdefault(rid, reason)
        return self.engine.abort(rid)

    def owned(self, caller: Caller, rid: str) -> list[str]:
        """The engine requests `rid` names (a request id, or an OpenAI response id: all its choices) that
        `caller` may act on; [] when there are none, whether or not someone else's exist. A caller without
        a key owns nothing: every keyless caller has the one identity "anonymous", so owning by it would let
        each read and abort the others' requests (a snapshot lists their ids)."""
        if not caller.owns_requests:
            return []
        with self._lock:
            names = [rid] if rid in self.owners else [r for r in self.owners if r.startswith(rid + "-")]
            return [r for r in names if caller.may_act_on(self.owners[r])]

    def abort_owned(self, caller: Caller, rid: str) -> Optional[bool]:
        """None when `caller` has no such request; else whether anything was still running."""
        n = self.abort_count(caller, rid)
        return None if n is None else n > 0

    def abort_count(self, caller: Caller, rid: str) -> Optional[int]:
        """Abort request `rid`, or every choice of response `rid` (those not submitted yet too); None when
        `caller` has no such request, else how many were still running or waiting to be submitted."""
        run = self._run_of(caller, rid)
        pending = run.cancel_pending() if run is not None else 0   # first: every choice submitted is in owners now
        names = self.owned(caller, rid)
        if run is None and not names:
            return None
        return sum(bool(self.abort(r, CLIENT_ABORT)) for r in names) + pending

    def add_run(self, response_id: str, caller: Caller, run: Any) -> None:
        """A multi-choice run by its response id, so an abort of the response reaches the choices it has not
        submitted yet (ChoiceRun.cancel_pending)."""
        with self._lock:
            self.runs[response_id] = (caller.identity if caller.owns_requests else None, run)

    def drop_run(self, response_id: str) -> None:
        with self._lock:
            self.runs.pop(response_id, None)

    def _run_of(self, caller: Caller, response_id: str) -> Any:
        with self._lock:
            owner, run = self.runs.get(response_id, (None, None))
        return run if run is not None and caller.may_act_on(owner) else None

    def abort_every_owned(self, caller: Caller) -> int:
        """Abort every request in flight that `caller` may act on (the admin: all); how many were still running."""
        with self._lock:
            runs = list(self.runs)
        pending = 0
        for response_id in runs:       # first: a choice these runs submitted is in inflight once this returns
            run = self._run_of(caller, response_id)
            if run is not None:
                pending += run.cancel_pending()
        with self._lock:
            rids = [r for r in self.inflight if caller.may_act_on(self.owners.get(r))]
        return sum(bool(self.abort(r, CLIENT_ABORT)) for r in rids) + pending

    def abort_all(self, reason: str = SHUTDOWN) -> None:
        for rid in list(self.inflight):
            self.abort(rid, reason)

    def health(self, failing: Optional[str] = None) -> tuple[int, dict[str, str]]:
        """(status code, body) of a health check: 200 while the engine serves; 503 in step mode (inference parked
        until someone steps), while draining for shutdown, or with `failing` (what a deeper check found)."""
        e = self.engine
        state = "draining" if self.draining else ("running" if e.running else "stepping")
        if state == "running" and failing:
            state = failing
        body = {"status": "ok" if state == "running" else state, "engine_loop": "running" if e.running else
                "stepping", "model": self.served_model_name}
        return (200 if state == "running" else 503), body

    # ----- draining (SIGTERM) --------------------------------------------------------------------
    def begin_drain(self) -> None:
        with self._lock:
            self.draining = True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no engine request is in flight; False when `timeout` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self.inflight, timeout)

    # ----- control -----------------------------------------------------------------------------
    def _check_quiet(self, what: str) -> None:
        """(Holding the lock.) 409 unless nothing is in flight or reserved, after a short grace: a client that
        has its answer may act before the request's watcher and its route have given everything back."""
        if not self._changed.wait_for(lambda: not self.inflight and not self.reserved, QUIET_GRACE_S):
            raise APIError(409, f"{max(len(self.inflight), self.reserved)} request(s) are in flight; wait for them "
                                f"to finish (or abort them) before {what}")

    def flush_cache(self) -> None:
        """Empty the tree; 409 while anything is in flight, and 200 only when every slot is free."""
        with self._lock:
            self._check_quiet("flushing the cache")
            self.metrics.sync_evictions()
            try:
                self.engine.reset_cache()
            except ValueError as exc:
                raise APIError(409, str(exc)) from exc
            a = self.engine.allocator
            if a.available() != a.num_slots:
                raise APIError(409, f"the cache is not empty after the flush ({a.num_slots - a.available()} slots "
                                    f"still held); retry when the engine is idle")
            self.generation += 1

    def rebuild(self, changes: dict[str, Any]) -> None:
        """Swap in an engine built from the current settings with `changes` (EngineConfig names); the old
        one keeps serving if the new one fails to build (ValueError -> 400, anything else -> 400 with its
        type), and is released once the new one serves."""
        if self.factory is None:
            raise APIError(409, "this server was given a fixed engine and cannot rebuild it")
        if not isinstance(changes, dict):
            raise APIError(400, "send the engine settings as a JSON object")
        if "model" in changes:
            self.model_roots.check(changes["model"], current=self.model)
        with self._lock:
            self._check_quiet("changing the engine's settings")
            if self._rebuilding:
                raise APIError(409, "a rebuild is already in progress")
            self._rebuilding = True
        try:
            try:
                config = EngineConfig.from_dict(changes, base=self.engine.config.replace(model=self.model))
                new = self.factory(config)
            except ValueError as exc:
                raise APIError(400, str(exc)) from exc
            except Exception as exc:
                raise APIError(400, f"could not build the engine: {type(exc).__name__}: {exc}") from exc
            with self._lock:
                self.metrics.sync_evictions()
                old, was_running = self.engine, self.engine.running
                self.engine, self.model = new, config.model
                self.generation += 1
                if self.kv_publisher is not None:      # free the ports, then follow the new cache
                    self.kv_publisher.close()
                    self.kv_publisher = self._publish(new)
            if was_running:
                new.start()
            old.stop()
            del old
            release_memory()
        finally:
            self._rebuilding = False

    def shutdown(self) -> None:
        self.abort_all(SHUTDOWN)
        self.engine.stop()
        if self.kv_publisher is not None:
            self.kv_publisher.close()
