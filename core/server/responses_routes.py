"""OpenAI's Responses API: POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{id}, and
GET /v1/responses/{id}/input_items.

A response is one engine request (a chat: responses_protocol.py), run by the same ChoiceRun as the chat route,
so a client that goes away aborts it and its slots come back. A stored response (`store`, OpenAI's default)
can be continued with `previous_response_id`: its conversation comes first in the next prompt, which the radix
cache finds, and `usage.input_tokens_details.cached_tokens` says how much.

A stream is OpenAI's typed events (`event: <type>` + `data: {...}` with a `sequence_number`): response.created,
response.in_progress, response.output_item.added, response.content_part.added, response.output_text.delta
(one per piece), response.output_text.done, response.content_part.done, response.output_item.done, then
response.completed (or response.incomplete, at max_output_tokens); no `[DONE]`. An error ends it with an `error`
event.
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from core.engine.request import Completion
from core.server import api_schema
from core.server.auth import Caller
from core.server.body_checks import MAX_ID_CHARS
from core.server.cpu_pool import CpuPool
from core.server.errors import APIError
from core.server.host import EngineHost, new_id
from core.server.json_body import parse_object
from core.server.openai_protocol import parse
from core.server.openai_run import ChoiceRun
from core.server.response_items import DEFAULT_LIMIT, MAX_LIMIT, Order, check_list_query, page
from core.server.response_store import ResponseStore
from core.server.responses_protocol import ResponsesRequest
from core.server.sse import ClosingStream


def typed_event(kind: str, seq: int, data: dict) -> str:
    body = json.dumps({"type": kind, "sequence_number": seq, **data}, separators=(",", ":"), ensure_ascii=False)
    return f"event: {kind}\ndata: {body}\n\n"


class ResponseShape:
    """The response object of one request, as OpenAI's: in progress while it streams, then completed or
    incomplete with its output message and usage."""

    def __init__(self, body: ResponsesRequest, response_id: str, model: str, stored: bool) -> None:
        self.body, self.id, self.model, self.stored = body, response_id, model, stored
        self.created_at = int(time.time())
        self.message_id = new_id("msg")

    def message(self, text: str, status: str) -> dict:
        content = [] if status == "in_progress" else [self.part(text)]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def obj(self, status: str, output: list, usage: Optional[dict] = None,
            incomplete: Optional[str] = None) -> dict:
        b = self.body
        done = status in ("completed", "incomplete")
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "completed_at": int(time.time()) if done else None, "background": False, "error": None,
                "incomplete_details": None if incomplete is None else {"reason": incomplete},
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "max_tool_calls": None,
                "model": self.model, "output": output,
                "parallel_tool_calls": True if b.parallel_tool_calls is None else b.parallel_tool_calls,
                "previous_response_id": b.previous_response_id, "prompt_cache_key": b.prompt_cache_key,
                "reasoning": {"effort": None, "summary": None}, "safety_identifier": b.safety_identifier,
                "service_tier": "default", "store": self.stored, "temperature": b.temperature,
                "text": {"format": {"type": "text"}, "verbosity": b.text.verbosity if b.text else None},
                "tool_choice": b.tool_choice or "auto", "tools": [], "top_logprobs": 0, "top_p": b.top_p,
                "truncation": "disabled", "usage": usage, "user": b.user, "metadata": b.metadata or {}}

    def finished(self, c: Completion) -> dict:
        """The whole response for a finished completion."""
        incomplete = "max_output_tokens" if c.finish_reason == "length" else None
        status = "incomplete" if incomplete else "completed"
        usage = {"input_tokens": c.prompt_tokens, "input_tokens_details": {"cached_tokens": c.cached_tokens, "cache_write_tokens": 0},
                 "output_tokens": len(c.token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": c.prompt_tokens + len(c.token_ids)}
        return self.obj(status, [self.message(c.text, status)], usage, incomplete)


async def _stream(run: ChoiceRun, shape: ResponseShape, on_done):
    seq = 0

    def event(kind: str, **data: Any) -> str:
        nonlocal seq
        seq += 1
        return typed_event(kind, seq - 1, data)

    item = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}
    sent = ""
    try:
        yield event("response.created", response=shape.obj("in_progress", []))
        yield event("response.in_progress", response=shape.obj("in_progress", []))
        yield event("response.output_item.added", output_index=0, item=shape.message("", "in_progress"))
        yield event("response.content_part.added", **item, part=shape.part(""))
        while not run.done:
            try:
                e = await run.next_event()
                if e.is_piece:
                    sent += e.text
                    yield event("response.output_text.delta", **item, delta=e.text, logprobs=[])
                    continue
                c = run.finished(0, e.completion, e.reason)
            except APIError as err:
                yield event("error", code=err.code, message=err.message, param=err.param)
                return
            if c.text.startswith(sent) and len(c.text) > len(sent):   # never lose a tail
                yield event("response.output_text.delta", **item, delta=c.text[len(sent):], logprobs=[])
            whole = shape.finished(c)
            message = whole["output"][0]
            yield event("response.output_text.done", **item, text=c.text, logprobs=[])
            yield event("response.content_part.done", **item, part=shape.part(c.text))
            yield event("response.output_item.done", output_index=0, item=message)
            on_done(whole, c.text)
            yield event(f"response.{whole['status']}", response=whole)
    finally:  # the client left (the task is cancelled here) or we finished: nothing stays running
        run.close()


def with_history(err: APIError, body: ResponsesRequest) -> APIError:
    """A prompt that does not fit, said in the Responses API's terms: the prompt is the instructions and the
    conversation of previous_response_id as well as the new input."""
    if err.code != "context_length_exceeded" or err.param != "input":
        return err
    parts = [what for what, v in (("the instructions", body.instructions),
                                  ("the conversation of previous_response_id", body.previous_response_id))
             if v is not None]
    if not parts:
        return err
    why = (f"; the prompt holds {' and '.join(parts)} as well as the new input: shorten them, or start a new "
           f"conversation (no previous_response_id)")
    return APIError(err.status, err.message + why, err.param, err.code, err.headers)


def router(host: EngineHost, pool: CpuPool, read_body, inference, store: ResponseStore) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/responses", operation_id="create_response", summary="Create a model response",
            openapi_extra=api_schema.request_body(ResponsesRequest),
            responses={200: {"model": api_schema.OpenObject,
                             "description": "The response object; with \"stream\": true, server-sent events "
                                            "(event: response.* / data: {...})",
                             "content": {"text/event-stream": {"schema": {"type": "string"}}}}})
    async def create(request: Request, caller: Caller = Depends(inference)):
        data = await pool.run(parse_object, await read_body(request))
        body = parse(ResponsesRequest, data)
        model = host.served_model_name
        if body.model is not None and body.model != model:
            raise APIError(404, f"model {body.model!r} not found; this server serves {model!r} (GET /v1/models)",
                           "model", "model_not_found")
        body.check_unsupported()
        history = store.history(caller, body.previous_response_id)
        new = body.input_messages()
        shape = ResponseShape(body, new_id("resp"), model, body.stores and store.keeps_for(caller))
        run = ChoiceRun(host, pool, caller, body, shape.id, stream=bool(body.stream))
        try:
            await run.start([body.chat(list(history.messages), new)], "input")
        except APIError as err:
            raise with_history(err, body) from None

        def keep(whole: dict, answer: str) -> None:
            if shape.stored:
                turns = history.then([*new, {"role": "assistant", "content": answer}],
                                     [*(new_id("msg") for _ in new), shape.message_id])
                store.put(caller, shape.id, turns, whole)

        if body.stream:
            return ClosingStream(run, _stream(run, shape, keep), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            (c,) = await run.wait_all(request)
        finally:
            run.close()
        whole = shape.finished(c)
        keep(whole, c.text)
        return JSONResponse(whole)

    @r.get("/v1/responses/{response_id}", operation_id="retrieve_response", response_model=api_schema.OpenObject)
    async def retrieve(response_id: str, caller: Caller = Depends(inference)):
        return store.get(caller, response_id).body

    @r.get("/v1/responses/{response_id}/input_items", operation_id="list_input_items",
           summary="List a stored response's input items", response_model=api_schema.OpenObject)
    async def input_items(request: Request, response_id: str, caller: Caller = Depends(inference),
                          limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT), order: Order = Query("desc"),
                          after: Optional[str] = Query(None, max_length=MAX_ID_CHARS)):
        """The conversation the response continued and its own input, newest first unless order=asc; `after` an
        item id of the last page (the client follows has_more itself). `include` has nothing to add here."""
        check_list_query(request.query_params)
        return page(store.get(caller, response_id).input_items(), limit, order, after)

    @r.delete("/v1/responses/{response_id}", operation_id="delete_response", response_model=api_schema.OpenObject)
    async def delete(response_id: str, caller: Caller = Depends(inference)):
        store.delete(caller, response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    return r
