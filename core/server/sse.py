"""Server-sent events as OpenAI and SGLang stream them: `data: {json}` blocks, and a response that closes its run
however the stream ends."""
from __future__ import annotations

import json

from fastapi.responses import StreamingResponse


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


class ClosingStream(StreamingResponse):
    """A stream that closes its run however it ends, even when the client leaves before the first chunk (an async
    generator that never started runs no `finally`)."""

    def __init__(self, run, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._run.close()
