"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (streamed or not), /v1/models.

Each choice is one engine request (n > 1 and a list of prompts become several, which share
their prompt's prefix through the radix tree). A client that goes away, mid-stream or while
waiting for a whole answer, aborts its requests, so their slots come back at once.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from core.engine.request import Completion, RequestHandle
from core.engine.sampling import SamplingParams
from core.server.errors import APIError, error_body
from core.server.host import EngineHost
from core.server.openai_protocol import ChatCompletionRequest, CompletionRequest, SamplingFields, parse

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}
DISCONNECT_POLL_S = 0.5


def usage(completions: list[Completion]) -> dict[str, Any]:
    prompt = sum(c.prompt_tokens for c in completions)
    gen = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen,
            "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in completions)}}


def classify(host: EngineHost, prompt: Any, params: SamplingParams, exc: ValueError) -> APIError:
    """The engine's ValueError as 413 when the prompt can never fit the pool, else 400."""
    engine = host.engine
    try:
        ids, _ = engine.tokenize(prompt)
    except Exception:
        return APIError(400, str(exc))
    pool, ps = engine.allocator.num_slots, engine.allocator.page_size
    mnt = params.max_new_tokens if isinstance(params.max_new_tokens, int) and params.max_new_tokens > 0 else 1
    need = len(ids) + mnt - 1
    if len(ids) > pool or need + (-need) % ps > pool:
        return APIError(413, str(exc), "prompt", "prompt_too_large_for_pool")
    return APIError(400, str(exc))


class _Run:
    """The engine requests behind one API call, and where their pieces and results land."""

    def __init__(self, host: EngineHost, body: SamplingFields, prompts: list, stream: bool) -> None:
        self.host, self.body = host, body
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.items = [(p, body.params(j)) for p in prompts for j in range(body.n)]
        self.stream = stream
        self.handles: list[RequestHandle] = []
        self.done: dict[int, Optional[Completion]] = {}

    def _post(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shutting down): nobody is listening
            pass

    async def start(self) -> None:
        key = self.body.namespace()
        for i, (prompt, params) in enumerate(self.items):
            on_piece = (lambda t, i=i: self._post((i, t, None))) if self.stream else None
            try:
                h = await asyncio.to_thread(self.host.submit, prompt, params, key, on_piece,
                                            lambda c, i=i: self._post((i, None, c)))
            except ValueError as exc:
                self.abort()
                raise classify(self.host, prompt, params, exc) from exc
            except BaseException:
                self.abort()
                raise
            self.handles.append(h)

    def abort(self) -> None:
        for h in self.handles:
            if not h.done():
                self.host.abort(h.rid)

    async def wait_all(self, request: Request) -> list[Completion]:
        while len(self.done) < len(self.items):
            try:
                i, _, c = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.abort()
                    raise APIError(499, "the client closed the connection; its requests were aborted")
                continue
            self.done[i] = c
        return [self._ok(self.done[i]) for i in range(len(self.items))]

    @staticmethod
    def _ok(c: Optional[Completion]) -> Completion:
        if c is None:
            raise APIError(500, "the request ended without a result; see the server log")
        if c.error:
            raise APIError(500, f"the engine failed this request: {c.error}")
        return c


class _AbortingStream(StreamingResponse):
    """A stream that aborts its requests however it ends, even when the client leaves before the
    first chunk (an async generator that never started runs no `finally`)."""

    def __init__(self, run: _Run, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._run.abort()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(run: _Run, rid: str, obj: str, model: str, chat: bool):
    created = int(time.time())
    k = len(run.items)
    sent = [""] * k

    def chunk(i: int, text: Optional[str], finish: Optional[str]) -> dict:
        if chat:
            delta = {} if text is None else {"content": text}
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": i, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

    try:
        if chat:
            for i in range(k):
                yield _sse({"id": rid, "object": obj, "created": created, "model": model,
                            "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
        while len(run.done) < k:
            i, text, c = await run.queue.get()
            if text is not None:
                sent[i] += text
                yield _sse(chunk(i, text, None))
                continue
            run.done[i] = c
            if c is None or c.error:
                msg = c.error if c is not None else "the request ended without a result"
                yield _sse(error_body(500, f"the engine failed this request: {msg}"))
                return
            if c.text.startswith(sent[i]) and len(c.text) > len(sent[i]):   # never lose a tail
                yield _sse(chunk(i, c.text[len(sent[i]):], None))
            yield _sse(chunk(i, None, FINISH.get(c.finish_reason, c.finish_reason)))
        if run.body.include_usage():
            yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": usage([run.done[i] for i in range(k)])})
        yield "data: [DONE]\n\n"
    finally:  # the client left (the task is cancelled here) or we finished: nothing stays running
        run.abort()


def router(host: EngineHost, read_body) -> APIRouter:
    r = APIRouter()

    def check_model(body: SamplingFields) -> str:
        name = host.served_model_name
        if body.model is not None and body.model != name:
            raise APIError(404, f"model {body.model!r} not found; this server serves {name!r} (GET /v1/models)",
                           "model", "model_not_found")
        return name

    async def serve(request: Request, cls, chat: bool):
        body = parse(cls, await read_body(request))
        model = check_model(body)
        body.check_unsupported()
        prompts = body.prompts()
        run = _Run(host, body, prompts, stream=body.stream)
        await run.start()
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if body.stream:
            obj = "chat.completion.chunk" if chat else "text_completion"
            return _AbortingStream(run, _stream(run, rid, obj, model, chat), media_type="text/event-stream",
                                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            done = await run.wait_all(request)
        finally:
            run.abort()
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                        "finish_reason": FINISH.get(c.finish_reason, c.finish_reason)} for i, c in enumerate(done)]
            obj = "chat.completion"
        else:
            choices = [{"index": i, "text": c.text, "logprobs": None,
                        "finish_reason": FINISH.get(c.finish_reason, c.finish_reason)} for i, c in enumerate(done)]
            obj = "text_completion"
        return JSONResponse({"id": rid, "object": obj, "created": int(time.time()), "model": model,
                             "choices": choices, "usage": usage(done)})

    @r.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, CompletionRequest, chat=False)

    @r.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, ChatCompletionRequest, chat=True)

    @r.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": host.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "radixattention", "root": host.model,
                                            "max_model_len": host.engine.runner.max_context_len}]}

    return r
