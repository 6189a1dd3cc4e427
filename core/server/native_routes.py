"""SGLang's native routes: POST (or PUT) /generate, POST /abort_request and GET /health_generate, answered as SGLang
0.5.23 answers them, so SGLang's own clients (`bench_serving --backend sglang`, the default; its frontend language;
sglang-router forwarding /generate; scripts written against SGLang's docs) run unchanged.

/generate takes `text` or `input_ids` (one prompt, or a list for a batch) and `sampling_params`
(native_protocol.py). One prompt with n = 1 answers one object, anything else a list, prompt by prompt and sample
by sample:

    {"text": ..., "output_ids": [...], "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
     "cached_tokens", "reasoning_tokens", "num_retractions", "weight_version", "e2e_latency"}}

`finish_reason` is SGLang's object: {"type": "length", "length": n}, {"type": "stop", "matched": the stop string,
or the EOS token id}, or {"type": "abort", "message": ...} for a request its owner aborted (/abort_request, the
dashboard), which answers what it had generated, as SGLang does. `max_new_tokens` 0 prefills the prompt into the
cache and generates nothing (SGLang's frontend caches prefixes this way). A stream (`"stream": true`) sends that
object after each piece of text, its text and output_ids cumulative (SGLang's default, not incremental) and
finish_reason null until the last, then `data: [DONE]`; in a batch each carries its `index`. `meta_info.id` is the
engine request's id, which /abort_request takes. Errors are JSON ({"error": {"message", ...}}); in a stream SGLang's
error event, {"error": {"message", "type", "code": the HTTP status, "retryable"}}, before [DONE]. A request the
server drained at shutdown, or that the engine failed, is an error.

/health_generate needs no key, as SGLang's health routes: 200 once the engine shows it generates (busy: it steps
within 20 s; idle: one token for a one-token prompt, which stays in the cache as SGLang's probe does, and is not
counted in /metrics). One probe runs at a time; its answer serves every check within a second, and within a minute
while the engine has not stepped since, so calling it costs the engine one token a minute at most.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from core.engine.request import Completion
from core.engine.sampling import SamplingParams
from core.server import api_schema
from core.server.auth import Caller
from core.server.cpu_pool import CpuPool
from core.server.errors import RETRY_AFTER_S, TYPES, APIError
from core.server.host import CLIENT_ABORT, EngineHost, new_id
from core.server.json_body import parse_object
from core.server.native_protocol import WEIGHT_VERSION, AbortRequest, GenerateBody, GenerateRequest, parse_generate
from core.server.openai_protocol import parse
from core.server.openai_run import ChoiceRun, Event
from core.server.sse import DONE, ClosingStream, sse

HEALTH_TIMEOUT_S = 20.0      # SGLang's HEALTH_CHECK_TIMEOUT
HEALTH_POLL_S = 0.05
HEALTH_REUSE_S = 1.0         # a probe's answer serves the checks that arrive within this long
HEALTH_IDLE_REUSE_S = 60.0   # and, while the engine has not stepped since, this long
PROBE_CALLER = Caller(admin=False, identity="health-probe", authenticated=False)
ABORTED = "aborted by request (/abort_request or the dashboard)"


def finish_reason(c: Completion) -> Optional[dict[str, Any]]:
    if c.finish_reason == "length":
        return {"type": "length", "length": len(c.token_ids)}
    if c.finish_reason in ("stop", "eos"):
        return {"type": "stop", "matched": c.matched_stop}
    if c.finish_reason == "abort":
        return {"type": "abort", "message": ABORTED, "status_code": None, "err_type": None}
    return None


def stream_error(err: APIError) -> dict[str, Any]:
    """SGLang's stream error event: the HTTP status as `code` (its typed client reads an integer there)."""
    return {"error": {"message": err.message, "type": TYPES.get(err.status, "server_error"), "code": err.status,
                      "retryable": err.status in (429, 503), "param": err.param}}


