"""SGLang's native /generate body (its GenerateReqInput and SamplingParams as SGLang 0.5.23 reads them), checked
field by field and mapped onto the engine's SamplingParams.

The rule of openai_protocol.py holds here too: every field is honoured, accepted only at its no-op value, or refused
with a 400 that names it (`sampling_params.top_k`, `input_ids`). Every field of SGLang's GenerateReqInput is known
here; an unknown one is refused (SGLang refuses unknown sampling keys but ignores unknown top-level ones: a field
dropped in silence is an answer the client did not ask for). As SGLang reads them: a list of no-op values (one per
prompt) is a no-op, an empty `extra_key` / `cache_salt` is none, `model` is ignored (the native API serves the model
it has). Names and defaults are SGLang's: `max_new_tokens` (128 when left out; null runs to the end of the context, as
SGLang's scheduler does), `min_new_tokens`, `sampling_seed`, `n` inside `sampling_params`, `top_k` -1 or 2**30 for
off. A batch is a list of texts (or of token-id lists), with one sampling_params for all or one each.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, PrivateAttr, StrictBool, StrictInt, create_model

from core.engine.sampling import ParamError, SamplingParams
from core.server.body_checks import check_namespace, check_noops, engine_params
from core.server.errors import APIError
from core.server.openai_protocol import MAX_N, parse

DEFAULT_MAX_NEW_TOKENS = 128          # SGLang's SamplingParams default
TOP_K_OFF = 1 << 30                   # SGLang's default top_k: every token
WEIGHT_VERSION = "default"            # SGLang's meta_info.weight_version when no weights were updated
OPEN_ENDED = 2 ** 31 - 1              # max_new_tokens: null, until the room is known

SAMPLING_NOT_HONOURED: dict[str, tuple[tuple, str]] = {
    "stop_token_ids": ((None, []), "stop_token_ids are not supported; use stop strings"),
    "stop_regex": ((None, [], ""), "stop_regex is not supported; use stop strings"),
    "min_p": ((None, 0, 0.0), "min_p is not supported by this server"),
    "json_schema": ((None, ""), "constrained decoding (json_schema) is not supported by this server"),
    "regex": ((None, ""), "constrained decoding (regex) is not supported by this server"),
    "ebnf": ((None, ""), "constrained decoding (ebnf) is not supported by this server"),
    "structural_tag": ((None, ""), "constrained decoding (structural_tag) is not supported by this server"),
    "choice": ((None, []), "constrained decoding (choice) is not supported by this server"),
    "skip_special_tokens": ((None, True), "special tokens are always skipped in the output"),
    # special tokens are always skipped, so no space is put between them either way: false changes nothing
    "spaces_between_special_tokens": ((None, True, False), "spaces_between_special_tokens must be true or false"),
    "no_stop_trim": ((None, False), "no_stop_trim is not supported: stop strings are always trimmed"),
    "custom_params": ((None, {}), "custom_params need a custom logit processor, which this server does not run"),
    "beam_width": ((None, 0, 1), "beam search is not supported by this server"),
    "watermark": ((None,), "watermarking is not supported by this server"),
}

NOT_HONOURED: dict[str, tuple[tuple, str]] = {
    "rid": ((None,), "request ids are chosen by this server (unguessable; meta_info.id names them); drop rid"),
    "return_logprob": ((None, False), "logprobs are not supported by this server; drop return_logprob"),
    "top_logprobs_num": ((None, 0), "top_logprobs_num needs logprobs, which this server does not support"),
    "token_ids_logprob": ((None,), "token_ids_logprob needs logprobs, which this server does not support"),
    "return_hidden_states": ((None, False), "hidden states are not returned by this server"),
    "return_routed_experts": ((None, False), "this server runs no mixture-of-experts model: no routed experts"),
    "return_sampling_mask": ((None, False), "sampling masks are not returned by this server"),
    "lora_path": ((None,), "LoRA adapters are not supported by this server"),
    "lora_id": ((None,), "LoRA adapters are not supported by this server"),
    "input_embeds": ((None,), "input_embeds are not supported; send text or input_ids"),
    "image_data": ((None,), "only text inputs are supported by this server"),
    "video_data": ((None,), "only text inputs are supported by this server"),
    "audio_data": ((None,), "only text inputs are supported by this server"),
    "modalities": ((None, []), "only text inputs are supported by this server"),
    "custom_logit_processor": ((None,), "custom logit processors are not supported by this server"),
    "session_params": ((None,), "sessions are not supported by this server"),
    "session_id": ((None,), "sessions are not supported by this server"),
    "bootstrap_host": ((None,), "prefill/decode disaggregation is not supported by this server"),
    "bootstrap_port": ((None,), "prefill/decode disaggregation is not supported by this server"),
    "bootstrap_room": ((None,), "prefill/decode disaggregation is not supported by this server"),
    "bootstrap_pair_key": ((None,), "prefill/decode disaggregation is not supported by this server"),
    "data_parallel_rank": ((None, 0), "this server has one data-parallel rank, 0"),
    "routed_dp_rank": ((None, 0), "this server has one data-parallel rank, 0"),
    "max_thinking_tokens": ((None,), "max_thinking_tokens is not supported: this server runs no reasoning model"),
    "require_reasoning": ((None, False), "require_reasoning is not supported: this server runs no reasoning model"),
    "kv_hints": ((None,), "KV hints are not supported by this server"),
    "background": ((None, False), "background requests are not supported by this server"),
    "return_bytes": ((None, False), "output bytes are not returned by this server"),
    "return_entropy": ((None, False), "entropies are not returned by this server"),
    "watermark": ((None,), "watermarking is not supported by this server"),
    "mm_hashes": ((None, []), "only text inputs are supported by this server"),
    "mm_content_hashes": ((None, []), "only text inputs are supported by this server"),
    "use_audio_in_video": ((None, False), "only text inputs are supported by this server"),
    "video_config": ((None,), "only text inputs are supported by this server"),
    "images_config": ((None,), "only text inputs are supported by this server"),
    "mm_processor_kwargs": ((None, {}), "only text inputs are supported by this server"),
    "need_wait_for_mm_inputs": ((None, False), "only text inputs are supported by this server"),
    "num_items_assigned": ((None,), "only text inputs are supported by this server"),
    "encoder_urls": ((None, []), "only text inputs are supported by this server"),
    "max_dynamic_patch": ((None,), "only text inputs are supported by this server"),
    "min_dynamic_patch": ((None,), "only text inputs are supported by this server"),
    "image_max_dynamic_patch": ((None,), "only text inputs are supported by this server"),
    "video_max_dynamic_patch": ((None,), "only text inputs are supported by this server"),
    "sampling_logprobs_mode": ((None,), "logprobs are not supported by this server"),
    "return_flat_raw_top_logprobs": ((None, False), "logprobs are not supported by this server"),
    "return_flat_raw_output_top_logprobs": ((None, False), "logprobs are not supported by this server"),
    "return_flat_raw_top_logprobs_b64": ((None, False), "logprobs are not supported by this server"),
    "return_indexer_topk": ((None, False), "indexer top-k is not returned by this server"),
    "positional_embed_overrides": ((None,), "positional embedding overrides are not supported by this server"),
    "decode_tp_size": ((None,), "prefill/decode disaggregation is not supported by this server"),
    "disagg_prefill_dp_rank": ((None,), "prefill/decode disaggregation is not supported by this server"),
    "multi_item_delimiter_indices": ((None,), "multi-item scoring is not supported by this server"),
    "token_indices_to_pool": ((None,), "pooling is not supported by this server (no embeddings)"),
    "http_worker_ipc": ((None,), "http_worker_ipc is internal to SGLang's server; drop it"),
}


class NativeSampling(BaseModel):
    """SGLang's sampling_params. Values are typed `Any`: the engine's validate() judges them (as for OpenAI bodies),
    so "0.5" or true is refused, never coerced."""
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: Any = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    n: Any = None
    stop: Any = None
    ignore_eos: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Optional[dict[str, Any]] = None
    sampling_seed: Any = None
    stream_interval: Optional[StrictInt] = None      # accepted and ignored: every safe piece of text is streamed
    # accepted only at their no-op values (SAMPLING_NOT_HONOURED)
    stop_token_ids: Optional[list[Any]] = None
    stop_regex: Union[str, list[str], None] = None
    min_p: Any = None
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    choice: Optional[list[Any]] = None
    skip_special_tokens: Optional[StrictBool] = None
    spaces_between_special_tokens: Optional[StrictBool] = None
    no_stop_trim: Optional[StrictBool] = None
    custom_params: Any = None
    beam_width: Any = None
    watermark: Any = None

    def open_ended(self) -> bool:
        """max_new_tokens sent as null: run to the end of the room (the context and the pool)."""
        return "max_new_tokens" in self.model_fields_set and self.max_new_tokens is None


class GenerateBody(BaseModel):
    """The fields /generate honours or ignores, and the checks; GenerateRequest adds NOT_HONOURED's fields."""
    model_config = ConfigDict(extra="forbid")

    text: Union[str, list[str], None] = None
    input_ids: Union[list[StrictInt], list[list[StrictInt]], None] = None
    sampling_params: Union[dict[str, Any], list[dict[str, Any]], None] = None
    stream: Optional[StrictBool] = False
    model: Optional[str] = None                   # ignored, as SGLang ignores it (sglang-router sends null)
    priority: Any = None
    extra_key: Union[str, list[str], None] = None     # one for all prompts, or one each
    cache_salt: Union[str, list[str], None] = None
    return_prompt_token_ids: Optional[StrictBool] = None
    # accepted and ignored: they change nothing about the answer
    log_metrics: Optional[StrictBool] = None
    no_logs: Optional[StrictBool] = None
    custom_labels: Optional[dict[str, str]] = None
    routing_key: Optional[str] = None
    logprob_start_len: Optional[StrictInt] = None          # without logprobs it selects nothing
    return_text_in_logprobs: Optional[StrictBool] = None
    routed_experts_start_len: Optional[StrictInt] = None
    conversation_id: Optional[str] = None
    external_trace_header: Optional[dict[str, Any]] = None
    received_time: Optional[float] = None
    _sampling: list[NativeSampling] = PrivateAttr(default_factory=list)   # parsed by check()

    # ----- checks --------------------------------------------------------------------------------
    def check(self) -> None:
        """400 for an unsupported value, a body that names no prompt (or two), or sampling params that do not
        match the batch; parses sampling_params."""
        check_noops(self, NOT_HONOURED, per_item=True)
        if (self.text is None) == (self.input_ids is None):
            both = "both" if self.text is not None else "neither"
            raise APIError(400, f"send text (a string or a list of strings) or input_ids (token ids or lists of "
                                f"them), not {both}", "text", "invalid_value")
        raw = self.sampling_params
        if isinstance(raw, list):
            if not self.is_batch:
                raise APIError(400, "sampling_params is a list, one per prompt of a batch, but this request has one "
                                    "prompt; send sampling_params as an object", "sampling_params", "invalid_value")
            if len(raw) != self.batch_size:
                raise APIError(400, f"sampling_params has {len(raw)} entries for {self.batch_size} prompts; send one "
                                    f"per prompt, or one object for all", "sampling_params", "invalid_value")
        self._sampling = [_sampling(s) for s in (raw if isinstance(raw, list) else [raw or {}])]
        ns = {_n(s) for s in self._sampling}
        if len(ns) > 1:
            raise APIError(400, "every prompt of a batch needs the same sampling_params.n", "sampling_params.n",
                           "invalid_value")
        for name in ("extra_key", "cache_salt"):
            keys = getattr(self, name)
            if isinstance(keys, list) and len(keys) != self.batch_size:
                raise APIError(400, f"{name} has {len(keys)} entries for {self.batch_size} prompts; send one per "
                                    f"prompt, or one string for all", name, "invalid_value")
        for p in range(self.batch_size):
            salt, extra = _key(self.cache_salt, p), _key(self.extra_key, p)
            check_namespace(salt, "cache_salt")
            check_namespace(extra, "extra_key")
            if salt is not None and extra is not None and salt != extra:
                raise APIError(400, "cache_salt and extra_key name the same cache namespace here; send one of them "
                                    "(or the same value in both)", "cache_salt", "invalid_value")

    @property
    def is_batch(self) -> bool:
        return isinstance(self.text, list) or (bool(self.input_ids) and isinstance(self.input_ids[0], list))

    @property
    def batch_size(self) -> int:
        return len(self.prompts())

    def prompts(self) -> list[Union[str, list[int]]]:
        field = "text" if self.text is not None else "input_ids"
        p = self.text if self.text is not None else self.input_ids
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, f"{field} is an empty list: send at least one prompt", field, "invalid_value")
        return list(p) if self.is_batch else [list(p)]

    @property
    def prompt_param(self) -> str:
        return "text" if self.text is not None else "input_ids"

    # ----- what ChoiceRun reads (openai_run.RunBody) ----------------------------------------------
    @property
    def choices_per_prompt(self) -> int:
        return _n(self._sampling[0])

    def namespace(self, prompt: int = 0) -> Optional[str]:
        """The cache namespace of prompt `prompt`: its cache_salt or extra_key; "" is none (SGLang's reading)."""
        salt = _key(self.cache_salt, prompt)
        return salt if salt is not None else _key(self.extra_key, prompt)

    def max_tokens_param(self) -> str:
        return "sampling_params.max_new_tokens"

    def open_ended(self, prompt: int = 0) -> bool:
        return self._for(prompt).open_ended()

    def sampling_key(self, prompt: int = 0) -> int:
        """Which sampling_params entry prompt `prompt` uses (one for all, or one each)."""
        return prompt if len(self._sampling) > 1 else 0

    def params(self, choice: int = 0, prompt: int = 0) -> SamplingParams:
        """Validated SamplingParams of choice `choice` of prompt `prompt` (with n > 1 and a seed, choice i gets
        seed + i wrapped to 64 bits, as the OpenAI routes do); 400 naming the sampling field."""
        s = self._for(prompt)
        try:
            # null: ChoiceRun sets the room left once the prompt is tokenized; validated against no limit until then
            return engine_params(
                choice, max_new_tokens=OPEN_ENDED if s.max_new_tokens is None else s.max_new_tokens,
                temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.sampling_seed, stop=s.stop,
                ignore_eos=s.ignore_eos, priority=self.priority, frequency_penalty=s.frequency_penalty,
                presence_penalty=s.presence_penalty, repetition_penalty=s.repetition_penalty,
                min_new_tokens=s.min_new_tokens, logit_bias=s.logit_bias, top_k_off=TOP_K_OFF)
        except ParamError as exc:
            raise self.param_error(exc) from None

    def param_error(self, exc: ParamError) -> APIError:
        """The engine's message about one of its fields, about the SGLang field the client sent."""
        if exc.field == "priority":
            return APIError(400, str(exc), "priority", "invalid_value")
        theirs = "sampling_seed" if exc.field == "seed" else exc.field
        message = str(exc).replace("seed", "sampling_seed", 1) if exc.field == "seed" else str(exc)
        return APIError(400, message, f"sampling_params.{theirs}", "invalid_value")

    def _for(self, prompt: int) -> NativeSampling:
        return self._sampling[prompt if len(self._sampling) > 1 else 0]


