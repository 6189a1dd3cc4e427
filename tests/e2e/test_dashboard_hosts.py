"""The dashboard's session WebSocket answers only the loopback names (.streamlit/config.toml
server.allowedHosts): a page on another name that DNS-rebinds to 127.0.0.1 would otherwise drive the
engine through the dashboard, which calls the server from its own side with its own key."""
from __future__ import annotations

import os
import socket
import time

from tests.e2e.processes import ARTIFACTS, free_port, streamlit_app


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


def _session_text(url: str, origin: str, seconds: float = 60, clear_cache: bool = False) -> str:
    """Everything the dashboard sends a session opened by a page of `origin` for its first run (after Streamlit's
    clear_cache message, with `clear_cache`)."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    texts = []
    with connect(url.replace("http://", "ws://") + "/_stcore/stream", origin=origin, subprotocols=["streamlit"],
                 open_timeout=10, max_size=None) as ws:
        if clear_cache:
            clear = BackMsg()
            clear.clear_cache = True
            ws.send(clear.SerializeToString())
            time.sleep(1)
        run = BackMsg()
        run.rerun_script.query_string = ""
        ws.send(run.SerializeToString())
        end = time.time() + seconds
        while time.time() < end:
            msg = ForwardMsg()
            msg.ParseFromString(ws.recv(timeout=max(0.1, end - time.time())))
            texts.append(str(msg))
            if msg.HasField("script_finished"):
                break
    return "\n".join(texts)


def test_a_page_of_another_local_origin_gets_no_view_of_the_dashboard():
    """Streamlit's own check lets any localhost / 127.0.0.1 port through: another local dev server's page
    (or one with an XSS) read every prompt and pressed the admin buttons. app.py answers only its own origin."""
    env = dict(os.environ, RADIX_ENGINE_URL=f"http://127.0.0.1:{free_port()}")     # no server: the page says so
    with streamlit_app("app.py", ARTIFACTS / "origin_streamlit.log", env) as (url, _):
        port = url.rsplit(":", 1)[1]
        for origin in (f"http://localhost:{int(port) + 1}", f"http://127.0.0.1:{int(port) + 1}"):
            foreign = _session_text(url, origin)
            assert "answers only pages of its own origin" in foreign and "no engine server answers" not in foreign
        own = _session_text(url, url)
        assert "no engine server answers" in own and "answers only pages of its own origin" not in own


def test_a_foreign_pages_clear_cache_leaves_the_dashboards_engine_running():
    """Streamlit handles clear_cache without running the page (so before the origin check): it emptied
    st.cache_resource, and the engine held there kept its thread and memory while the next visitor loaded
    another (2.7 -> 4.0 GB in three clears). The engine and its clients are held outside that cache now."""
    env = dict(os.environ, RADIX_POOL_SLOTS="160", RADIX_TORCH_THREADS="1")
    env.pop("RADIX_ENGINE_URL", None)
    log = ARTIFACTS / "clear_cache_streamlit.log"
    with streamlit_app("app.py", log, env) as (url, proc):
        assert "kpi-line" in _session_text(url, url, 240)                 # the engine loaded, the page drawn
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        foreign = f"http://localhost:{int(url.rsplit(':', 1)[1]) + 1}"
        for _ in range(2):
            _session_text(url, foreign, 30, clear_cache=True)
            assert "kpi-line" in _session_text(url, url, 120)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) <= threads + 2   # no engine thread left behind
        assert log.read_text().count("Loading weights: 100%") <= 1      # nor a model loaded again
