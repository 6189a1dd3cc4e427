"""OpenAI request bodies, checked field by field, and their mapping onto the engine's SamplingParams.

Every parameter is either honoured or refused with a 400 that names it: a field this server does
not know is refused (`unknown_parameter`), and a known one it cannot honour (tools, logprobs,
response_format json_object/json_schema, ...) is accepted only at its no-op value. Fields that
change nothing about the answer (user, metadata, prompt_cache_key, ...) are accepted and ignored.

Values are the engine's call (`SamplingParams.validate`), so the server and the dashboard refuse
exactly the same inputs; its errors are renamed to the OpenAI field the client sent (max_tokens,
not max_new_tokens). Sampling fields are typed `Any` for that reason (pydantic would otherwise
coerce "0.5" or True before the engine could refuse them); their JSON schema still says what is
valid, so the OpenAPI document (and a fuzzer reading it) knows.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, WithJsonSchema

from core.engine.inputs import CHAT_ROLES, join_text_parts
from core.engine.sampling import ParamError, SamplingParams
from core.server.body_checks import (
    MAX_TEMPERATURE,
    check_max_tokens,
    check_noops,
    check_stream_and_namespace,
    check_temperature,
    engine_params,
    namespace_of,
)
from core.server.errors import APIError, describe_validation, first_field

MAX_N = 16
MAX_CHOICES = 2048                    # prompts x n in one request
DEFAULT_COMPLETION_MAX_TOKENS = 16    # OpenAI's documented default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 128         # a placeholder: a chat without max_tokens runs to the end of the room
                                      # (open_ended; SGLang's chat sends None and clamps to the context)


def schema_field(schema: dict, description: str = "") -> Any:
    """An `Any` field (the engine checks the value) whose JSON schema says what is valid."""
    return Annotated[Any, WithJsonSchema({**schema, **({"description": description} if description else {})})]


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


Int = {"type": "integer"}
Number = {"type": "number"}
StopSchema = nullable({"anyOf": [{"type": "string", "minLength": 1},
                                  {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 64}]})
MaxTokens = schema_field(nullable({**Int, "minimum": 1}), "tokens to generate at most")
LogitBias = schema_field(nullable({"type": "object", "additionalProperties": {"type": "number", "minimum": -100,
                                                                         "maximum": 100},
                               "propertyNames": {"pattern": "^[0-9]{1,9}$"}}), "token id -> bias")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Optional[StrictBool] = None
    continuous_usage_stats: Optional[StrictBool] = None   # SGLang's and vLLM's: each chunk with its usage so far
    include_obfuscation: Optional[StrictBool] = None      # OpenAI's padding field: false (what this server does)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


# field -> (its no-op values, what to tell a client that sent another value)
NOT_HONOURED: dict[str, tuple[tuple, str]] = {
    "logprobs": ((None, False), "logprobs are not supported by this server; drop the logprobs field"),
    "top_logprobs": ((None, 0), "top_logprobs are not supported by this server (no logprobs)"),
    "best_of": ((None, 1), "best_of is not supported; send n requests instead"),
    "echo": ((None, False), "echo is not supported by this server; drop the echo field"),
    "suffix": ((None, ""), "suffix (insertion) is not supported by this server"),
    "tools": ((None, []), "tools (function calling) are not supported by this server"),
    "functions": ((None, []), "functions (function calling) are not supported by this server"),
    "tool_choice": ((None, "none", "auto"), "tool_choice needs tools, which this server does not support"),
    "function_call": ((None, "none", "auto"), "function_call needs functions, which this server does not support"),
    "parallel_tool_calls": ((None, True, False), ""),
    "modalities": ((None, ["text"]), "only the text modality is supported"),
    "audio": ((None,), "audio output is not supported by this server"),
    "prediction": ((None,), "predicted outputs are not supported by this server"),
    "reasoning_effort": ((None,), "reasoning_effort is not supported: this server runs no reasoning model"),
    "web_search_options": ((None,), "web search is not supported by this server"),
    "verbosity": ((None,), "verbosity is not supported by this server"),
    "store": ((None, False), "store is not supported: this server keeps no completions"),
    "service_tier": ((None, "auto", "default"), "service tiers are not supported; leave service_tier out"),
    # SGLang's extensions (sglang-router fills in their defaults when it forwards a request)
    "no_stop_trim": ((None, False), "no_stop_trim is not supported: stop strings are always trimmed"),
    "skip_special_tokens": ((None, True), "special tokens are always skipped in the output"),
    # special tokens are always skipped, so no space is put between them either way: false changes nothing
    "spaces_between_special_tokens": ((None, True, False), "spaces_between_special_tokens must be true or false"),
    "return_hidden_states": ((None, False), "hidden states are not returned by this server"),
    "min_p": ((None, 0, 0.0), "min_p is not supported by this server"),
    "stop_token_ids": ((None, []), "stop_token_ids are not supported; use stop strings"),
    "lora_path": ((None,), "LoRA adapters are not supported by this server"),
    "rid": ((None,), "request ids are chosen by this server (unguessable); drop rid"),
    "regex": ((None,), "constrained decoding (regex) is not supported by this server"),
    "ebnf": ((None,), "constrained decoding (ebnf) is not supported by this server"),
    "json_schema": ((None,), "constrained decoding (json_schema) is not supported by this server"),
    "continue_final_message": ((None, False), "continue_final_message is not supported by this server"),
    "chat_template_kwargs": ((None, {}), "chat_template_kwargs are not supported by this server"),
    "separate_reasoning": ((None, True, False), ""),      # no reasoning model: nothing to separate
    "stream_reasoning": ((None, True, False), ""),
}


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    max_tokens: MaxTokens = None
    temperature: schema_field(nullable({**Number, "minimum": 0, "maximum": MAX_TEMPERATURE})) = None
    top_p: schema_field(nullable({**Number, "exclusiveMinimum": 0, "maximum": 1})) = None
    top_k: schema_field(nullable({**Int, "minimum": -1}), "0 or -1: off") = None
    n: schema_field(nullable({**Int, "minimum": 1, "maximum": MAX_N})) = None
    stop: schema_field(StopSchema) = None
    seed: schema_field(nullable({**Int, "minimum": -2 ** 63, "maximum": 2 ** 63 - 1})) = None
    stream: Optional[StrictBool] = None
    stream_options: Optional[StreamOptions] = None
    ignore_eos: schema_field({"type": "boolean"}) = False
    priority: schema_field({**Int, "minimum": -(2 ** 62) + 1, "maximum": 2 ** 62 - 1},
                      "the 'priority' eviction policy's key (SGLang's request priority)") = 0
    cache_salt: Optional[str] = Field(None, description="vLLM's name for a cache namespace")
    extra_key: Optional[str] = Field(None, description="SGLang's name for a cache namespace")
    frequency_penalty: schema_field(nullable({**Number, "minimum": -2, "maximum": 2})) = None
    presence_penalty: schema_field(nullable({**Number, "minimum": -2, "maximum": 2})) = None
    repetition_penalty: schema_field(nullable({**Number, "minimum": 0.01, "maximum": 2}), "SGLang's") = None
    min_tokens: schema_field(nullable({**Int, "minimum": 0}), "SGLang's min_new_tokens") = None
    logit_bias: LogitBias = None
    return_cached_tokens_details: Optional[StrictBool] = Field(None, description="SGLang's sglext details")
    # accepted and ignored: they change nothing about the answer
    user: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None
    # accepted only at their no-op values (NOT_HONOURED)
    logprobs: schema_field({"anyOf": [{"type": "boolean"}, {**Int, "minimum": 0}, {"type": "null"}]}) = None
    store: Optional[StrictBool] = None
    service_tier: Optional[str] = None
    no_stop_trim: Optional[StrictBool] = None
    skip_special_tokens: Optional[StrictBool] = None
    spaces_between_special_tokens: Optional[StrictBool] = None
    return_hidden_states: Optional[StrictBool] = None
    min_p: schema_field(nullable({**Number, "minimum": 0, "maximum": 1})) = None
    stop_token_ids: Optional[list[int]] = None
    lora_path: Optional[str] = None
    rid: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    json_schema: Optional[str] = None

    def check_unsupported(self) -> None:
        check_noops(self, NOT_HONOURED)
        n = 1 if self.n is None else self.n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise APIError(400, f"n must be an integer from 1 to {MAX_N}, got {self.n!r}", "n", "invalid_value")
        check_stream_and_namespace(self)
        check_temperature(self.temperature)

    @property
    def choices_per_prompt(self) -> int:
        return self.n or 1

    def namespace(self, prompt: int = 0) -> Optional[str]:
        return namespace_of(self)

    def include_usage(self, default: bool = False) -> bool:
        """Whether a stream ends with a usage chunk: stream_options.include_usage, or the server's default
        (SGLang's --stream-response-default-include-usage)."""
        return bool(self.stream_options and self.stream_options.include_usage) or default

    def max_tokens_param(self) -> str:
        return "max_tokens"

    def open_ended(self, prompt: int = 0) -> bool:
        """Whether the client set no limit, so a choice may run to the end of the context (chat only:
        /v1/completions has OpenAI's documented default of 16)."""
        return False

    def sampling_key(self, prompt: int = 0) -> int:
        """Which sampling spec prompt `prompt` uses: an OpenAI body has one for all its prompts."""
        return 0

    def sampling_params(self, max_tokens: Any, default_max_tokens: int, choice: int = 0) -> SamplingParams:
        """Validated SamplingParams for choice `choice` (with n > 1 and a seed, each choice gets seed + i wrapped
        to int64, so the n samples differ and the request stays reproducible); 400 naming the OpenAI field."""
        check_max_tokens(max_tokens, self.max_tokens_param())
        try:
            return engine_params(
                choice, max_new_tokens=default_max_tokens if max_tokens is None else max_tokens,
                temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed, stop=self.stop,
                ignore_eos=self.ignore_eos, priority=self.priority, frequency_penalty=self.frequency_penalty,
                presence_penalty=self.presence_penalty, repetition_penalty=self.repetition_penalty,
                min_new_tokens=self.min_tokens, logit_bias=self.logit_bias)
        except ParamError as exc:
            raise self.param_error(exc) from None

    def param_error(self, exc: ParamError) -> APIError:
        """The engine's message about one of its fields, about the OpenAI field the client sent."""
        names = {"max_new_tokens": self.max_tokens_param(), "min_new_tokens": "min_tokens"}
        message = str(exc)
        for ours, theirs in names.items():
            message = message.replace(ours, theirs)
        return APIError(400, message, names.get(exc.field, exc.field), "invalid_value")


class CompletionRequest(SamplingFields):
    # StrictInt: pydantic would otherwise read true, 1.0 or "2" as token ids
    prompt: Union[str, list[str], list[StrictInt], list[list[StrictInt]]] = Field(
        ..., description="text, texts, token ids, or lists of token ids")
    echo: Optional[StrictBool] = None
    suffix: Optional[str] = None
    best_of: schema_field(nullable({**Int, "minimum": 1})) = None

    def check_unsupported(self) -> None:
        super().check_unsupported()
        if isinstance(self.logprobs, bool):
            raise APIError(400, "logprobs of /v1/completions is an integer; logprobs are not supported by this "
                                "server", "logprobs", "unsupported_parameter")

    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt is empty: send a string, a list of strings or a list of token ids", "prompt",
                           "invalid_value")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)

    def params(self, choice: int = 0, prompt: int = 0) -> SamplingParams:
        return self.sampling_params(self.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, choice)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")     # name, tool_call_id, ...: the template may use them
    role: Literal[CHAT_ROLES]
    content: Union[str, list[dict[str, Any]], None] = None

    def as_engine(self) -> dict[str, str]:
        c = self.content
        if c is None:
            if self.role in ("user", "system", "developer"):   # an assistant turn may carry only tool calls
                raise APIError(400, f"a {self.role} message needs its content (a string or text parts)",
                               "messages", "invalid_value")
            c = ""
        elif isinstance(c, list):
            texts = []
            for part in c:
                if part.get("type") != "text":
                    raise APIError(400, f"only text content parts are supported, got type {part.get('type')!r}",
                                   "messages", "invalid_value")
                if not isinstance(part.get("text"), str):
                    raise APIError(400, f"a text content part needs its text as a string, got "
                                        f"{part.get('text')!r}", "messages", "invalid_value")
                texts.append(part["text"])
            c = join_text_parts(texts)
        return {"role": self.role, "content": c}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: MaxTokens = None
    top_logprobs: schema_field(nullable({**Int, "minimum": 0, "maximum": 20})) = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[StrictBool] = None
    functions: Optional[list[dict[str, Any]]] = None
    function_call: Union[str, dict[str, Any], None] = None
    response_format: Optional[ResponseFormat] = None
    modalities: Optional[list[str]] = None
    audio: Optional[dict[str, Any]] = None
    prediction: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    web_search_options: Optional[dict[str, Any]] = None
    verbosity: Optional[str] = None
    continue_final_message: Optional[StrictBool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    separate_reasoning: Optional[StrictBool] = None
    stream_reasoning: Optional[StrictBool] = None

    def check_unsupported(self) -> None:
        super().check_unsupported()
        rf = self.response_format
        if rf is not None and rf.type != "text":
            raise APIError(400, f"response_format {rf.type!r} is not supported: this server cannot constrain output "
                                f"to JSON; leave response_format out (or send {{\"type\": \"text\"}})",
                           "response_format", "unsupported_parameter")
        if isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool):
            raise APIError(400, "logprobs of /v1/chat/completions is a boolean; logprobs are not supported by this "
                                "server", "logprobs", "unsupported_parameter")

    def prompts(self) -> list[list[dict[str, str]]]:
        if not self.messages:
            raise APIError(400, "messages is empty: send at least one {role, content} message", "messages",
                           "invalid_value")
        return [[m.as_engine() for m in self.messages]]

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def open_ended(self, prompt: int = 0) -> bool:
        return self.max_tokens is None and self.max_completion_tokens is None

    def params(self, choice: int = 0, prompt: int = 0) -> SamplingParams:
        mt = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_params(mt, DEFAULT_CHAT_MAX_TOKENS, choice)


def parse(model: type[BaseModel], data: dict):
    """A parsed JSON object as `model`, or a 400 that names the bad (or unknown) field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        unknown = [e for e in errors if e.get("type") == "extra_forbidden"]
        if unknown:
            name = ".".join(str(p) for p in unknown[0]["loc"])
            raise APIError(400, f"unknown parameter {name!r}: this server does not support it; remove it", name,
                           "unknown_parameter") from None
        raise APIError(400, describe_validation(errors), first_field(errors), "invalid_value") from None
