"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (streamed or not), /v1/models[/{id}].

Each choice is one engine request (n > 1 and a list of prompts become several, which share their
prompt's prefix through the radix tree; see openai_run.py). A client that goes away, mid-stream or
while waiting for a whole answer, aborts its requests, so their slots come back at once.

Usage counts each prompt once, however many choices it has (`n`), as OpenAI and SGLang do: the
prompt and cached tokens of a prompt's first choice, the completion tokens of all. With
`return_cached_tokens_details` (SGLang's extension, what `bench_serving --cache-report` asks for),
the response carries SGLang's `sglext.cached_tokens_details` = {"device": cached tokens of the first
choice, "host": 0} when that choice hit the cache (SGLang sends nothing on a miss). In a stream it
rides on the last choice's finishing chunk: SGLang 0.5.23 sends it in a chunk of its own with
`"choices": []`, which its own bench_serving completions client (sglang-oai) fails on
(`data["choices"][0]`), so here both of its clients (completions and chat) read it.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from core.engine.request import Completion
from core.server import api_schema
from core.server.auth import Caller
from core.server.cpu_pool import CpuPool
from core.server.errors import APIError, error_body
from core.server.host import EngineHost, new_id
from core.server.json_body import parse_object
from core.server.openai_protocol import ChatCompletionRequest, CompletionRequest, SamplingFields, parse
from core.server.openai_run import ChoiceRun
from core.server.sse import DONE, ClosingStream, sse

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def usage(completions: list[Completion], n: int) -> dict[str, Any]:
    firsts = completions[::n]
    prompt = sum(c.prompt_tokens for c in firsts)
    gen = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen,
            "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in firsts)}}


def ending(c: Optional[Completion]) -> dict:
    """A choice's last fields: OpenAI's finish_reason and SGLang's matched_stop (both null while it runs)."""
    if c is None:
        return {"logprobs": None, "finish_reason": None, "matched_stop": None}
    return {"logprobs": None, "finish_reason": FINISH.get(c.finish_reason, c.finish_reason),
            "matched_stop": c.matched_stop}


def sglext(body: SamplingFields, first: Optional[Completion]) -> Optional[dict]:
    if not body.return_cached_tokens_details or first is None or first.cached_tokens <= 0:
        return None
    return {"cached_tokens_details": {"device": first.cached_tokens, "host": 0}}


async def _stream(run: ChoiceRun, obj: str, model: str, chat: bool, usage_by_default: bool):
    created = int(time.time())
    rid = run.response_id
    k = len(run.choices)
    sent = [""] * k
    with_usage = run.body.include_usage(usage_by_default)
    # with include_usage OpenAI gives every chunk a usage field, null but on the last one
    nulls = {"usage": None} if with_usage else {}
    # SGLang's (and vLLM's) continuous_usage_stats: each text chunk carries its choice's usage so far
    continuous = bool(run.body.stream_options and run.body.stream_options.continuous_usage_stats)

    def so_far(i: int, tokens: int, cached: int) -> dict:
        p = len(run.choices[i].ids)
        return {"usage": {"prompt_tokens": p, "completion_tokens": tokens, "total_tokens": p + tokens,
                          "prompt_tokens_details": {"cached_tokens": cached}}} if continuous else {}

    def chunk(i: int, text: Optional[str], c: Optional[Completion] = None) -> dict:
        body = ({"delta": {} if text is None else {"content": text}} if chat else {"text": text or ""})
        return {"id": rid, "object": obj, "created": created, "model": model,
                "choices": [{"index": i, **body, **ending(c)}], **nulls}

    def head(extra: dict) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], **extra}

    try:
        if chat:
            for i in range(k):
                yield sse({"id": rid, "object": obj, "created": created, "model": model,
                            "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, **ending(None)}],
                            **nulls})
        while len(run.done) < k:
            try:
                e = await run.next_event()
                i = e.choice
                if e.is_piece:
                    sent[i] += e.text
                    yield sse({**chunk(i, e.text), **so_far(i, e.tokens, e.cached)})
                    continue
                c = run.finished(i, e.completion, e.reason)
            except APIError as err:
                yield sse(error_body(err.status, err.message, err.param, err.code))
                yield DONE
                return
            if c.text.startswith(sent[i]) and len(c.text) > len(sent[i]):   # never lose a tail
                yield sse({**chunk(i, c.text[len(sent[i]):]), **so_far(i, len(c.token_ids), c.cached_tokens)})
            last = {**chunk(i, None, c), **so_far(i, len(c.token_ids), c.cached_tokens)}
            ext = sglext(run.body, run.done.get(0)) if len(run.done) == k else None
            yield sse({**last, "sglext": ext} if ext is not None else last)
        done = [run.done[i] for i in range(k)]
        if with_usage:
            yield sse(head({"usage": usage(done, run.body.choices_per_prompt)}))
        yield DONE
    finally:  # the client left (the task is cancelled here) or we finished: nothing stays running
        run.close()


