"""The KV event wire format SGLang and vLLM publish, as msgspec structs (decode both, encode SGLang's).

A batch is a positional msgpack array `[ts, events, dp_rank]` (array_like); each event is a
msgpack map tagged by its class name in `type` ("BlockStored", "BlockRemoved",
"AllBlocksCleared"), optional fields left at None omitted (omit_defaults). The ZMQ frames
around it are `[topic, seq as 8-byte big-endian, payload]`.

Decoding: `BlockStored` / `BlockRemoved` hold SGLang's fields (sglang/srt/disaggregation/
kv_events.py, sglang 0.5.23) then vLLM's (vllm/distributed/kv_events.py, vllm 0.33.0) with
defaults, so one decoder reads both engines; unknown fields are ignored, so a newer engine's
additions do not break decoding. Encoding: the `SGLang*` structs are exactly SGLang's fields in
its order, and the `VLLM*` structs vLLM's, so a batch we publish is byte for byte what that
engine would send and decodes with its own `KVEventBatch` (field order and even the field count
matter: msgspec sizes the map header by the fields a struct could emit; vLLM requires lora_id,
medium and lora_name in every BlockStored). SGLang's decoder cannot read a vLLM stream (its
hashes are ints, vLLM's bytes), nor vLLM's an SGLang one (no lora_name). vLLM's block hashes are 32-byte sha256 digests
(`bytes`) unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is set; SGLang's are signed int64.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

BlockHash = Union[int, bytes]
MEDIUM_GPU = "GPU"            # both engines' device tier; a missing medium means GPU
MEDIUM_ALIASES = {"CPU_PINNED": "CPU"}   # SGLang's host tier name -> vLLM's


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged union; the tag is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHash]
    parent_block_hash: Optional[BlockHash]
    # ints, or SGLang's bigram pages' pairs of ints; typed, so a None, float or string token is an undecodable
    # batch (a gap) like any other malformed payload, not an exception where the tree is rebuilt
    token_ids: list[Union[int, list[int]]]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None
    # vLLM only
    extra_keys: Optional[list[Any]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    lookahead_token_ids: Optional[list[list[int]]] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHash]
    medium: Optional[str] = None
    # vLLM only
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventBatch(msgspec.Struct, array_like=True, gc=False):
    """SGLang's `attn_dp_rank` / vLLM's `data_parallel_rank` is the third element."""
    ts: float
    events: list[Event]
    dp_rank: Optional[int] = None


class SGLangBlockStored(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class SGLangBlockRemoved(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str] = None


class SGLangKVEventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[SGLangBlockStored, SGLangBlockRemoved, AllBlocksCleared]]
    attn_dp_rank: Optional[int] = None


class VLLMBlockStored(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockStored"):
    """vLLM 0.33's BlockStored, field for field: lora_id, medium and lora_name have no default,
    so vLLM's decoder requires them (None included) in every BlockStored."""
    block_hashes: list[BlockHash]
    parent_block_hash: Optional[BlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    session_id: Optional[str] = None
    lookahead_token_ids: Optional[list[list[int]]] = None


class VLLMBlockRemoved(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockRemoved"):
    block_hashes: list[BlockHash]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


class VLLMKVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[VLLMBlockStored, VLLMBlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_encoder = msgspec.msgpack.Encoder()
END_SEQ = -1   # the replay socket's end-of-replay marker (signed 8 bytes)


class DecodeError(ValueError):
    """A payload that is not a KV event batch of either engine."""


def decode_batch(payload: bytes) -> KVEventBatch:
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise DecodeError(f"not a KV event batch ({e}); is the endpoint an SGLang/vLLM KV event publisher?") from None


def encode_batch(batch) -> bytes:
    return _encoder.encode(batch)


def seq_bytes(seq: int) -> bytes:
    return int(seq).to_bytes(8, "big", signed=True)


def seq_from_bytes(b: bytes) -> int:
    if len(b) != 8:
        raise DecodeError(f"sequence frame has {len(b)} bytes, expected 8")
    return int.from_bytes(b, "big", signed=True)


def medium_name(medium: Optional[str]) -> str:
    """One name per tier whichever engine sent it: None -> GPU, SGLang's CPU_PINNED -> CPU."""
    if medium is None:
        return MEDIUM_GPU
    return MEDIUM_ALIASES.get(medium, medium)
