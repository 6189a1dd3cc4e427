"""What the KV events page says before its first live batch: waiting (on which address), or why
nothing can arrive. Pure functions of the subscriber's state, so every message is tested as text.

SGLang's publisher binds a wildcard host (tcp://*:5557) and connects to a named one
(tcp://HOST:5557); this page connects unless told to bind. When both connect no one listens,
and without this check the page would show an empty tree as if the engine had cached nothing.
"""
from __future__ import annotations

import socket
import time
from typing import Optional
from urllib.parse import urlsplit

BIND_HELP = ("SGLang's rule: an engine endpoint with a wildcard host (tcp://*:5557) binds, one naming a host "
             "(tcp://HOST:5557) connects. When the engine connects, this page must bind: tick this and type "
             "the address the engine connects to (this machine's, or tcp://*:PORT).")


RESOLVE_TTL_S = 30.0     # how long an answer about a name is kept (the page asks every second while refused)
_resolved: dict[str, tuple[float, Optional[str]]] = {}


def unresolved_host(endpoint: str) -> Optional[str]:
    """The host of a tcp:// endpoint when no address can be found for it (ZeroMQ reports a name that does not
    resolve as it reports a refused connection: both are retried), else None. Asked again after RESOLVE_TTL_S,
    so a name that comes to resolve (DNS catching up) stops being called unknown."""
    try:
        host = urlsplit(endpoint).hostname
    except ValueError:
        return None
    if not endpoint.startswith("tcp://") or not host or host == "*":
        return None
    at, answer = _resolved.get(host, (-1e9, None))
    if time.monotonic() - at < RESOLVE_TTL_S:
        return answer
    try:
        socket.getaddrinfo(host, None)
        answer = None
    except (socket.gaierror, UnicodeError):
        answer = host
    _resolved[host] = (time.monotonic(), answer)
    return answer


def waiting_message(endpoint: str, bind: bool, link: str, received: int, waited_s: float,
                    caught_up_to: Optional[int] = None,
                    unresolved: Optional[str] = None) -> Optional[tuple[str, str]]:
    """(level, text) to show instead of the stream's status, or None when the stream is flowing (a
    live batch came, or the replay socket's catch-up applied some on a live link). `link`: the
    subscriber's socket state ("connecting", "connected", "refused", "disconnected", "listening");
    `received`: live batches; `unresolved`: the endpoint's host when it does not resolve (unresolved_host);
    level is "info", "warning" or "error"."""
    caught = (f" The replay socket's catch-up applied batches up to seq {caught_up_to:,}, but no live batch "
              f"can follow." if caught_up_to is not None else "")
    if not bind and link == "refused" and unresolved and not received:
        return ("error", f"No address found for {unresolved!r} (the host in {endpoint}), so this page cannot connect. "
                         f"Check the name (a typo? a machine this one cannot see?) or use the engine's IP address."
                         f"{caught}")
    if not bind and link == "refused":
        if received:
            return ("warning", f"Nothing listens at {endpoint} any more (the engine stopped or moved?): the tree is "
                               f"as of the last of the {received:,} live batches received.")
        return ("error", f"Nothing listens at {endpoint}, so no batch can arrive. This page connects to it, and an "
                         f"engine whose endpoint names a host (tcp://HOST:PORT) connects too (SGLang's rule: a "
                         f"wildcard host binds, a named host connects): no one binds. Change one side: start the "
                         f"engine with tcp://*:PORT (it binds) and keep tcp://HOST:PORT here, or tick \"Bind here\" "
                         f"so this page listens at the address the engine connects to.{caught}")
    if bind and link == "listening" and not received:
        return ("warning", f"Listening at {endpoint} for {waited_s:.0f} s; no engine has connected. Start the engine "
                           f"with this address (its host named, so it connects) as its KV events endpoint.")
    if received or caught_up_to is not None:
        return None
    if link in ("connecting", "disconnected"):
        return ("info", f"Connecting to {endpoint} ({waited_s:.0f} s)...")
    how = "an engine connected to this page" if bind else "connected"
    return ("info", f"Waiting for the first batch on {endpoint}: {how}, subscribed {waited_s:.0f} s ago, nothing "
                    f"received yet (an idle engine publishes nothing until it caches something).")