def router(host: EngineHost, pool: CpuPool, read_body, inference, usage_by_default: bool = False) -> APIRouter:
    r = APIRouter()

    def check_model(body: SamplingFields) -> str:
        name = host.served_model_name
        if body.model is not None and body.model != name:
            raise APIError(404, f"model {body.model!r} not found; this server serves {name!r} (GET /v1/models)",
                           "model", "model_not_found")
        return name

    async def serve(request: Request, caller: Caller, cls, chat: bool):
        data = await pool.run(parse_object, await read_body(request))
        body = parse(cls, data)
        model = check_model(body)
        body.check_unsupported()
        prompts = body.prompts()
        response_id = new_id("chatcmpl" if chat else "cmpl")
        run = ChoiceRun(host, pool, caller, body, response_id, stream=bool(body.stream))
        await run.start(prompts, "messages" if chat else "prompt")
        if body.stream:
            obj = "chat.completion.chunk" if chat else "text_completion"
            return ClosingStream(run, _stream(run, obj, model, chat, usage_by_default),
                                  media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            done = await run.wait_all(request)
        finally:
            run.close()
        choices = [{"index": i, **({"message": {"role": "assistant", "content": c.text}} if chat else {"text": c.text}),
                    **ending(c)}
                   for i, c in enumerate(done)]
        obj = "chat.completion" if chat else "text_completion"
        out = {"id": response_id, "object": obj, "created": int(time.time()), "model": model,
               "choices": choices, "usage": usage(done, body.choices_per_prompt)}
        ext = sglext(body, done[0])
        if ext is not None:
            out["sglext"] = ext
        return JSONResponse(out)

    @r.post("/v1/completions", operation_id="create_completion", summary="Create a completion",
            openapi_extra=api_schema.request_body(CompletionRequest),
            responses=api_schema.generation_responses(api_schema.CompletionResponse))
    async def completions(request: Request, caller: Caller = Depends(inference)):
        return await serve(request, caller, CompletionRequest, chat=False)

    @r.post("/v1/chat/completions", operation_id="create_chat_completion", summary="Create a chat completion",
            openapi_extra=api_schema.request_body(ChatCompletionRequest),
            responses=api_schema.generation_responses(api_schema.ChatCompletionResponse))
    async def chat_completions(request: Request, caller: Caller = Depends(inference)):
        return await serve(request, caller, ChatCompletionRequest, chat=True)

    def model_card() -> dict[str, Any]:
        return {"id": host.served_model_name, "object": "model", "created": 0, "owned_by": "radixattention",
                "root": host.model, "max_model_len": host.engine.runner.max_context_len}

    @r.get("/v1/models", operation_id="list_models", response_model=api_schema.ModelList)
    async def models(caller: Caller = Depends(inference)):
        return {"object": "list", "data": [model_card()]}

    @r.get("/v1/models/{model_id:path}", operation_id="retrieve_model", response_model=api_schema.ModelCard)
    async def model(model_id: str, caller: Caller = Depends(inference)):
        if model_id != host.served_model_name:
            raise APIError(404, f"model {model_id!r} not found; this server serves {host.served_model_name!r}",
                           "model", "model_not_found")
        return model_card()

    return r