class Outputs:
    """The answer objects of one /generate call, in SGLang's shape."""

    def __init__(self, run: ChoiceRun, body: GenerateBody, started: float) -> None:
        self.run, self.body, self.started = run, body, started

    @property
    def many(self) -> bool:
        return self.body.is_batch or self.body.choices_per_prompt > 1

    def meta(self, i: int, completion_tokens: int, cached: int, finish: Optional[dict],
             retractions: int = 0) -> dict[str, Any]:
        c = self.run.choices[i]
        m = {"id": f"{self.run.response_id}-{i}", "finish_reason": finish, "prompt_tokens": len(c.ids),
             "weight_version": WEIGHT_VERSION, "num_retractions": retractions, "reasoning_tokens": 0,
             "completion_tokens": completion_tokens, "cached_tokens": cached}
        if finish is not None:
            m["e2e_latency"] = time.perf_counter() - self.started
        return m

    def item(self, i: int, text: str, ids: list[int], meta: dict[str, Any], streamed: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": meta}
        if self.body.return_prompt_token_ids:
            out["prompt_token_ids"] = self.run.choices[i].ids
        if streamed and self.many:
            out["index"] = i
        return out

    def piece(self, e: Event, text: str) -> dict[str, Any]:
        return self.item(e.choice, text, e.ids, self.meta(e.choice, len(e.ids), e.cached, None), True)

    def ended(self, e: Event, streamed: bool) -> dict[str, Any]:
        """The last object of a choice: its completion, or what it had when its owner aborted it (an error for
        any other end: a shutdown, an engine failure)."""
        c = e.completion
        if not (c is not None and c.finish_reason == "abort" and not c.error and e.reason == CLIENT_ABORT):
            c = self.run.finished(e.choice, c, e.reason)
        meta = self.meta(e.choice, len(c.token_ids), c.cached_tokens, finish_reason(c), c.retractions)
        return self.item(e.choice, c.text, list(c.token_ids), meta, streamed)


async def _stream(run: ChoiceRun, out: Outputs):
    texts = [""] * len(run.choices)
    left = len(run.choices)
    try:
        while left:
            try:
                e = await run.next_event()
                if e.is_piece:
                    texts[e.choice] += e.text
                    yield sse(out.piece(e, texts[e.choice]))
                    continue
                left -= 1
                yield sse(out.ended(e, True))
            except APIError as err:
                yield sse(stream_error(err))
                break
        yield DONE
    finally:  # the client left (the task is cancelled here) or we finished: nothing stays running
        run.close()


async def _answers(run: ChoiceRun, out: Outputs, request: Request) -> list[dict[str, Any]]:
    items: dict[int, dict] = {}
    try:
        while len(items) < len(run.choices):
            e = await run.next_event(request)
            if not e.is_piece:
                items[e.choice] = out.ended(e, False)
    finally:
        run.close()
    return [items[i] for i in range(len(run.choices))]


class HealthProbe:
    """One probe at a time. Its answer serves every check within HEALTH_REUSE_S, and, while the engine has not
    stepped since (idle: nothing could have changed), every check within HEALTH_IDLE_REUSE_S: a caller without a
    key can make the engine generate one token a minute at most."""

    def __init__(self, host: EngineHost, pool: CpuPool) -> None:
        self.host, self.pool = host, pool
        self.lock = asyncio.Lock()
        self.last: tuple[float, bool, int] = (-1e9, False, -1)     # (when, healthy, the engine's step after it)

    async def healthy(self) -> bool:
        async with self.lock:
            at, ok, steps = self.last
            age = time.monotonic() - at
            e = self.host.engine
            if age < HEALTH_REUSE_S or (ok and age < HEALTH_IDLE_REUSE_S and e.step_count == steps
                                        and not self.host.inflight):
                return ok
            ok = await _progressed(self.host) if self.host.inflight else None
            if ok is None:          # idle (or it went idle meanwhile): generate
                ok = await _probe(self.host, self.pool)
            self.last = (time.monotonic(), ok, self.host.engine.step_count)
            return ok


def router(host: EngineHost, pool: CpuPool, read_body, inference) -> APIRouter:
    r = APIRouter()
    probe = HealthProbe(host, pool)

    async def generate(request: Request, caller: Caller):
        started = time.perf_counter()
        body = parse_generate(await pool.run(parse_object, await read_body(request)))
        run = ChoiceRun(host, pool, caller, body, new_id("gen"), stream=bool(body.stream), with_ids=True)
        await run.start(body.prompts(), body.prompt_param)
        out = Outputs(run, body, started)
        if body.stream:
            return ClosingStream(run, _stream(run, out), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        items = await _answers(run, out, request)
        return JSONResponse(items if out.many else items[0])

    @r.post("/generate", operation_id="generate", summary="Generate (SGLang's native API)",
            openapi_extra=api_schema.request_body(GenerateRequest),
            responses=api_schema.generation_responses(api_schema.GenerateResponse))
    async def generate_post(request: Request, caller: Caller = Depends(inference)):
        return await generate(request, caller)

    @r.put("/generate", operation_id="generate_put", include_in_schema=False)
    async def generate_put(request: Request, caller: Caller = Depends(inference)):
        return await generate(request, caller)

    @r.post("/abort_request", operation_id="abort_request", response_model=api_schema.AbortedCount,
            openapi_extra=api_schema.request_body(AbortRequest))
    async def abort_request(request: Request, caller: Caller = Depends(inference)):
        """SGLang's abort: `rid` (a meta_info.id, or a response id for all its answers) or `abort_all`; a caller
        aborts only its own requests (the admin key: any). 200 whether or not anything was running, as SGLang."""
        body = parse(AbortRequest, await pool.run(parse_object, await read_body(request)))
        if body.abort_all:
            n = await pool.run(host.abort_every_owned, caller)
        else:
            n = (await pool.run(host.abort_count, caller, body.rid) or 0) if body.rid else 0
        return {"aborted": int(n)}

    @r.get("/health_generate", operation_id="health_generate", response_model=api_schema.Health,
           responses={503: {"model": api_schema.Health,
                            "description": "step mode, draining, or no token generated within 20 s"}})
    async def health_generate():
        status, body = host.health()
        if status != 200:
            return health_response(status, body)
        return health_response(*host.health(None if await probe.healthy() else "unhealthy"))

    return r


def health_response(status: int, body: dict) -> JSONResponse:
    headers = {} if status == 200 else {"Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse(body, status_code=status, headers=headers)


async def _progressed(host: EngineHost) -> Optional[bool]:
    """Whether the engine steps within HEALTH_TIMEOUT_S (its step count: submissions alone change nothing
    there, so a hung forward is not hidden by traffic); None if nothing is in flight any more (probe instead)."""
    e = host.engine
    before, deadline = e.step_count, time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(HEALTH_POLL_S)
        if host.engine is not e or e.step_count != before:
            return True
        if not host.inflight:
            return None
    return False


async def _probe(host: EngineHost, pool: CpuPool) -> bool:
    """One greedy token for the prompt [0], within HEALTH_TIMEOUT_S."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future = loop.create_future()

    def on_done(c: Optional[Completion], reason: Optional[str]) -> None:
        loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(c))

    try:
        engine = host.reserve(1)
    except APIError:           # draining, rebuilding or a full queue: not serving now
        return False
    try:
        handle = await pool.run(host.submit, engine, [0], SamplingParams(max_new_tokens=1), None, PROBE_CALLER,
                                new_id("health"), None, on_done, True)
        try:
            c = await asyncio.wait_for(asyncio.shield(ended), HEALTH_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:   # hung, or the caller left: end it
            await asyncio.shield(pool.run(host.abort, handle.rid))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return False
        return c is not None and c.error is None and c.finish_reason != "abort"
    finally:
        host.release(1)
