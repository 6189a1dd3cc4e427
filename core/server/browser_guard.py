"""What a web page in someone's browser may not do to this server (as Jupyter and Ray's dashboard guard):

- DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and reads our answers. The
  browser then sends `Host: evil.example`, so only Host names on an allow-list are served: loopback
  names and addresses by default, plus `--allowed-hosts` (and, on a wildcard bind, this machine's
  names and any IP literal, which no rebinding can produce).
- Cross-site requests: a page may POST a "simple" request (text/plain, a form) anywhere without
  asking. A request that changes state (anything but GET/HEAD/OPTIONS) with an `Origin` other than
  the server's own (or one of `--allowed-origins`) is refused, and a POST with a body must say
  `Content-Type: application/json`, which a page can send cross-site only after a CORS preflight
  this server never grants. GET changes no state a client can see (GET /flush_cache is a 405); the one
  GET that runs anything, /health_generate, generates one token at most once a minute on an idle
  engine, counted nowhere.
Clients that are not browsers (curl, openai, sglang-router) send no Origin and are unaffected.
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Iterable, Optional, Union
from urllib.parse import urlsplit

from core.server.errors import error_response

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
WILDCARDS = ("0.0.0.0", "::", "", "*")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def split_host(value: str) -> str:
    """'Example.com:8080' -> 'example.com'; '[::1]:80' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        return value.split(":")[0]
    return value


def _ip(host: str) -> Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class HostPolicy:
    """Which Host headers and Origins this server answers."""

    def __init__(self, bind: str = "127.0.0.1", allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = ()) -> None:
        extra = [h.strip().lower() for h in allowed_hosts if h.strip()]
        self.any_host = "*" in extra
        self.names = set(LOOPBACK_NAMES) | {split_host(h) for h in extra if h != "*"}
        self.any_ip = False
        if bind in WILDCARDS:       # served on every interface: what other machines call it
            self.any_ip = True
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    self.names.add(name.lower())
        elif bind:
            self.names.add(split_host(bind) if not _ip(bind) else bind.lower())
        origins = [o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()]
        self.any_origin = "*" in origins
        self.origins = set(origins) - {"*"}

    def host_ok(self, host_header: Optional[str]) -> bool:
        if host_header is None or self.any_host:
            return True
        host = split_host(host_header)
        addr = _ip(host)
        if addr is not None:
            return addr.is_loopback or self.any_ip or host in self.names
        return host in self.names

    def origin_ok(self, origin: str, host_header: Optional[str], scheme: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if self.any_origin or origin in self.origins:
            return True
        parts = urlsplit(origin)
        if not parts.scheme or not parts.netloc or host_header is None:
            return False        # "null" (sandboxed frames, file://) and anything unparsable
        return parts.netloc == host_header.strip().lower() and parts.scheme == scheme

    def describe(self) -> str:
        if self.any_host:
            return "any Host"
        names = ", ".join(sorted(self.names))
        return f"Host: loopback addresses, {names}" + (", any IP address" if self.any_ip else "")


class BrowserGuard:
    """ASGI middleware: Host allow-list, Origin check and JSON content type before any route runs."""

    def __init__(self, app, policy: HostPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope):
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = headers.get("host")
        if not self.policy.host_ok(host):
            return error_response(403, f"this server does not answer to Host {host!r}; reach it by a name it "
                                       f"knows or start it with --allowed-hosts {split_host(host)!r}",
                                  code="host_not_allowed")
        method = scope.get("method", "GET").upper()
        if method in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_ok(origin, host, scope.get("scheme", "http")):
            return error_response(403, f"cross-site request from Origin {origin!r} refused; a page of another "
                                       f"site may not change this server (--allowed-origins lists exceptions)",
                                  code="origin_not_allowed")
        if method == "POST" and _has_body(headers) and not _is_json(headers.get("content-type", "")):
            return error_response(415, f"a POST body must be JSON: send 'Content-Type: application/json' (got "
                                       f"{headers.get('content-type', 'none')!r})", code="unsupported_media_type")
        return None


def _has_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in headers


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
