"""The OpenAPI document: request and response bodies as pydantic models, every error a route can
answer (OpenAI's error body), real content types (SSE streams, Prometheus text), unique operation
ids. Routes read their bodies themselves (within the size limit, off the event loop), so their
request models are added here rather than taken from the handlers' signatures; a tool that reads
the schema (schemathesis, a client generator) sees exactly what the server accepts.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"
ERROR_STATUSES = {400: "Bad request: the message names the field", 401: "Missing or wrong key",
                  403: "Not allowed: admin key needed, foreign Host or Origin", 404: "Not found",
                  405: "Method not allowed (see the Allow header)", 408: "The request stopped arriving",
                  409: "Conflict with the engine's state", 413: "Too large for the body limit",
                  415: "A POST body must be JSON", 500: "The engine failed the request",
                  503: "Queue full, rebuilding or shutting down (see Retry-After)"}
_REQUEST_MODELS: list[type[BaseModel]] = []


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str]
    code: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CachedTokensDetails(BaseModel):
    device: int
    host: int


class SglExt(BaseModel):
    cached_tokens_details: CachedTokensDetails


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: str


class CompletionResponse(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    sglext: Optional[SglExt] = None


class AssistantMessage(BaseModel):
    role: str
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    sglext: Optional[SglExt] = None


class FinishReason(BaseModel):
    type: str                                    # "length", "stop" or "abort"
    length: Optional[int] = None                 # "length": the tokens generated
    matched: Union[str, int, None] = None        # "stop": the stop string, or the EOS token id
    message: Optional[str] = None                # "abort": why
    model_config = ConfigDict(extra="allow")     # "abort" also carries SGLang's status_code and err_type (null)


class GenerateMeta(BaseModel):
    id: str
    finish_reason: Optional[FinishReason]        # null until the last chunk of a stream
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int                        # 0: no reasoning model
    num_retractions: int                         # times the scheduler took it out to free memory
    weight_version: str
    e2e_latency: Optional[float] = None          # seconds, on a finished answer


class GenerateOutput(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: GenerateMeta
    prompt_token_ids: Optional[list[int]] = None   # with return_prompt_token_ids
    index: Optional[int] = None                    # a batch's or n's stream chunks: which answer


GenerateResponse = Union[GenerateOutput, list[GenerateOutput]]   # one prompt with n = 1: an object


class AbortedCount(BaseModel):
    aborted: int                                 # requests that were still running


class ModelCard(BaseModel):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: str
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    engine_loop: str
    model: str


class Message(BaseModel):
    message: str


class Aborted(BaseModel):
    aborted: bool


class Submitted(BaseModel):
    rid: str


class Stepped(BaseModel):
    stepped: bool


class TokenBytes(BaseModel):
    bytes: list[str]


class RequestTokens(BaseModel):
    prompt_ids: list[int]
    output_ids: list[int]


class EngineStatus(BaseModel):
    version: int
    tree_seq: int = Field(0, description="seq of the last cache event that changed the tree (not a slot "
                                         "alloc or free): a viewer redraws the tree when it moves")
    stepping: bool
    last_error: Optional[str]
    inflight: int
    model: str
    admin: bool = Field(True, description="whether the caller holds the admin role (rebuild, step mode, flush): "
                                          "a dashboard hides those controls otherwise")


class EventPage(BaseModel):
    events: list[dict[str, Any]]
    last_seq: int


class OpenObject(BaseModel):
    """A JSON object whose fields follow the engine's settings or snapshot (see the route's text)."""
    model_config = ConfigDict(extra="allow")


class RebuildResult(BaseModel):
    config: dict[str, Any]


def request_body(model: type[BaseModel], required: bool = True) -> dict:
    """`openapi_extra` that documents `model` as the route's JSON body."""
    if model not in _REQUEST_MODELS:
        _REQUEST_MODELS.append(model)
    return {"requestBody": {"required": required, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}


def generation_responses(model: type[BaseModel]) -> dict:
    """200 as JSON (`model`) or, with "stream": true, as server-sent events."""
    return {200: {"model": model, "description": "The answer; with \"stream\": true, server-sent events "
                                                 "(data: {chunk} ... data: [DONE])",
                  "content": {"text/event-stream": {"schema": {"type": "string"}}}}}


OPEN_PATHS = ("/health", "/health_generate")   # no key, as SGLang's health routes


def install(app: FastAPI, secured: bool = False) -> None:
    """Build the document once: request models in components, OpenAI's error body on every operation, and
    (`secured`: the server has a key) the bearer scheme on every route but /health."""

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        comps = doc.setdefault("components", {}).setdefault("schemas", {})
        _, defs = models_json_schema([(m, "validation") for m in (*_REQUEST_MODELS, ErrorResponse)],
                                     ref_template=REF)
        comps.update(defs.get("$defs", {}))
        comps.pop("HTTPValidationError", None)
        comps.pop("ValidationError", None)
        error = {"application/json": {"schema": {"$ref": REF.format(model="ErrorResponse")}}}
        if secured:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                               "description": "--api-key or --admin-key"}}
        for path, ops in doc.get("paths", {}).items():
            for op in ops.values():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                for status, text in ERROR_STATUSES.items():
                    responses.setdefault(str(status), {"description": text, "content": error})
                if secured and path not in OPEN_PATHS:
                    op["security"] = [{"bearer": []}]
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
