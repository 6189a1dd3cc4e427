"""HttpClient: the EngineClient (radixui/connect/client.py) of an engine served by `python -m core.server`.

The page calls `version()` (cheap) on each refresh and `snapshot()` only when it moved; the
snapshot itself is fetched with its ETag, so an unchanged engine costs a 304 and no JSON.
Errors keep the interface's contract: bad input -> ValueError with the server's message,
refusals (reset while running, rebuild that fails, either without the admin key) -> the message
string, an unreachable server -> ConnectionError that names the URL and how to start one; step mode
without the admin key -> PermissionError with the server's message; any other error answer (a wrong key,
a server shutting down) -> ServerRefused (a RuntimeError) with the server's message. A page shows the last
two in place of its views (radixui/panels/server_down.py), never as a traceback.

The dashboard logs in with its own key: RADIX_ADMIN_KEY when set (everything, prompts included),
else RADIX_API_KEY (the engine's state without prompt text, its own requests, no rebuild or step
mode); the server's roles are described in core/server/auth.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import httpx

from core import env
from core.cache.events import Event
from core.engine.config import EngineConfig
from core.engine.config import names as config_names
from core.engine.sampling import SamplingParams
from core.observe import wire
from core.observe.snapshot import EngineSnapshot

REBUILD_READ_S = 1800.0     # how long a rebuild's answer may take: loading (or converting) the new model
POLL_READ_S = 10.0          # how long a read (version, snapshot, events, config) may take: a stopped or hung
#                             server is named within this, not after the 30 s a write may take, two or three times


class ServerRefused(RuntimeError):
    """The engine server answered, with an error that is not about the request's values (401, 404, 409, 5xx)."""


