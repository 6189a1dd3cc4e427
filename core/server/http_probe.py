"""Polling a local server that is still starting, with a probe that never reads its own echo as an answer.

While nothing listens on a port in the ephemeral range (32768-60999 on Linux), a connect() to that port can be
given the same port as its source: the socket connects to itself (TCP simultaneous open) and reads back its own
request, which http.client reports as `BadStatusLine: GET /health HTTP/1.1`. Closed the usual way, that socket then
sits in TIME_WAIT on the server's port for a minute, and the server's bind fails with "address already in use",
SO_REUSEADDR or not (measured). A poll that retries every few hundred milliseconds during a model load hits this now
and then. `get` and `listening` abort such a connection at once (a reset leaves no TIME_WAIT) and reports it, like a refused one,
as "not answering yet".
"""
from __future__ import annotations

import argparse
import http.client
import socket
import struct
import urllib.parse
from typing import NamedTuple, Optional


class Reply(NamedTuple):
    status: int
    body: bytes


def _abort_if_self_connected(sock: socket.socket) -> bool:
    """True (and the socket set to reset on close) when it is connected to itself."""
    if sock.getsockname()[:2] != sock.getpeername()[:2]:
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = reset, no TIME_WAIT
    return True


def listening(port: int, host: str = "127.0.0.1", source_address: Optional[tuple[str, int]] = None) -> bool:
    """Whether a server accepts connections on host:port (a socket connected to itself does not count)."""
    try:
        with socket.create_connection((host, port), timeout=2, source_address=source_address) as sock:
            return not _abort_if_self_connected(sock)
    except OSError:
        return False


def get(url: str, timeout: float = 2.0, source_address: Optional[tuple[str, int]] = None,
        headers: Optional[dict] = None) -> Optional[Reply]:
    """GET an http:// `url` directly (no proxy): its status and body, or None while nothing answers there yet
    (refused, reset, timed out, connected to itself, or a reply that is not HTTP). `source_address` binds the
    probe's own end."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"http_probe polls a local server over plain http, not {url!r}")
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout,
                                      source_address=source_address)
    try:
        conn.connect()
        if _abort_if_self_connected(conn.sock):          # nothing listens there
            return None
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        reply = conn.getresponse()
        return Reply(reply.status, reply.read())
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def answers(url: str, timeout: float = 2.0) -> bool:
    """True once GET `url` gives 200."""
    reply = get(url, timeout)
    return reply is not None and reply.status == 200


def tcp_port(text: str) -> int:
    """A port number, 1-65535, as an argparse type (argparse turns the error into one line and exit 2)."""
    if not str(text).strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port