# every NOT_HONOURED field, typed Any (its no-op values decide, check_noops): declared from the table, so a field and
# its rule cannot drift apart
GenerateRequest = create_model("GenerateRequest", __base__=GenerateBody, __module__=__name__,
                               **{name: (Any, None) for name in NOT_HONOURED})


def _key(keys: Union[str, list[str], None], prompt: int) -> Optional[str]:
    key = keys[prompt] if isinstance(keys, list) else keys
    return key or None


def _sampling(raw: dict) -> NativeSampling:
    try:
        s = parse(NativeSampling, raw)
    except APIError as err:
        raise APIError(400, f"sampling_params: {err.message}", f"sampling_params.{err.param}", err.code) from None
    check_noops(s, SAMPLING_NOT_HONOURED, "sampling_params.")
    _n(s)
    return s


def _n(s: NativeSampling) -> int:
    n = 1 if s.n is None else s.n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise APIError(400, f"sampling_params.n must be an integer from 1 to {MAX_N}, got {s.n!r}",
                       "sampling_params.n", "invalid_value")
    return n


class AbortRequest(BaseModel):
    """SGLang's /abort_request body (AbortReq)."""
    model_config = ConfigDict(extra="forbid")

    rid: Optional[str] = ""                      # a meta_info.id, or the response id before its "-<i>"
    abort_all: StrictBool = False
    abort_message: Optional[str] = None          # accepted and ignored: the answer says it was aborted
    finished_reason: Optional[dict[str, Any]] = None
    weight_versions: Any = None
    http_worker_ipc: Any = None


def parse_generate(data: dict) -> GenerateBody:
    """A checked GenerateRequest, or a 400 naming the field."""
    body = parse(GenerateRequest, data)
    body.check()
    return body
