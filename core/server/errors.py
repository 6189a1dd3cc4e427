"""Errors in OpenAI's JSON shape, so the official clients raise their usual exception types
(BadRequestError, AuthenticationError, NotFoundError, ...) with our message in them.

As OpenAI's: `{"error": {"message", "type", "param", "code"}}` with `code` a string and `param`
the request field at fault (or null). Every 503 carries Retry-After, every 405 Allow, every 401
WWW-Authenticate. A body is written ASCII-escaped, so an error that quotes a lone surrogate a
client sent still renders (as `\\ud800`) instead of failing with a 500.
"""
from __future__ import annotations

import json
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",   # OpenAI's
         404: "invalid_request_error", 405: "invalid_request_error", 408: "invalid_request_error",
         409: "conflict_error", 413: "invalid_request_error", 415: "invalid_request_error",
         503: "service_unavailable"}
CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "forbidden", 404: "not_found",
         405: "method_not_allowed", 408: "request_timeout", 409: "conflict", 413: "request_too_large",
         415: "unsupported_media_type", 500: "internal_error", 503: "service_unavailable"}
RETRY_AFTER_S = 1


class APIError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param,
                      "code": code or CODES.get(status, "error")}}


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate quoted back cannot break it."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_headers(status: int, headers: Optional[dict[str, str]] = None) -> dict[str, str]:
    out = dict(headers or {})
    if status == 401:
        out.setdefault("WWW-Authenticate", "Bearer")
    if status == 503:
        out.setdefault("Retry-After", str(RETRY_AFTER_S))
    return out


def error_response(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                   headers: Optional[dict] = None) -> JSONResponse:
    return AsciiJSONResponse(error_body(status, message, param, code), status_code=status,
                             headers=error_headers(status, headers))


def install(app: FastAPI) -> None:
    """Every error the app can raise, including FastAPI's own 404/405/422, leaves as OpenAI JSON."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        headers = exc.headers
        if exc.status_code == 405:
            allow = allowed_methods(request) or (exc.headers or {}).get("Allow", "")
            headers = {**(exc.headers or {}), "Allow": allow}
            message = f"{request.method} is not allowed on {request.url.path}; use {allow or 'another method'}"
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # a bug, not the client's fault: still OpenAI's JSON (the trace goes to the server's log, not the client)
        return error_response(500, f"internal error ({type(exc).__name__}); the server's log has the details")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        return error_response(400, describe_validation(errs), first_field(errs))


def allowed_methods(request: Request) -> str:
    """Every method some route takes on this path: Starlette's 405 names only the first route that matched the
    path (/health's GET, not the HEAD route beside it). The app lists its routers' routes in `every_route`."""
    methods: set[str] = set()
    for route in request.app.state.every_route:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def first_field(errors) -> Optional[str]:
    """The top-level request field of pydantic's first error (OpenAI's `param`)."""
    for e in errors[:1]:
        loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
        if loc:
            return loc[0]
    return None


def describe_validation(errors) -> str:
    """pydantic's error list as one sentence a user can act on."""
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path"))
        parts.append(f"{where or 'body'}: {e.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)