class HttpClient:
    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = 30.0,
                 admin_key: Optional[str] = None) -> None:
        """`api_key` / `admin_key`: default RADIX_API_KEY / RADIX_ADMIN_KEY; the admin key is sent when there is one."""
        self.url = url.rstrip("/")
        key = admin_key or env.admin_key() or api_key or env.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._snap: Optional[EngineSnapshot] = None
        self._etag: Optional[str] = None

    def close(self) -> None:
        self._http.close()

    # ----- transport ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kw) -> httpx.Response:
        if method == "GET" and "timeout" not in kw:
            read = self._http.timeout.read
            kw["timeout"] = httpx.Timeout(self._http.timeout.connect,
                                          read=POLL_READ_S if read is None else min(POLL_READ_S, read))
        try:
            return self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise ConnectionError(f"the engine server at {self.url} did not answer in time ({type(exc).__name__}): "
                                  f"it may be stopped, hung or overloaded") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"no engine server answers at {self.url} ({type(exc).__name__}: {exc}); start one "
                                  f"with `python -m core.server` or fix RADIX_ENGINE_URL") from exc

    @staticmethod
    def _message(r: httpx.Response) -> str:
        try:
            return r.json()["error"]["message"]
        except Exception:
            return f"HTTP {r.status_code}: {r.text[:200]}"

    def _refused(self, what: str, r: httpx.Response) -> "ServerRefused":
        """The server's refusal, said with what to change on this side when it is the key."""
        hint = ""
        if r.status_code == 401:
            hint = ("; the dashboard sends RADIX_ADMIN_KEY, else RADIX_API_KEY: start it with the server's key in "
                    "one of them")
        return ServerRefused(f"{what} failed: {self._message(r)}{hint}")

    def _json(self, method: str, path: str, **kw) -> Any:
        r = self._request(method, path, **kw)
        if r.status_code in (400, 413):
            raise ValueError(self._message(r))
        if r.status_code >= 400:
            raise self._refused(f"{method} {path}", r)
        return r.json()

    def _status(self) -> dict:
        return self._json("GET", "/state/version")

    # ----- EngineClient ------------------------------------------------------------------------
    def version(self) -> int:
        return int(self._status()["version"])

    def versions(self) -> tuple[int, int]:
        s = self._status()
        return int(s["version"]), int(s.get("tree_seq", 0))   # an older server: no tree_seq, the pace decides

    def snapshot(self) -> EngineSnapshot:
        headers = {"If-None-Match": self._etag} if self._etag and self._snap is not None else {}
        r = self._request("GET", "/state/snapshot", headers=headers)
        if r.status_code == 304 and self._snap is not None:
            return self._snap
        if r.status_code >= 400:
            raise self._refused("GET /state/snapshot", r)
        self._snap, self._etag = wire.snapshot_from_json(r.content), r.headers.get("etag")
        return self._snap

    def events_since(self, seq: int, limit: int = 2000) -> list[Event]:
        limit = max(1, min(int(limit), wire.MAX_EVENTS_PAGE))   # the server's page bound
        data = self._json("GET", "/state/events", params={"since": max(0, int(seq)), "limit": limit,
                                                          "newest": "true"})
        return [wire.event_from_dict(d) for d in data["events"]]

    def submit(self, prompt, params: SamplingParams, extra_key: Optional[str] = None) -> str:
        p = dataclasses.asdict(params)
        p["stop"] = list(p["stop"]) if not isinstance(p["stop"], str) else p["stop"]
        body = {"prompt": prompt if isinstance(prompt, str) else list(prompt), "params": p, "extra_key": extra_key}
        r = self._request("POST", "/state/requests", json=body)
        if r.status_code in (400, 413, 503):
            raise ValueError(self._message(r))
        if r.status_code >= 400:
            raise self._refused("submit", r)
        return r.json()["rid"]

    def token_bytes(self, token_ids) -> list[str]:
        out: list[str] = []
        ids = [t.item() if hasattr(t, "item") else t for t in token_ids]   # numpy ints as JSON; the server checks types
        for i in range(0, len(ids), 50_000):          # core.server.state_routes.MAX_TOKEN_IDS a call
            out += self._json("POST", "/state/token_bytes", json={"ids": ids[i:i + 50_000]})["bytes"]
        return out

    def request_tokens(self, rid: str) -> Optional[dict]:
        r = self._request("GET", f"/state/requests/{rid}/tokens")
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise self._refused(f"GET /state/requests/{rid}/tokens", r)
        return r.json()

    def abort(self, rid: str) -> bool:
        r = self._request("POST", f"/state/requests/{rid}/abort")
        if r.status_code == 404:    # not ours (or never was): nothing of ours was running
            return False
        if r.status_code >= 400:
            raise self._refused("abort", r)
        return bool(r.json()["aborted"])

    def abort_all(self) -> int:
        """The server's /abort_request: the requests of its multi-choice calls not submitted yet end too."""
        return int(self._json("POST", "/abort_request", json={"abort_all": True})["aborted"])

    def config(self) -> EngineConfig:
        data = self._json("GET", "/state/config")
        known = set(config_names())     # a newer server may know settings this dashboard does not
        return EngineConfig(**{k: v for k, v in data.items() if k in known})

    def rebuild(self, config: EngineConfig) -> Optional[str]:
        # a rebuild answers once the new model is loaded: minutes for a large one, or a GGUF converted first
        r = self._request("POST", "/state/rebuild", json=config.as_dict(),
                          timeout=httpx.Timeout(self._http.timeout.connect, read=REBUILD_READ_S))
        return None if r.status_code == 200 else self._message(r)

    def reset_cache(self) -> Optional[str]:
        r = self._request("POST", "/flush_cache")
        return None if r.status_code == 200 else self._message(r)

    def last_error(self) -> Optional[str]:
        return self._status()["last_error"]

    def is_admin(self) -> bool:
        return bool(self._status().get("admin", True))   # an older server does not say: its refusals will

    def is_stepping(self) -> bool:
        return bool(self._status()["stepping"])

    def set_step_mode(self, on: bool) -> None:
        r = self._request("POST", "/state/step_mode", json={"on": bool(on)})
        if r.status_code in (401, 403):
            raise PermissionError(self._message(r))
        if r.status_code >= 400:
            raise self._refused("POST /state/step_mode", r)

    def step(self) -> bool:
        r = self._request("POST", "/state/step")
        if r.status_code == 409:   # the loop is running: it steps by itself
            return False
        if r.status_code in (401, 403):
            raise PermissionError(self._message(r))
        if r.status_code >= 400:
            raise self._refused("step", r)
        return bool(r.json()["stepped"])
