"""GET /v1/responses/{id}/input_items through the official openai client: a stored response's conversation as
OpenAI's items, paged as OpenAI pages them."""
from __future__ import annotations

import httpx
import openai
import pytest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from core.server.errors import APIError
from core.server.response_items import input_item, page
from tests.server.conftest import serving

Q1, Q2, Q3 = "What is the capital of France?", "And of Spain?", "And of Italy?"


@pytest.fixture(scope="module")
def real(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=2048, max_running_requests=4),
                 settings=ServerSettings(model="default", api_key="user-key", admin_key="admin-key")) as s:
        yield s


def client(s, key="user-key"):
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0)


def ask(c, text, previous=None, **kw):
    return c.responses.create(model="default", input=text, previous_response_id=previous, max_output_tokens=12,
                              temperature=0, **kw)


def texts(items):
    return [(i.role, i.content[0].text) for i in items]


def test_a_chain_s_input_items_are_its_conversation_newest_first_with_each_answer_under_its_own_id(real):
    c = client(real)
    first = ask(c, Q1, instructions="Be brief.")
    second = ask(c, Q2, first.id)
    third = ask(c, [{"role": "developer", "content": "Answer in English."}, {"role": "user", "content": Q3}],
                second.id)
    assert texts(c.responses.input_items.list(first.id)) == [("user", Q1)]     # instructions are no input item
    items = list(c.responses.input_items.list(third.id))
    assert texts(items) == [("user", Q3), ("developer", "Answer in English."), ("assistant", second.output_text),
                            ("user", Q2), ("assistant", first.output_text), ("user", Q1)]
    assert [i.id for i in items if i.role == "assistant"] == [second.output[0].id, first.output[0].id]
    assert [(i.type, i.status) for i in items] == [("message", "completed")] * 6
    assert [p.type for i in items for p in i.content] == ["input_text", "input_text", "output_text", "input_text",
                                                          "output_text", "input_text"]
    # the earlier turns' items keep their ids from one response to the next
    earlier = list(c.responses.input_items.list(second.id, order="asc"))
    assert [i.id for i in earlier] == [i.id for i in items[::-1][:3]]
    assert len({i.id for i in items}) == 6


def test_items_are_paged_with_limit_and_after_as_the_client_pages_them(real):
    c = client(real)
    r = ask(c, [{"role": "user", "content": f"Say {k}."} for k in range(25)])
    whole = list(c.responses.input_items.list(r.id))                # the client follows has_more / after itself
    assert texts(whole) == [("user", f"Say {k}.") for k in reversed(range(25))]
    first = c.responses.input_items.list(r.id, limit=10, order="asc")
    assert texts(first.data) == [("user", f"Say {k}.") for k in range(10)] and first.has_more
    assert first.first_id == first.data[0].id and first.last_id == first.data[-1].id
    rest = c.responses.input_items.list(r.id, limit=100, order="asc", after=first.last_id)
    assert texts(rest.data) == [("user", f"Say {k}.") for k in range(10, 25)] and not rest.has_more
    assert [i.id for i in first.data + rest.data] == [i.id for i in whole[::-1]]


@pytest.mark.parametrize("query, param, message", [
    ({"limit": 0}, "limit", "limit"),
    ({"limit": 101}, "limit", "limit"),
    ({"limit": "many"}, "limit", "limit"),
    ({"order": "newest"}, "order", "order"),
    ({"after": "msg-nope"}, "after", "after 'msg-nope' is not an input item of this response"),
    ({"include[]": "message.output_text.logprobs"}, "include", "include is not supported"),
    ({"include": "message.input_image.image_url"}, "include", "include is not supported"),
    ({"before": "x"}, "before", "unknown query parameter 'before'"),
])
def test_a_bad_query_is_a_400_naming_the_parameter(real, query, param, message):
    r = ask(client(real), Q1)
    got = httpx.get(f"{real.url}/v1/responses/{r.id}/input_items", params=query, timeout=30,
                    headers={"Authorization": "Bearer user-key"})
    assert got.status_code == 400, got.text
    err = got.json()["error"]
    assert err["param"] == param and message in err["message"], err


def test_input_items_are_the_owner_s_and_the_admin_s_only(real):
    mine, theirs = ask(client(real), Q1), ask(client(real, "admin-key"), Q1)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client(real).responses.input_items.list(theirs.id)          # not told apart from an id that never was
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client(real, "admin-key").responses.input_items.list("resp-nope")
    assert texts(client(real, "admin-key").responses.input_items.list(mine.id)) == [("user", Q1)]
    assert httpx.get(f"{real.url}/v1/responses/{mine.id}/input_items", timeout=30).status_code == 401   # no key
    client(real).responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError, match="was deleted"):
        client(real).responses.input_items.list(mine.id)


def test_a_page_starts_after_its_cursor_and_says_whether_more_follow():
    items = [input_item({"role": "user", "content": str(k)}, f"msg-{k}") for k in range(5)]
    assert page(items, 2, "desc", None) == {"object": "list", "data": items[4:2:-1], "first_id": "msg-4",
                                            "last_id": "msg-3", "has_more": True}
    assert page(items, 2, "desc", "msg-1")["data"] == [items[0]]
    last = page(items, 3, "asc", "msg-1")
    assert [i["id"] for i in last["data"]] == ["msg-2", "msg-3", "msg-4"] and not last["has_more"]
    assert page(items, 5, "asc", "msg-4") == {"object": "list", "data": [], "first_id": None, "last_id": None,
                                              "has_more": False}
    with pytest.raises(APIError, match="'msg-9' is not an input item"):
        page(items, 2, "asc", "msg-9")
    assert input_item({"role": "assistant", "content": "Hi."}, "msg-a")["content"] == \
        [{"type": "output_text", "text": "Hi.", "annotations": [], "logprobs": []}]


def test_the_openapi_document_lists_the_route_and_its_query(real):
    doc = httpx.get(f"{real.url}/openapi.json", timeout=30).json()
    route = doc["paths"]["/v1/responses/{response_id}/input_items"]["get"]
    assert route["operationId"] == "list_input_items"
    assert {p["name"] for p in route["parameters"]} == {"response_id", "limit", "order", "after"}

