"""The dashboard's session WebSocket answers only the loopback names (.streamlit/config.toml
server.allowedHosts): a page on another name that DNS-rebinds to 127.0.0.1 would otherwise drive the
engine through the dashboard, which calls the server from its own side with its own key."""
from __future__ import annotations

import os
import socket

from tests.e2e.processes import ARTIFACTS, streamlit_app


def _upgrade_status(url: str, host: str) -> str:
    """The status line Streamlit answers a session WebSocket upgrade sent with this Host and Origin."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: streamlit\r\n"
                  f"Origin: http://{host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    return head.split(b"\r\n", 1)[0].decode()


def test_a_rebinding_host_gets_no_session_and_the_loopback_names_do():
    with streamlit_app("tests/e2e/bare_app.py", ARTIFACTS / "hosts_streamlit.log", dict(os.environ)) as (url, _):
        for host in ("evil.example", "127.0.0.1.nip.io", "localhost.attacker.test"):
            assert " 403 " in _upgrade_status(url, host), host
        for host in ("127.0.0.1", "localhost", "[::1]"):
            assert " 101 " in _upgrade_status(url, host), host
