"""The checks every request body shares (OpenAI's chat and completions, the Responses API, SGLang's /generate):
fields accepted only at their no-op values, OpenAI's ranges, one cache namespace however it is named, and the
mapping of sampling values onto the engine's SamplingParams (whose own validation refuses the rest)."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel

from core.engine.inputs import check_extra_key
from core.engine.sampling import SamplingParams, token_id_key
from core.server.errors import APIError

MAX_TEMPERATURE = 2.0                 # OpenAI's range is [0, 2]
# the server's own cache namespaces (the admin's, each tenant key's) start with this; no client may name one so
# (they show in KV events, and a client that sent the admin's as its cache_salt shared the admin's cached
# prefixes, which cached_tokens reads back)
RESERVED_NAMESPACE_PREFIX = "radix:"
MAX_ID_CHARS = 512                    # a name a client sends: cache_salt, user, safety_identifier, ...


def check_noops(body: BaseModel, table: dict[str, tuple[tuple, str]], prefix: str = "", per_item: bool = False) -> None:
    """A 400 for the first field of `table` that `body` sets to a value other than its no-op values (the
    field named as `prefix` + name). `per_item`: a list of no-op values (one per prompt, SGLang's batches) is one."""
    def noop_value(value: Any, noop: tuple) -> bool:
        return value is None or any(value == v and type(value) is type(v) for v in noop)

    for name, (noop, why) in table.items():
        value = getattr(body, name, None)
        if noop_value(value, noop) or (per_item and isinstance(value, list) and value
                                       and all(noop_value(v, noop) for v in value)):
            continue
        raise APIError(400, f"{why or name + ' is not supported'} (got {prefix}{name}={value!r})",
                       prefix + name, "unsupported_parameter")


def check_stream_and_namespace(body: Any) -> None:
    """The checks an OpenAI body (chat, completion, response) shares: stream_options only with a stream, and one
    cache namespace however it is named."""
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options", "invalid_value")
    opts = body.stream_options      # a StreamOptions (chat, completions) or a dict (Responses)
    if (opts.get("include_obfuscation") if isinstance(opts, dict) else getattr(opts, "include_obfuscation", None)):
        raise APIError(400, "stream_options.include_obfuscation is not supported: chunks carry no obfuscation "
                            "padding here; send false or leave it out", "stream_options.include_obfuscation",
                       "unsupported_parameter")
    if body.cache_salt is not None and body.extra_key is not None and body.cache_salt != body.extra_key:
        raise APIError(400, "cache_salt and extra_key name the same cache namespace; send one of them",
                       "cache_salt", "invalid_value")


def check_temperature(t: Any) -> None:
    """OpenAI's ceiling (the engine takes any temperature; its own check refuses the rest)."""
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t > MAX_TEMPERATURE:
        raise APIError(400, f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {t!r}", "temperature",
                       "invalid_value")


def check_max_tokens(value: Any, param: str) -> None:
    """OpenAI's floor of 1 (the engine takes 0, SGLang's prefill-only request, through /generate)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise APIError(400, f"{param} must be an integer >= 1, got {value!r}", param, "invalid_value")


def namespace_of(body: Any) -> Optional[str]:
    """An OpenAI body's cache namespace: its cache_salt (vLLM's name) or extra_key (SGLang's)."""
    param = "cache_salt" if body.cache_salt is not None else "extra_key"
    key = getattr(body, param)
    if key is not None and not key:
        raise APIError(400, f"{param} must be a non-empty string (or left out)", param, "invalid_value")
    return check_namespace(key, param)


def check_namespace(key: Optional[str], param: str) -> Optional[str]:
    """A cache namespace a client names, at most MAX_ID_CHARS long (each tree node and event of its requests
    holds it)."""
    try:
        key = check_extra_key(key, MAX_ID_CHARS)
    except ValueError as exc:
        raise APIError(400, str(exc).replace("extra_key", param, 1), param, "invalid_value") from None
    if key is not None and key.startswith(RESERVED_NAMESPACE_PREFIX):
        raise APIError(400, f"{param} may not start with {RESERVED_NAMESPACE_PREFIX!r}: the server keeps such names "
                            f"for its own cache namespaces (the admin's, each key's); pick another name", param,
                       "invalid_value")
    return key


def engine_params(choice: int, *, max_new_tokens: Any, temperature: Any, top_p: Any, top_k: Any, seed: Any, stop: Any,
                  ignore_eos: Any, priority: Any, frequency_penalty: Any, presence_penalty: Any,
                  repetition_penalty: Any, min_new_tokens: Any, logit_bias: Any, top_k_off: int = -1) -> SamplingParams:
    """Sampling values as a request body carries them (None: the default; -1 or `top_k_off` and above: top_k off,
    SGLang's and vLLM's "off") as validated SamplingParams for choice `choice`: with n > 1 and a seed, choice i
    samples with seed + i (wrapped to int64), so the samples differ and the request stays reproducible.
    ParamError names the engine's field; each protocol renames it to its own."""
    if seed is not None and choice and isinstance(seed, int) and not isinstance(seed, bool):
        seed = (seed + choice + 2 ** 63) % 2 ** 64 - 2 ** 63   # within int64 whatever seed the client sent
    if isinstance(top_k, int) and not isinstance(top_k, bool) and (top_k == -1 or (top_k_off > 0 and top_k >= top_k_off)):
        top_k = 0
    if isinstance(stop, list):
        stop = tuple(stop)
    if isinstance(logit_bias, dict):
        logit_bias = {token_id_key(k): v for k, v in logit_bias.items()}

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    params = SamplingParams(
        max_new_tokens=max_new_tokens, temperature=pick(temperature, 1.0), top_k=pick(top_k, 0),
        top_p=pick(top_p, 1.0), seed=seed, stop=pick(stop, ()), ignore_eos=pick(ignore_eos, False),
        priority=pick(priority, 0), frequency_penalty=pick(frequency_penalty, 0.0),
        presence_penalty=pick(presence_penalty, 0.0), repetition_penalty=pick(repetition_penalty, 1.0),
        min_new_tokens=pick(min_new_tokens, 0), logit_bias=logit_bias)
    params.validate()
    return params
