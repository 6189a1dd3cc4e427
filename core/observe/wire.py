"""JSON (de)serialisation of the engine's views: EngineSnapshot, Event, and what they hold.

The codec walks dataclass fields and type hints instead of naming each field, so a field the
engine adds to a view travels without a change here. numpy arrays go as base64 of their raw
bytes (a 30-layer x 8,192-slot K-norm map is 1 MB of float32; as a JSON list of floats it
would be ~4x bigger and ~50x slower to build). Both sides are ours: NaN travels as JSON NaN.
Imports neither FastAPI nor httpx, so the dashboard's client and the server share it.
"""
from __future__ import annotations

import base64
import collections.abc
import dataclasses
import json
import types
import typing
from functools import lru_cache
from typing import Any, Union, get_args, get_origin

import numpy as np

from core.cache.events import EVENT_TYPES, Event
from core.observe.snapshot import EngineSnapshot

_SCALARS = (int, float, str, bool, type(None))
MAX_EVENTS_PAGE = 10_000   # the most events one /state/events page holds (the server's bound, the client's ask)


def encode(obj: Any) -> Any:
    """A JSON-ready value: dataclasses become objects, arrays become {"__nd__", "shape", "b64"}."""
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return {"__nd__": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        if all(type(x) in (int, float, str) for x in obj):  # token ids, slots: the bulk of a snapshot
            return list(obj)
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, collections.abc.Sequence) and not isinstance(obj, (str, bytes)):
        return encode(list(obj))   # tuple-like views (a lazy eviction order) travel as lists
    raise TypeError(f"cannot send a {type(obj).__name__} over the wire")


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(tp: Any, value: Any) -> Any:
    """The inverse of `encode`, guided by the type hint `tp` of where the value lands."""
    if value is None:
        return None
    if isinstance(value, dict) and "__nd__" in value:
        a = np.frombuffer(base64.b64decode(value["b64"]), dtype=np.dtype(value["__nd__"]))
        return a.reshape(value["shape"])  # read-only, like core.observe.snapshot.frozen_array
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(tp) if a is not type(None)]
        return decode(args[0], value) if len(args) == 1 else value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{f.name: decode(hints[f.name], value[f.name])
                     for f in dataclasses.fields(tp) if f.init and f.name in value})
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            if args[0] in (int, float, str):
                return tuple(value)
            return tuple(decode(args[0], v) for v in value)
        return tuple(decode(a, v) for a, v in zip(args, value))
    if origin is collections.abc.Sequence:
        (arg,) = get_args(tp) or (Any,)
        return tuple(value) if arg in (int, float, str) else tuple(decode(arg, v) for v in value)
    if origin is list:
        (arg,) = get_args(tp) or (Any,)
        return [decode(arg, v) for v in value]
    if origin is dict:
        kt, vt = get_args(tp) or (str, Any)
        return {(int(k) if kt is int else k): decode(vt, v) for k, v in value.items()}
    return value   # JSON keeps int and float apart, as the views do (metrics mix them)


def dumps(obj: Any) -> bytes:
    return json.dumps(encode(obj), separators=(",", ":")).encode("utf-8")


def snapshot_to_json(snap: EngineSnapshot) -> bytes:
    return dumps(snap)


def snapshot_from_json(data: Union[bytes, str, dict]) -> EngineSnapshot:
    value = json.loads(data) if isinstance(data, (bytes, str)) else data
    return decode(EngineSnapshot, value)


def event_to_dict(ev: Event) -> dict[str, Any]:
    d = encode(ev)
    d["kind"] = ev.kind
    return d


def event_from_dict(d: dict[str, Any]) -> Event:
    cls = EVENT_TYPES.get(d.get("kind"))
    if cls is None:
        raise ValueError(f"unknown event kind {d.get('kind')!r}")
    return decode(cls, d)
