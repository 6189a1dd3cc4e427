"""Which browser pages may drive this dashboard: its own origin only.

Streamlit's WebSocket check takes any page served from `localhost` or `127.0.0.1` on any port (and from the
machine's own addresses): another local dev server, or a page with an XSS on one, could open the session,
read every prompt the dashboard shows and press its admin buttons (reset, abort all, rebuild). The guard
compares the session's Origin with the Host it was opened on (or the Host a proxy says it forwarded: a
page's script cannot set X-Forwarded-Host on a WebSocket); a session without Origin is no browser's."""
from __future__ import annotations

from typing import Mapping, Optional
from urllib.parse import urlsplit


def foreign_origin(headers: Mapping[str, str]) -> Optional[str]:
    """Why the page that opened this session may not use it (another origin), or None."""
    origin = headers.get("Origin")
    if origin is None:
        return None
    netloc = urlsplit(origin).netloc.lower() if origin != "null" else ""
    hosts = {h.strip().lower() for name in ("Host", "X-Forwarded-Host") for h in (headers.get(name) or "").split(",")}
    if netloc and netloc in hosts:
        return None
    return (f"This dashboard answers only pages of its own origin; this session was opened by {origin[:100]!r}. "
            f"Open the dashboard at its own address.")
