"""The dashboard's routes under /state: everything `radixui.http_client.HttpClient` asks for.

version (cheap: no snapshot is built), snapshot (JSON of `Engine.snapshot(wait=False)`, built
and serialised once per engine change, 304 when the caller's ETag is current), events since a
sequence number (a bounded page read straight off the ring, never a copy of the whole log),
submit / abort, config / rebuild, and step mode.
"""
from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import fields
from typing import Any, Optional

from fastapi import APIRouter, Query, Request, Response

from core.engine import Engine
from core.events import Event
from core.sampling import SamplingParams
from core.server import wire
from core.server.errors import APIError
from core.server.host import EngineHost
from core.server.openai_routes import classify

MAX_EVENTS_PAGE = 10_000
PARAM_FIELDS = {f.name for f in fields(SamplingParams)}


def _ring(engine: Engine):
    log = engine.cache.events
    return getattr(log, "_events", None), getattr(log, "_lock", None)


def events_newest(engine: Engine, since: int, limit: int) -> list[Event]:
    """The newest `limit` events with seq > `since`, oldest first, walking back from the ring's end."""
    ring, lock = _ring(engine)
    if ring is None or lock is None:   # a log of another shape: use its public call
        return engine.events_since(since)[-limit:]
    out = []
    with lock:
        for ev in reversed(ring):
            if ev.seq <= since or len(out) >= limit:
                break
            out.append(ev)
    out.reverse()
    return out


def events_after(engine: Engine, since: int, limit: int) -> list[Event]:
    """The oldest `limit` events with seq > `since` (a forward page: call again from the last seq)."""
    ring, lock = _ring(engine)
    if ring is None or lock is None:
        return engine.events_since(since)[:limit]
    with lock:
        if not ring or ring[-1].seq <= since:
            return []
        start = max(0, since + 1 - ring[0].seq)
        if len(ring) - start <= limit:     # the usual poll: a short tail, read from the end
            tail = list(itertools.islice(reversed(ring), len(ring) - start))
            tail.reverse()
            return tail
        return list(itertools.islice(ring, start, start + limit))


def router(host: EngineHost, read_body) -> APIRouter:
    r = APIRouter(prefix="/state")
    cache: dict[str, Any] = {"snap": None, "body": b""}

    async def body_json(request: Request) -> dict:
        raw = await read_body(request)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise APIError(400, f"the body is not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object")
        return data

    def status() -> dict[str, Any]:
        e = host.engine
        return {"version": host.version(), "stepping": not e.running, "last_error": e.last_error,
                "inflight": len(host.inflight), "model": host.served_model_name}

    @r.get("/version")
    async def version():
        return status()

    def snapshot_bytes() -> tuple[bytes, int]:
        v = host.version()
        snap = host.engine.snapshot(wait=False)
        if cache["snap"] is not snap:
            cache["body"], cache["snap"] = wire.snapshot_to_json(snap), snap
        return cache["body"], v

    @r.get("/snapshot")
    async def snapshot(request: Request):
        etag = f'"{host.version()}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        body, v = await asyncio.to_thread(snapshot_bytes)
        return Response(body, media_type="application/json", headers={"ETag": f'"{v}"'})

    @r.get("/events")
    async def events(since: int = Query(0, ge=0), limit: int = Query(2000, ge=1, le=MAX_EVENTS_PAGE),
                     newest: bool = False):
        e = host.engine
        page = (events_newest if newest else events_after)(e, since, limit)
        return {"events": [wire.event_to_dict(ev) for ev in page], "last_seq": e.cache.events.last_seq}

    @r.post("/requests")
    async def submit(request: Request):
        data = await body_json(request)
        raw = data.get("params") or {}
        if not isinstance(raw, dict) or set(raw) - PARAM_FIELDS:
            raise APIError(400, f"params must be an object with SamplingParams fields "
                                f"({', '.join(sorted(PARAM_FIELDS))})", "params")
        if isinstance(raw.get("stop"), list):
            raw["stop"] = tuple(raw["stop"])
        params = SamplingParams(**raw)
        key: Optional[str] = data.get("extra_key")
        if key is not None and not isinstance(key, str):
            raise APIError(400, "extra_key must be a string or null", "extra_key")
        prompt = data.get("prompt")
        try:
            h = await asyncio.to_thread(host.submit, prompt, params, key)
        except ValueError as exc:
            raise classify(host, prompt, params, exc) from exc
        return {"rid": h.rid}

    @r.post("/requests/{rid}/abort")
    async def abort(rid: str):
        return {"aborted": host.abort(rid)}

    @r.get("/config")
    async def config():
        return host.config()

    @r.post("/rebuild")
    async def rebuild(request: Request):
        data = await body_json(request)
        await asyncio.to_thread(host.rebuild, data)
        return {"config": host.config()}

    @r.post("/step_mode")
    async def step_mode(request: Request):
        on = (await body_json(request)).get("on")
        if not isinstance(on, bool):
            raise APIError(400, 'send {"on": true} or {"on": false}', "on")
        e = host.engine
        if on and e.running:
            await asyncio.to_thread(e.stop)
        elif not on and not e.running:
            e.start()
        return status()

    @r.post("/step")
    async def step():
        e = host.engine
        if e.running:
            raise APIError(409, "the engine loop is running; turn step mode on first (POST /state/step_mode)")
        return {"stepped": await asyncio.to_thread(e.step)}

    return r
