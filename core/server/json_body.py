"""A request body, read within a size limit and a read timeout, then parsed as one JSON object.

Reading: a declared Content-Length over the limit is refused before a byte is read, and a body
that stops arriving (a Content-Length larger than what is sent, a client that stalls) ends in
408 after `idle_s` without a byte, instead of holding the connection forever.
Parsing (done on a worker thread, see cpu_pool.py): nesting past MAX_JSON_DEPTH levels is a 400, not a
RecursionError's 500 (from the parser at ~10,000 levels, or at ~1,000 from the first `repr` that quotes a
value back in an error); a string holding a lone UTF-16 surrogate ("\\ud800", valid JSON but not
text) is a 400 naming the field, before it can reach a tokenizer or a template.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Optional

from fastapi import Request

from core.server.errors import APIError

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_READ_TIMEOUT_S = 10.0
MAX_BODY_SECONDS_PER_MB = 10.0      # a whole body may take at most this long per MB (plus idle_s)
MAX_JSON_DEPTH = 64                 # objects and lists within one another; a request of any route needs < 10


def make_body_reader(limit: int, idle_s: float = DEFAULT_READ_TIMEOUT_S):
    async def read_body(request: Request) -> bytes:
        """The body, or 413 as soon as it passes `limit`, or 408 when it stops arriving."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the body is {int(declared):,} bytes, over the server's limit of {limit:,} "
                                f"(--max-body-bytes)", code="request_too_large")
        chunks, size = [], 0
        deadline = time.monotonic() + idle_s + MAX_BODY_SECONDS_PER_MB * limit / 2**20
        stream = request.stream().__aiter__()
        while True:
            wait = min(idle_s, deadline - time.monotonic())
            try:
                chunk = await asyncio.wait_for(stream.__anext__(), max(wait, 0.001))
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise APIError(408, f"the request body stopped arriving ({size:,} bytes read"
                                    + (f" of a declared {int(declared):,}" if declared and declared.isdigit() else "")
                                    + f"); send the whole body within {idle_s:g} s between bytes",
                               code="request_timeout", headers={"Connection": "close"}) from None
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the body is over the server's limit of {limit:,} bytes (--max-body-bytes)",
                               code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)
    return read_body


def parse_object(raw: bytes, allow_empty: bool = False) -> dict[str, Any]:
    """`raw` as a JSON object, or a 400 that says what is wrong with it."""
    if not raw.strip():
        if allow_empty:
            return {}
        raise APIError(400, "the body is empty; send a JSON object")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise too_deep(None) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise APIError(400, f"the body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(data, dict):
        kind = {type(None): "null", bool: "boolean", list: "array", str: "string"}.get(type(data), "number")
        raise APIError(400, f"the body must be a JSON object, got a JSON {kind}")
    check_text(data)
    return data


def too_deep(where: Optional[str]) -> APIError:
    top = where.split(".")[0].split("[")[0] if where else None     # the parameter; the full path can be long
    at = f" in {top}" if top else ""
    return APIError(400, f"the body's JSON is nested more than {MAX_JSON_DEPTH} levels deep{at}; no parameter "
                         f"takes that: send at most a few levels of objects and lists", top)


def check_text(value: Any) -> None:
    """Every string (keys included) must be encodable as UTF-8, and nothing nested past MAX_JSON_DEPTH; walked
    without recursion."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        where, v, depth = stack.pop()
        if isinstance(v, str):
            _check_str(where, v)
            continue
        if isinstance(v, (dict, list)) and depth >= MAX_JSON_DEPTH:
            raise too_deep(where)
        if isinstance(v, dict):
            for k, x in v.items():
                _check_str(where or "body", k)
                stack.append((f"{where}.{k}" if where else k, x, depth + 1))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x, depth + 1) for i, x in enumerate(v))


def _check_str(where: str, s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        top = where.split(".")[0].split("[")[0] or None
        raise APIError(400, f"{where or 'a key'} holds a lone UTF-16 surrogate ({s[exc.start]!a} at character "
                            f"{exc.start}), which is not text; send valid Unicode", top,
                       "invalid_unicode") from None
