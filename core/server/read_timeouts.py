"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers (slowloris).

uvicorn times out an idle keep-alive connection, but a client that sends half a request line, or
headers one byte a minute, holds a connection forever. Here every request's headers must be
complete within `header_timeout` seconds of its first byte (of the connection, for the first);
past that the client gets a 408 and the connection closes. The body has its own timeout where it
is read (json_body.py).
"""
from __future__ import annotations

import json
from typing import Optional

from uvicorn.protocols.http.h11_impl import H11Protocol

from core.server.errors import error_body


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps(error_body(408, f"the request's headers did not arrive within {seconds:g} s",
                                 code="request_timeout")).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class HeaderTimeoutProtocol(H11Protocol):
    header_timeout: float = 10.0
    header_timer = None

    def connection_made(self, transport) -> None:   # type: ignore[override]
        super().connection_made(transport)
        self.arm_header_timer()

    def arm_header_timer(self) -> None:
        self.cancel_header_timer()
        self.header_timer = self.loop.call_later(self.header_timeout, self.headers_timed_out)

    def cancel_header_timer(self) -> None:
        timer: Optional[object] = self.header_timer
        if timer is not None:
            timer.cancel()
            self.header_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cancel_header_timer()          # the headers are in: the request is being served
        elif self.header_timer is None and not self.transport.is_closing():
            self.arm_header_timer()             # the first bytes of the next request on this connection

    def connection_lost(self, exc) -> None:
        self.cancel_header_timer()
        super().connection_lost(exc)

    def headers_timed_out(self) -> None:
        self.header_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return
        self.transport.write(_timeout_response(self.header_timeout))
        self.transport.close()


def protocol_with(header_timeout: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn.Config(http=...) with this header deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": float(header_timeout)})
