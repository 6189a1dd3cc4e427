"""The dashboard's routes under /state: everything `radixui.connect.http_client.HttpClient` asks for.

Reads (the inference role): version (cheap: no snapshot is built), snapshot (JSON of
`Engine.snapshot(wait=False)`, built and serialised once per engine change on the worker pool, 304
when the caller's ETag is current), events since a sequence number (a bounded page), config, a
request's tokens (its owner's or the admin's only), token bytes. Without the admin key a snapshot
and the events carry no prompt or output text and no token ids (redact.py).
Requests: submit, and abort of one's own requests (the admin may abort any).
Admin only: rebuild and step mode (POST /flush_cache is in app.py).
"""
from __future__ import annotations

import threading
from dataclasses import fields
from typing import Any, Optional

from fastapi import APIRouter, Depends, Query, Request, Response

from core.engine.sampling import ParamError, SamplingParams
from core.observe import wire
from core.server import api_schema, redact
from core.server.auth import Caller
from core.server.body_checks import check_namespace
from core.server.cpu_pool import CpuPool
from core.server.errors import APIError
from core.server.host import EngineHost, new_id
from core.server.json_body import parse_object
from core.server.openai_run import fit_error

MAX_TOKEN_IDS = 50_000
PARAM_FIELDS = {f.name for f in fields(SamplingParams)}


