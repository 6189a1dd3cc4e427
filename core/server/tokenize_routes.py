"""SGLang's /v1/tokenize and /v1/detokenize (also at /tokenize and /detokenize): the served model's tokenizer.

How many tokens is this prompt, which ids does a chat become, what text are these ids: what a client needs to
budget a context or read a cache event's token ids, answered with the tokenizer the engine itself uses (a chat
exactly as /v1/chat/completions renders it, unless add_generation_prompt says otherwise). Bodies and answers
as SGLang 0.5.23's: `{"tokens", "count", "max_model_len"}` and `{"text"}`, a list of each for a list.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt

from core.engine import inputs
from core.server import api_schema
from core.server.auth import Caller
from core.server.cpu_pool import CpuPool
from core.server.errors import APIError
from core.server.host import EngineHost
from core.server.json_body import parse_object
from core.server.openai_protocol import MAX_CHOICES, ChatMessage, parse


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    prompt: Union[str, list[str], None] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: Optional[StrictBool] = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    tokens: Union[list[StrictInt], list[list[StrictInt]]]
    skip_special_tokens: StrictBool = True


def _text_ids(tokenizer, vocab_size: int, text: str, add_special_tokens: bool, param: str) -> list[int]:
    try:
        return inputs.tokenize(tokenizer, vocab_size, text, add_special_tokens)[0]
    except ValueError as exc:
        raise APIError(400, str(exc), param, "invalid_value") from None


def tokenize(host: EngineHost, body: TokenizeRequest) -> dict[str, Any]:
    engine = host.engine
    runner = engine.runner
    tok = runner.tokenizer
    if tok is None:
        raise APIError(400, "this model has no tokenizer: its prompts are token ids", "prompt", "invalid_value")
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send exactly one of prompt (text, or a list of texts) and messages (a chat)", "prompt",
                       "invalid_value")
    # text no prompt of this engine could hold is refused unread, as on the generation routes (all of a list's
    # texts together: megabytes of text would hold a worker thread the generation routes share for a minute)
    chat = None if body.messages is None else [m.as_engine() for m in body.messages]
    if chat is not None:
        host.check_size(engine, chat, "messages")
    else:
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        host.check_chars(engine, sum(map(len, texts)), "prompt")
    if chat is not None:
        if not chat:
            raise APIError(400, "messages is empty: send at least one {role, content} message", "messages",
                           "invalid_value")
        try:
            if body.add_generation_prompt is None:          # as /v1/chat/completions renders it
                ids = inputs.tokenize(tok, runner.vocab_size, chat)[0]
            else:
                if not getattr(tok, "chat_template", None):
                    raise ValueError("this model has no chat template; submit raw text instead")
                ids = inputs.chat_ids(tok, chat, body.add_generation_prompt)
        except ValueError as exc:
            raise APIError(400, str(exc), "messages", "invalid_value") from None
        tokens: Union[list[int], list[list[int]]] = ids
        count: Union[int, list[int]] = len(ids)
    elif isinstance(body.prompt, str):
        tokens = _text_ids(tok, runner.vocab_size, body.prompt, body.add_special_tokens, "prompt")
        count = len(tokens)
    else:
        if len(body.prompt) > MAX_CHOICES:
            raise APIError(400, f"{len(body.prompt):,} prompts in one request; at most {MAX_CHOICES:,}", "prompt",
                           "invalid_value")
        tokens = [_text_ids(tok, runner.vocab_size, p, body.add_special_tokens, f"prompt[{i}]")
                  for i, p in enumerate(body.prompt)]
        count = [len(t) for t in tokens]
    return {"tokens": tokens, "count": count, "max_model_len": runner.max_context_len}


def detokenize(host: EngineHost, body: DetokenizeRequest) -> dict[str, Any]:
    runner = host.engine.runner
    if runner.tokenizer is None:
        raise APIError(400, "this model has no tokenizer: there is no text to give", "tokens", "invalid_value")
    lists = body.tokens if body.tokens and isinstance(body.tokens[0], list) else [body.tokens]
    if len(lists) > MAX_CHOICES:
        raise APIError(400, f"{len(lists):,} token lists in one request; at most {MAX_CHOICES:,}", "tokens",
                       "invalid_value")
    for ids in lists:
        bad = [t for t in ids if not 0 <= t < runner.vocab_size]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{runner.vocab_size - 1})", "tokens",
                           "invalid_value")
    texts = [runner.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in lists]
    return {"text": texts if lists is body.tokens else texts[0]}


def router(host: EngineHost, pool: CpuPool, read_body, inference) -> APIRouter:
    r = APIRouter()

    def check_model(body) -> None:
        if body.model is not None and body.model != host.served_model_name:
            raise APIError(404, f"model {body.model!r} not found; this server serves {host.served_model_name!r}",
                           "model", "model_not_found")

    async def read(request: Request, cls):
        body = parse(cls, await pool.run(parse_object, await read_body(request)))
        check_model(body)
        return body

    def serve(name: str, summary: str, cls: type[BaseModel], answer) -> None:
        """POST /v1/<name>, and /<name> as SGLang also serves it (left out of the OpenAPI document)."""
        async def route(request: Request, caller: Caller = Depends(inference)):
            return await pool.run(answer, host, await read(request, cls))

        for path, hidden in ((f"/v1/{name}", False), (f"/{name}", True)):
            r.add_api_route(path, route, methods=["POST"], operation_id=None if hidden else name, summary=summary,
                            include_in_schema=not hidden, openapi_extra=api_schema.request_body(cls),
                            response_model=api_schema.OpenObject)

    serve("tokenize", "Tokenize text or a chat", TokenizeRequest, tokenize)
    serve("detokenize", "Text of token ids", DetokenizeRequest, detokenize)
    return r
