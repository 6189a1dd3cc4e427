"""A chat of more messages than the pool can hold is refused before its template is rendered: each user or
assistant message costs its role header in tokens, however empty. 240,000 empty messages had passed the character
check and held a worker thread for a minute (the template and the tokenizer), on /v1/tokenize too. Here a
small pool shows the rule with few messages, under the character check."""
from __future__ import annotations

import time

import httpx

from core.engine.engine import Engine
from core.server.prompt_size import tokens_per_message
from tests.server.conftest import serving


def test_a_chat_of_more_messages_than_the_pool_holds_is_refused_at_once(smollm2_runner):
    e = Engine(smollm2_runner, pool_slots=128)
    each = tokens_per_message(e.tokenize)
    assert each == 5                                       # "<|im_start|>user\n" ... "<|im_end|>\n"
    # 61 messages: 305 tokens at least, in 128 slots
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": ""} for i in range(61)]
    with serving(engine=e) as s:
        for route, body in (("/v1/chat/completions", {"messages": many, "max_tokens": 1}),
                            ("/v1/tokenize", {"messages": many})):
            started = time.perf_counter()
            r = httpx.post(f"{s.url}{route}", json=body, timeout=60)
            assert time.perf_counter() - started < 10
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
            assert "61 user and assistant messages" in err["message"]
        few = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
               {"role": "user", "content": "Bye"}]
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": few, "max_tokens": 2, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