class SnapshotCache:
    """The serialised snapshot, full and redacted, of the engine's last state (built once each)."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.lock = threading.Lock()
        self.snap = None
        self.bodies: dict[bool, bytes] = {}

    def body(self, admin: bool) -> tuple[bytes, str]:
        """(JSON, ETag): the ETag is the version this snapshot describes (host.version() while it is current,
        never the version now), and says whose view it is."""
        e = self.host.engine
        snap = e.snapshot(wait=False)
        with self.lock:
            if self.snap is not snap:
                self.snap, self.bodies = snap, {}
            if admin not in self.bodies:
                self.bodies[admin] = wire.snapshot_to_json(snap if admin else redact.snapshot(snap))
            return self.bodies[admin], f'"{hash((id(e), self.host.generation, snap.version))}{"a" if admin else "r"}"'



def _not_yours(caller: Caller, rid: str, where: str) -> APIError:
    """The 404 for a request the caller may not touch, whether or not it exists (EngineHost.owned)."""
    if caller.owns_requests:
        return APIError(404, f"no request {rid!r} of yours {where}", code="request_not_found")
    return APIError(404, f"no request {rid!r} of yours {where}: requests sent without a key belong to no one "
                         f"(every keyless caller looks the same), so only the admin key may read or abort them; "
                         f"start the server with --api-key to let clients act on their own requests",
                    code="request_not_found")


def router(host: EngineHost, pool: CpuPool, read_body, inference, admin) -> APIRouter:
    r = APIRouter(prefix="/state")
    snapshots = SnapshotCache(host)

    async def body_json(request: Request) -> dict:
        return await pool.run(parse_object, await read_body(request), True)

    def status(caller: Caller) -> dict[str, Any]:
        e = host.engine
        return {"version": host.version(), "tree_seq": e.cache.events.last_tree_seq,
                "stepping": not e.running, "last_error": e.last_error,
                "inflight": len(host.inflight), "model": host.served_model_name, "admin": caller.admin}

    @r.get("/version", operation_id="state_version", response_model=api_schema.EngineStatus)
    async def version(caller: Caller = Depends(inference)):
        return status(caller)

    @r.get("/snapshot", operation_id="state_snapshot", response_class=Response,
           responses={200: {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/OpenObject"}}},
                            "description": "core.observe.wire's JSON of an EngineSnapshot (no text without the "
                                           "admin key)"},
                      304: {"description": "unchanged since the ETag sent in If-None-Match"}})
    async def snapshot(request: Request, caller: Caller = Depends(inference)):
        body, etag = await pool.run(snapshots.body, caller.admin)
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"ETag": etag})
        return Response(body, media_type="application/json", headers={"ETag": etag})

    @r.get("/events", operation_id="state_events", response_model=api_schema.EventPage)
    async def events(since: int = Query(0, ge=0, le=2 ** 62), limit: int = Query(2000, ge=1, le=wire.MAX_EVENTS_PAGE),
                     newest: bool = False, caller: Caller = Depends(inference)):
        def page() -> dict:
            log = host.engine.cache.events
            got = [wire.event_to_dict(ev) for ev in log.page(since, limit, newest=newest)]
            if not caller.admin:
                got = [redact.event(d) for d in got]
            return {"events": got, "last_seq": log.last_seq}
        return await pool.run(page)

    @r.post("/requests", operation_id="state_submit", response_model=api_schema.Submitted,
            openapi_extra=api_schema.request_body(api_schema.OpenObject))
    async def submit(request: Request, caller: Caller = Depends(inference)):
        data = await body_json(request)
        params, prompt, key = _submission(data)
        engine = host.reserve(1)
        released = []

        def release(*_) -> None:      # once: by the request's end, or here when it never started
            if not released:
                released.append(True)
                host.release(1)
        try:
            ids, n = await pool.run(host.prepare, engine, prompt)
            err = fit_error(host, engine, n, params, "prompt", "max_new_tokens")
            if err is not None:
                raise err
            h = await pool.run(host.submit, engine, ids, params, key, caller, new_id("req"), None, release)
        except ParamError as exc:
            release()
            raise APIError(400, str(exc), exc.field, "invalid_value") from None
        except ValueError as exc:
            release()
            raise APIError(400, str(exc)) from None
        except BaseException:
            release()
            raise
        return {"rid": h.rid}

    @r.get("/requests/{rid}/tokens", operation_id="state_request_tokens", response_model=api_schema.RequestTokens)
    async def request_tokens(rid: str, caller: Caller = Depends(inference)):
        toks = host.engine.request_tokens(rid) if host.owned(caller, rid) == [rid] else None
        if toks is None:
            raise _not_yours(caller, rid, "in the engine's table (it keeps the last finished ones)")
        return toks

    @r.post("/token_bytes", operation_id="state_token_bytes", response_model=api_schema.TokenBytes,
            openapi_extra=api_schema.request_body(api_schema.OpenObject))
    async def token_bytes(request: Request, caller: Caller = Depends(inference)):
        ids = (await body_json(request)).get("ids")
        vocab = host.engine.runner.vocab_size
        if not isinstance(ids, list) or len(ids) > MAX_TOKEN_IDS or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise APIError(400, f"send {{\"ids\": [token ids]}}: at most {MAX_TOKEN_IDS:,} integers in "
                                f"0..{vocab - 1}", "ids")
        return {"bytes": [b.hex() for b in await pool.run(host.engine.token_bytes, ids)]}

    @r.post("/requests/{rid}/abort", operation_id="state_abort", response_model=api_schema.Aborted)
    async def abort(rid: str, caller: Caller = Depends(inference)):
        """Abort a request (an engine request id, or an OpenAI response id: all its choices): the caller's
        own, or any with the admin key. 404 for a request that is not the caller's, as for one that never was."""
        aborted = await pool.run(host.abort_owned, caller, rid)
        if aborted is None:
            raise _not_yours(caller, rid, "to abort")
        return {"aborted": aborted}

    @r.get("/config", operation_id="state_config", response_model=api_schema.OpenObject)
    async def config(caller: Caller = Depends(inference)):
        return host.config()

    @r.post("/rebuild", operation_id="state_rebuild", response_model=api_schema.RebuildResult,
            openapi_extra=api_schema.request_body(api_schema.OpenObject))
    async def rebuild(request: Request, caller: Caller = Depends(admin)):
        data = await body_json(request)
        await pool.run(host.rebuild, data)
        return {"config": host.config()}

    @r.post("/step_mode", operation_id="state_step_mode", response_model=api_schema.EngineStatus,
            openapi_extra=api_schema.request_body(api_schema.OpenObject))
    async def step_mode(request: Request, caller: Caller = Depends(admin)):
        on = (await body_json(request)).get("on")
        if not isinstance(on, bool):
            raise APIError(400, 'send {"on": true} or {"on": false}', "on")
        e = host.engine
        if on and e.running:
            await pool.run(e.stop)
        elif not on and not e.running:
            e.start()
        return status(caller)

    @r.post("/step", operation_id="state_step", response_model=api_schema.Stepped)
    async def step(caller: Caller = Depends(admin)):
        e = host.engine
        if e.running:
            raise APIError(409, "the engine loop is running; turn step mode on first (POST /state/step_mode)")
        return {"stepped": await pool.run(e.step)}

    return r


SUBMISSION_FIELDS = {"prompt", "params", "extra_key"}


def _submission(data: dict) -> tuple[SamplingParams, Any, Optional[str]]:
    unknown = sorted(set(data) - SUBMISSION_FIELDS)
    if unknown:   # a top-level max_new_tokens was quietly ignored (the request ran with the default)
        raise APIError(400, f"unknown field {unknown[0]!r}: send prompt, params (SamplingParams fields, e.g. "
                            f"max_new_tokens) and extra_key", unknown[0], "unknown_parameter")
    raw = data.get("params")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict) or set(raw) - PARAM_FIELDS:
        raise APIError(400, f"params must be an object with SamplingParams fields "
                            f"({', '.join(sorted(PARAM_FIELDS))})", "params")
    if isinstance(raw.get("stop"), list):
        raw["stop"] = tuple(raw["stop"])
    params = SamplingParams(**raw)
    try:
        params.validate()
    except ParamError as exc:
        raise APIError(400, str(exc), exc.field, "invalid_value") from None
    key = data.get("extra_key")
    if key is not None and not isinstance(key, str):
        raise APIError(400, "extra_key must be a string or null", "extra_key")
    return params, data.get("prompt"), check_namespace(key, "extra_key")
