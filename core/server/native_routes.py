"""SGLang's native routes: POST (or PUT) /generate and GET /health_generate, answered as SGLang 0.5.23 answers them,
so SGLang's own clients (`bench_serving --backend sglang`, the default; sglang-router forwarding /generate; scripts
written against SGLang's docs) run unchanged.

/generate takes `text` or `input_ids` (one prompt, or a list for a batch) and `sampling_params`
(native_protocol.py). One prompt with n = 1 answers one object, anything else a list, prompt by prompt and sample
by sample:

    {"text": ..., "output_ids": [...], "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
     "cached_tokens", "weight_version", "e2e_latency"}}

`finish_reason` is SGLang's object: {"type": "length", "length": n}, or {"type": "stop", "matched": the stop string,
or the EOS token id}. A stream (`"stream": true`) sends that object after each piece of text, its text and
output_ids cumulative (SGLang's default, not incremental) and finish_reason null until the last, then
`data: [DONE]`; in a batch each carries its `index`. `meta_info.id` is the engine request's id, which the abort
route takes. Errors are this server's JSON errors (SGLang's shape: {"error": {"message", ...}}), in a stream as an
event before [DONE]; a request aborted or drained at shutdown is an error, not a result with an "abort" reason.
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
from core.server.errors import RETRY_AFTER_S, APIError, error_body
from core.server.host import EngineHost, new_id
from core.server.json_body import parse_object
from core.server.native_protocol import WEIGHT_VERSION, GenerateRequest, parse_generate
from core.server.openai_run import ChoiceRun
from core.server.sse import DONE, ClosingStream, sse

HEALTH_TIMEOUT_S = 20.0      # SGLang's HEALTH_CHECK_TIMEOUT
HEALTH_POLL_S = 0.05


def finish_reason(c: Completion) -> Optional[dict[str, Any]]:
    if c.finish_reason == "length":
        return {"type": "length", "length": len(c.token_ids)}
    if c.finish_reason in ("stop", "eos"):
        return {"type": "stop", "matched": c.matched_stop}
    return None


class Outputs:
    """The answer objects of one /generate call, in SGLang's shape."""

    def __init__(self, run: ChoiceRun, body: GenerateRequest, started: float) -> None:
        self.run, self.body, self.started = run, body, started

    def meta(self, i: int, completion_tokens: int, cached: int, finish: Optional[dict]) -> dict[str, Any]:
        c = self.run.choices[i]
        m = {"id": f"{self.run.response_id}-{i}", "finish_reason": finish, "prompt_tokens": len(c.ids),
             "weight_version": WEIGHT_VERSION, "completion_tokens": completion_tokens, "cached_tokens": cached}
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

    def done(self, i: int, c: Completion, streamed: bool) -> dict[str, Any]:
        return self.item(i, c.text, list(c.token_ids), self.meta(i, len(c.token_ids), c.cached_tokens,
                                                               finish_reason(c)), streamed)

    @property
    def many(self) -> bool:
        return self.body.is_batch or self.body.choices_per_prompt > 1


async def _stream(run: ChoiceRun, out: Outputs):
    texts = [""] * len(run.choices)
    try:
        while len(run.done) < len(run.choices):
            try:
                e = await run.next_event()
                i = e.choice
                if e.is_piece:
                    texts[i] += e.text
                    yield sse(out.item(i, texts[i], e.ids, out.meta(i, len(e.ids), e.cached, None), True))
                    continue
                c = run.finished(i, e.completion, e.reason)
            except APIError as err:
                yield sse(error_body(err.status, err.message, err.param, err.code))
                break
            yield sse(out.done(i, c, True))
        yield DONE
    finally:  # the client left (the task is cancelled here) or we finished: nothing stays running
        run.close()


def router(host: EngineHost, pool: CpuPool, read_body, inference) -> APIRouter:
    r = APIRouter()

    async def generate(request: Request, caller: Caller):
        started = time.perf_counter()
        body = parse_generate(await pool.run(parse_object, await read_body(request)))
        if body.model is not None and body.model != host.served_model_name:
            raise APIError(404, f"model {body.model!r} not found; this server serves {host.served_model_name!r}",
                           "model", "model_not_found")
        run = ChoiceRun(host, pool, caller, body, new_id("gen"), stream=bool(body.stream))
        await run.start(body.prompts(), body.prompt_param)
        out = Outputs(run, body, started)
        if body.stream:
            return ClosingStream(run, _stream(run, out), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            done = await run.wait_all(request)
        finally:
            run.close()
        items = [out.done(i, c, False) for i, c in enumerate(done)]
        return JSONResponse(items if out.many else items[0])

    @r.post("/generate", operation_id="generate", summary="Generate (SGLang's native API)",
            openapi_extra=api_schema.request_body(GenerateRequest),
            responses=api_schema.generation_responses(api_schema.GenerateResponse))
    async def generate_post(request: Request, caller: Caller = Depends(inference)):
        return await generate(request, caller)

    @r.put("/generate", operation_id="generate_put", include_in_schema=False)
    async def generate_put(request: Request, caller: Caller = Depends(inference)):
        return await generate(request, caller)

    @r.get("/health_generate", operation_id="health_generate", response_model=api_schema.Health,
           responses={503: {"model": api_schema.Health,
                            "description": "step mode, draining, or no token generated within 20 s"}})
    async def health_generate(caller: Caller = Depends(inference)):
        """SGLang's deep health check: /health's answer, once the engine shows it generates. Busy, it must make
        progress within 20 s; idle, it must generate one token for a one-token prompt (which then sits in the cache,
        as SGLang's probe does)."""
        status, body = host.health()
        if status != 200:
            return health_response(status, body)
        ok = await _progressed(host) if host.inflight else await _probe(host, pool, caller)
        return health_response(*host.health(None if ok else "unhealthy"))

    return r


def health_response(status: int, body: dict) -> JSONResponse:
    headers = {} if status == 200 else {"Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse(body, status_code=status, headers=headers)


async def _progressed(host: EngineHost) -> bool:
    """Whether the engine's state moves within HEALTH_TIMEOUT_S."""
    before, deadline = host.version(), time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(HEALTH_POLL_S)
        if host.version() != before:
            return True
    return False


async def _probe(host: EngineHost, pool: CpuPool, caller: Caller) -> bool:
    """One greedy token for the prompt [0], within HEALTH_TIMEOUT_S."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future = loop.create_future()

    def on_done(c: Optional[Completion], reason: Optional[str]) -> None:
        loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(c))

    engine = host.reserve(1)
    try:
        handle = await pool.run(host.submit, engine, [0], SamplingParams(max_new_tokens=1), None, caller,
                                new_id("health"), None, on_done)
        try:
            c = await asyncio.wait_for(asyncio.shield(ended), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            pool.fire(host.abort, handle.rid)
            return False
        return c is not None and c.error is None and c.finish_reason != "abort"
    finally:
        host.release(1)
