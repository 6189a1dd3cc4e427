"""The dashboard's routes under /state: everything `radixui.connect.http_client.HttpClient` asks for.

version (cheap: no snapshot is built), snapshot (JSON of `Engine.snapshot(wait=False)`, built
and serialised once per engine change, 304 when the caller's ETag is current), events since a
sequence number (a bounded page read straight off the ring, never a copy of the whole log),
submit / abort, config / rebuild, and step mode.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import fields
from typing import Any, Optional

from fastapi import APIRouter, Query, Request, Response

from core.engine.sampling import SamplingParams
from core.observe import wire
from core.server.errors import APIError
from core.server.host import EngineHost
from core.server.openai_routes import classify

MAX_EVENTS_PAGE = 10_000
PARAM_FIELDS = {f.name for f in fields(SamplingParams)}


MAX_TOKEN_IDS = 50_000


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
        log = host.engine.cache.events
        page = log.page(since, limit, newest=newest)
        return {"events": [wire.event_to_dict(ev) for ev in page], "last_seq": log.last_seq}

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

    @r.get("/requests/{rid}/tokens")
    async def request_tokens(rid: str):
        toks = host.engine.request_tokens(rid)
        if toks is None:
            raise APIError(404, f"no request {rid!r} in the engine's table (it keeps the last finished ones)")
        return toks

    @r.post("/token_bytes")
    async def token_bytes(request: Request):
        ids = (await body_json(request)).get("ids")
        if not isinstance(ids, list) or len(ids) > MAX_TOKEN_IDS or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < host.engine.runner.vocab_size for t in ids):
            raise APIError(400, f"send {{\"ids\": [token ids]}}: at most {MAX_TOKEN_IDS:,} integers in "
                                f"0..{host.engine.runner.vocab_size - 1}", "ids")
        return {"bytes": [b.hex() for b in await asyncio.to_thread(host.engine.token_bytes, ids)]}

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
