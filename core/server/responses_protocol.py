"""The OpenAI Responses API's request body (POST /v1/responses), checked field by field, as a chat for the engine.

`input` is a string (one user message) or a list of items: messages `{role, content}` (content a string or
`input_text` / `output_text` parts; `type: "message"` optional), as the `openai` client's
`client.responses.create(...)` sends them; `instructions` come first, as a system message. With
`previous_response_id` the stored conversation comes before the new input (response_store.py), so a chain of
responses is a chat whose earlier turns the radix cache already holds.

As on the chat route, a field this server cannot honour (tools, reasoning, structured output, background
runs) is refused with a 400 that names it unless it has its no-op value, and an unknown field is refused.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from core.engine.inputs import join_text_parts
from core.engine.sampling import ParamError, SamplingParams
from core.server.body_checks import (
    MAX_ID_CHARS,
    MAX_TEMPERATURE,
    check_max_tokens,
    check_noops,
    check_stream_and_namespace,
    check_temperature,
    engine_params,
    namespace_of,
)
from core.server.errors import APIError
from core.server.openai_protocol import DEFAULT_CHAT_MAX_TOKENS, MaxTokens, Number, nullable, schema_field

INPUT_PART_TYPES = ("input_text", "output_text", "text")   # the text parts an input message may hold
INPUT_ROLES = ("user", "assistant", "system", "developer")   # the Responses API's message roles
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512   # OpenAI's limits (a response keeps them)

# field -> (its no-op values, what to tell a client that sent another value)
NOT_HONOURED: dict[str, tuple[tuple, str]] = {
    "tools": ((None, []), "tools (function calling, web search, ...) are not supported by this server"),
    "tool_choice": ((None, "none", "auto"), "tool_choice needs tools, which this server does not support"),
    "parallel_tool_calls": ((None, True, False), ""),
    "max_tool_calls": ((None,), "max_tool_calls needs tools, which this server does not support"),
    "background": ((None, False), "background responses are not supported; wait for the answer or stream it"),
    "include": ((None, []), "include is not supported: there are no tool outputs or logprobs to include"),
    "truncation": ((None, "disabled"), "truncation 'auto' is not supported: a conversation that does not fit "
                                       "is refused with what to shorten"),
    "top_logprobs": ((None, 0), "top_logprobs are not supported by this server (no logprobs)"),
    "service_tier": ((None, "auto", "default"), "service tiers are not supported; leave service_tier out"),
    "prompt": ((None,), "reusable prompts (prompt templates stored at OpenAI) are not supported; send input"),
    "conversation": ((None,), "conversations are not supported; chain responses with previous_response_id"),
}


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Optional[TextFormat] = None
    verbosity: Optional[str] = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]] = Field(..., description="a string, or a list of message items")
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    max_output_tokens: MaxTokens = None
    temperature: schema_field(nullable({**Number, "minimum": 0, "maximum": MAX_TEMPERATURE})) = None
    top_p: schema_field(nullable({**Number, "exclusiveMinimum": 0, "maximum": 1})) = None
    stream: Optional[StrictBool] = None
    store: Optional[StrictBool] = None
    text: Optional[TextOptions] = None
    cache_salt: Optional[str] = Field(None, description="vLLM's name for a cache namespace")
    extra_key: Optional[str] = Field(None, description="SGLang's name for a cache namespace")
    # accepted and ignored: they change nothing about the answer
    user: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None
    stream_options: Optional[dict[str, Any]] = None
    # accepted only at their no-op values (NOT_HONOURED)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[StrictBool] = None
    max_tool_calls: Optional[int] = None
    reasoning: Optional[dict[str, Any]] = None
    background: Optional[StrictBool] = None
    include: Optional[list[str]] = None
    truncation: Optional[str] = None
    top_logprobs: Optional[int] = None
    service_tier: Optional[str] = None
    prompt: Optional[dict[str, Any]] = None
    conversation: Union[str, dict[str, Any], None] = None

    @property
    def stores(self) -> bool:
        """Whether the response is kept for previous_response_id and GET (OpenAI's default: yes)."""
        return self.store is not False

    def check_unsupported(self) -> None:
        check_noops(self, NOT_HONOURED)
        if self.reasoning and any(v is not None for v in self.reasoning.values()):   # a response's own echo is none
            raise APIError(400, f"reasoning options are not supported: this server runs no reasoning model (got "
                                f"reasoning={self.reasoning!r})", "reasoning", "unsupported_parameter")
        self.check_sizes()
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type != "text":
            raise APIError(400, f"text.format {fmt.type!r} is not supported: this server cannot constrain output "
                                f"to JSON; leave text.format out (or send {{\"type\": \"text\"}})", "text.format",
                           "unsupported_parameter")
        check_stream_and_namespace(self)

    def check_sizes(self) -> None:
        """What a stored response keeps but no model reads, within OpenAI's limits (else 1,024 stored responses of
        8 MB metadata each would hold gigabytes)."""
        meta = self.metadata or {}
        if len(meta) > MAX_METADATA_PAIRS:
            raise APIError(400, f"metadata holds {len(meta)} pairs; at most {MAX_METADATA_PAIRS}", "metadata",
                           "invalid_value")
        for k, v in meta.items():
            if len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE:
                raise APIError(400, f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most "
                                    f"{MAX_METADATA_VALUE}; {k[:20]!r} is longer", "metadata", "invalid_value")
        for name in ("user", "safety_identifier", "prompt_cache_key"):
            v = getattr(self, name)
            if v is not None and len(v) > MAX_ID_CHARS:
                raise APIError(400, f"{name} is at most {MAX_ID_CHARS} characters, got {len(v):,}", name,
                               "invalid_value")

    def input_messages(self) -> list[dict[str, str]]:
        """The new turn's messages (`input`) for the chat template."""
        if not self.input:
            raise APIError(400, "input is empty: send text or a list of messages", "input", "invalid_value")
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return [_message(item, k) for k, item in enumerate(self.input)]

    def chat(self, history: list[dict[str, str]], new: list[dict[str, str]]) -> list[dict[str, str]]:
        """The chat the engine answers: this request's instructions (a system message; a previous response's
        are not carried over, as OpenAI's), the stored conversation, the new input."""
        head = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        return head + history + new

    # ----- what a ChoiceRun reads (openai_run.RunBody) ---------------------------------------------
    @property
    def choices_per_prompt(self) -> int:
        return 1

    def namespace(self, prompt: int = 0) -> Optional[str]:
        return namespace_of(self)

    def max_tokens_param(self) -> str:
        return "max_output_tokens"

    def open_ended(self, prompt: int = 0) -> bool:
        """No max_output_tokens: the answer may run to the end of the context, as on the chat route."""
        return self.max_output_tokens is None

    def sampling_key(self, prompt: int = 0) -> int:
        return 0

    def params(self, choice: int = 0, prompt: int = 0) -> SamplingParams:
        mt = self.max_output_tokens
        check_max_tokens(mt, "max_output_tokens")
        check_temperature(self.temperature)
        try:
            return engine_params(
                choice, max_new_tokens=DEFAULT_CHAT_MAX_TOKENS if mt is None else mt, temperature=self.temperature,
                top_p=self.top_p, top_k=None, seed=None, stop=None, ignore_eos=None, priority=None,
                frequency_penalty=None, presence_penalty=None, repetition_penalty=None, min_new_tokens=None,
                logit_bias=None)
        except ParamError as exc:
            raise self.param_error(exc) from None

    def param_error(self, exc: ParamError) -> APIError:
        names = {"max_new_tokens": "max_output_tokens"}
        message = str(exc).replace("max_new_tokens", "max_output_tokens")
        return APIError(400, message, names.get(exc.field, exc.field), "invalid_value")


def _message(item: Any, k: int) -> dict[str, str]:
    """One input item as {role, content}: a message whose content is a string or text parts."""
    where = f"input[{k}]"
    if not isinstance(item, dict):
        raise APIError(400, f"{where} must be a message object {{role, content}}", where, "invalid_value")
    kind = item.get("type") or "message"
    if kind != "message":
        raise APIError(400, f"{where} is a {kind!r} item; this server takes message items only (no tool calls or "
                            f"their outputs)", where, "unsupported_parameter")
    role = item.get("role")
    if role not in INPUT_ROLES:
        raise APIError(400, f"{where}.role must be one of {', '.join(INPUT_ROLES)}, got {role!r}", f"{where}.role",
                       "invalid_value")
    content = item.get("content")
    if content is None and role == "assistant":          # an assistant turn that only called tools, as on the chat route
        return {"role": role, "content": ""}
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of text parts", f"{where}.content",
                       "invalid_value")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in INPUT_PART_TYPES or not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}.content[{j}] is a {kind!r} part; only text parts "
                                f"({', '.join(INPUT_PART_TYPES)}) with their text as a string are supported",
                           f"{where}.content", "unsupported_parameter")
        texts.append(part["text"])
    return {"role": role, "content": join_text_parts(texts)}

