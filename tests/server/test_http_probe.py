"""core.server.http_probe: the launchers' poll of a server that is still starting. A probe whose socket connected
to itself (no listener yet, its source port equal to the server's port) read its own request back, and the
launcher died with `BadStatusLine: GET /health HTTP/1.1` (seen once in CI); now that reads as "not answering yet"."""
from __future__ import annotations

import http.client
import http.server
import socket
import threading

import pytest

from core.server import http_probe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ROUTES = {"/health": (200, b"ok"), "/workers?all=1": (200, b'{"workers": []}'),
          "/list/workers": (200, b"[1, 2]"), "/text/workers": (200, b"not json"),
          "/one/workers": (200, b'{"workers": [{"is_healthy": true}, {"is_healthy": false}]}')}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = ROUTES.get(self.path, (503, b"later"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    t.join(5)


def test_the_stdlib_client_connected_to_itself_reads_its_own_request_back():
    """The failure itself, made on purpose: bound to the port it connects to, with nothing listening there."""
    port = free_port()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2, source_address=("127.0.0.1", port))
    try:
        conn.request("GET", "/health")
        with pytest.raises(http.client.BadStatusLine, match="GET /health HTTP/1.1"):
            conn.getresponse()
    finally:
        conn.close()


def test_a_probe_connected_to_itself_is_not_answering_and_leaves_the_port_free_for_the_server():
    port = free_port()
    assert http_probe.get(f"http://127.0.0.1:{port}/health", source_address=("127.0.0.1", port)) is None
    with socket.socket() as s:           # the server starting next binds it as uvicorn does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_listening_sees_a_server_but_not_a_socket_connected_to_itself(server):
    assert http_probe.listening(int(server.rsplit(":", 1)[1]))
    port = free_port()
    assert not http_probe.listening(port)
    assert not http_probe.listening(port, source_address=("127.0.0.1", port))
    with socket.socket() as s:           # no TIME_WAIT left behind on the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_port_with_nothing_listening_is_not_answering():
    assert http_probe.get(f"http://127.0.0.1:{free_port()}/health") is None
    assert not http_probe.answers(f"http://127.0.0.1:{free_port()}/health")


def test_only_plain_http_urls_are_polled():
    with pytest.raises(ValueError, match="plain http"):
        http_probe.get("https://127.0.0.1:1/health")


def test_a_reply_that_is_not_http_is_not_answering():
    with socket.socket() as lsn:
        lsn.bind(("127.0.0.1", 0))
        lsn.listen()

        def reply_garbage() -> None:
            conn, _ = lsn.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"hello\r\n\r\n")

        t = threading.Thread(target=reply_garbage, daemon=True)
        t.start()
        assert http_probe.get(f"http://127.0.0.1:{lsn.getsockname()[1]}/health") is None
        t.join(5)


def test_a_server_gives_its_status_and_body_and_only_200_answers(server):
    assert http_probe.get(server + "/health") == http_probe.Reply(200, b"ok")
    assert http_probe.get(server + "/workers?all=1") == http_probe.Reply(200, b'{"workers": []}')
    assert http_probe.get(server + "/starting") == http_probe.Reply(503, b"later")
    assert http_probe.answers(server + "/health")
    assert not http_probe.answers(server + "/starting")


def test_the_replicas_launcher_counts_healthy_workers_and_reads_anything_else_as_not_ready(server):
    """registered() on a port with nothing behind it, or on a reply that is not the router's JSON: False, no raise."""
    from core import replicas
    assert replicas.registered(f"http://127.0.0.1:{free_port()}", 1) is False
    assert replicas.registered(server + "/list", 1) is False
    assert replicas.registered(server + "/text", 1) is False
    assert replicas.registered(server + "/starting", 1) is False
    assert replicas.registered(server + "/one", 1) is True
    assert replicas.registered(server + "/one", 2) is False
