"""OpenAI request bodies and their mapping onto the engine's SamplingParams.

Only the field names are mapped here; whether a value is valid is the engine's call
(`Engine.submit` raises ValueError, which the routes return as 400), so the server and the
dashboard reject exactly the same inputs. Sampling fields are typed `Any` for that reason:
pydantic would otherwise coerce "0.5" or True before the engine could refuse them.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from core.engine.sampling import SamplingParams
from core.server.errors import APIError, describe_validation

MAX_N = 16
DEFAULT_COMPLETION_MAX_TOKENS = 16    # OpenAI's documented default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 128         # chat has no limit in OpenAI's API; SGLang's default is 128


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")   # clients send fields we do not use (user, metadata...)

    model: Optional[str] = None
    max_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    n: Any = 1
    stop: Any = None
    seed: Any = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: Any = False
    priority: Any = 0          # the "priority" eviction policy's key (SGLang's request priority)
    cache_salt: Optional[str] = None   # vLLM's name for a cache namespace
    extra_key: Optional[str] = None    # SGLang's (the radix key's extra_key)
    logprobs: Any = None
    best_of: Any = None

    def check_unsupported(self) -> None:
        if self.logprobs not in (None, False, 0):
            raise APIError(400, "logprobs are not supported by this server; drop the logprobs field", "logprobs")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported; send n requests instead", "best_of")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise APIError(400, f"n must be an integer from 1 to {MAX_N}, got {self.n!r}", "n")
        if self.cache_salt is not None and self.extra_key is not None and self.cache_salt != self.extra_key:
            raise APIError(400, "cache_salt and extra_key name the same cache namespace; send one of them",
                           "cache_salt")

    def namespace(self) -> Optional[str]:
        key = self.cache_salt if self.cache_salt is not None else self.extra_key
        if key is not None and not key:
            raise APIError(400, "cache_salt must be a non-empty string (or left out)", "cache_salt")
        return key

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: Any, default_max_tokens: int, choice: int = 0) -> SamplingParams:
        """SamplingParams for choice `choice` (with n > 1 and a seed, each choice gets seed + i,
        so the n samples differ and the request stays reproducible)."""
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, list):
            stop = tuple(stop)
        seed = self.seed
        if seed is not None and choice and isinstance(seed, int) and not isinstance(seed, bool):
            seed = seed + choice
        return SamplingParams(
            max_new_tokens=default_max_tokens if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,   # OpenAI's default
            top_k=0 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=seed, stop=stop, ignore_eos=self.ignore_eos, priority=self.priority)


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False
    suffix: Optional[str] = None

    def prompts(self) -> list[Union[str, list[int]]]:
        if self.echo:
            raise APIError(400, "echo is not supported by this server; drop the echo field", "echo")
        if self.suffix:
            raise APIError(400, "suffix (insertion) is not supported by this server", "suffix")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt is empty: send a string, a list of strings or a list of token ids", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)

    def params(self, choice: int = 0) -> SamplingParams:
        return self.sampling_params(self.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, choice)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Union[str, list[dict[str, Any]], None] = None

    def as_engine(self) -> dict[str, str]:
        c = self.content
        if c is None:
            c = ""
        elif isinstance(c, list):
            texts = []
            for part in c:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"only text content parts are supported, got type {part.get('type')!r}",
                                   "messages")
                texts.append(part["text"])
            c = "".join(texts)
        return {"role": self.role, "content": c}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: Any = None
    tools: Any = None

    def prompts(self) -> list[list[dict[str, str]]]:
        if self.tools:
            raise APIError(400, "tools (function calling) are not supported by this server", "tools")
        if not self.messages:
            raise APIError(400, "messages is empty: send at least one {role, content} message", "messages")
        return [[m.as_engine() for m in self.messages]]

    def params(self, choice: int = 0) -> SamplingParams:
        mt = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_params(mt, DEFAULT_CHAT_MAX_TOKENS, choice)


def parse(model: type[BaseModel], raw: bytes):
    """Parse a JSON body into `model`, or raise a 400 that names the bad field."""
    try:
        data = json.loads(raw) if raw else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise APIError(400, f"the body is not valid JSON ({exc}); send a JSON object") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise APIError(400, describe_validation(exc.errors())) from exc
