"""Which browser pages may drive this dashboard: its own origin only.

Streamlit's WebSocket check takes any page served from `localhost` or `127.0.0.1` on any port (and from the
machine's own addresses): another local dev server, or a page with an XSS on one, could open the session,
read every prompt the dashboard shows and press its admin buttons (reset, abort all, rebuild). The guard
compares the session's Origin with the Host it was opened on (or the Host a proxy says it forwarded: a
page's script cannot set X-Forwarded-Host on a WebSocket); a session without Origin is no browser's."""
from __future__ import annotations

from typing import Iterable, Mapping, Optional
from urllib.parse import urlsplit


DEFAULT_PORTS = {"http": "80", "https": "443"}


def _host_port(netloc: str, scheme: str) -> str:
    """host:port with the scheme's default port spelled out (a proxy's `Host $host` drops it, Origin may not)."""
    netloc = netloc.strip().lower()
    if netloc and not netloc.endswith("]") and ":" in netloc.rsplit("]", 1)[-1]:
        return netloc
    return f"{netloc}:{DEFAULT_PORTS.get(scheme, '')}"


def foreign_origin(headers: Mapping[str, str], allowed: Iterable[str] = ()) -> Optional[str]:
    """Why the page that opened this session may not use it (another origin), or None. `allowed`: origins the
    operator lets in besides the dashboard's own (Streamlit's server.corsAllowedOrigins, for a proxy that
    rewrites Host)."""
    origin = headers.get("Origin")
    if origin is None:
        return None
    if origin != "null" and origin.rstrip("/").lower() in {a.rstrip("/").lower() for a in allowed}:
        return None
    parts = urlsplit(origin)
    own = _host_port(parts.netloc, parts.scheme) if origin != "null" and parts.netloc else ""
    # one Host (a list there is no browser's); proxies may chain X-Forwarded-Host
    hosts = {_host_port(h, parts.scheme) for h in [headers.get("Host") or ""] +
             (headers.get("X-Forwarded-Host") or "").split(",") if h.strip() and "," not in h}
    if own and own in hosts:
        return None
    return (f"This dashboard answers only pages of its own origin; this session was opened by {origin[:100]!r}. "
            f"Open the dashboard at its own address (behind a proxy that rewrites Host, list the page's origin in "
            f"--server.corsAllowedOrigins).")
