"""OpenAI's Responses API (/v1/responses) through the official openai client, on the real default model."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from core.server.auth import Caller
from core.server.response_store import ResponseStore, Turns
from tests.server.conftest import serving, wait_until

Q1, Q2 = "What is the capital of France?", "And of Spain?"


@pytest.fixture(scope="module")
def real(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=4096, max_running_requests=8),
                 settings=ServerSettings(model="default")) as s:
        yield s


def chat(client, messages, max_tokens=24):
    return client.chat.completions.create(model="default", temperature=0, max_tokens=max_tokens, messages=messages)


def test_a_response_answers_as_the_chat_route_does_with_openai_s_usage(real):
    c = real.client()
    r = c.responses.create(model="default", input=Q1, max_output_tokens=24, temperature=0)
    same = chat(c, [{"role": "user", "content": Q1}])
    assert r.output_text == same.choices[0].message.content == "The capital of France is Paris."
    assert r.status == "completed" and r.incomplete_details is None and r.object == "response"
    assert [(o.type, o.role, o.status, [p.type for p in o.content]) for o in r.output] == \
        [("message", "assistant", "completed", ["output_text"])]
    assert (r.usage.input_tokens, r.usage.output_tokens) == (same.usage.prompt_tokens, same.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # instructions are a system message before the input; input parts are text
    r = c.responses.create(model="default", instructions="Answer in one word.", max_output_tokens=24, temperature=0,
                           input=[{"role": "user", "content": [{"type": "input_text", "text": Q1}]}])
    same = chat(c, [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": Q1}])
    assert r.output_text == same.choices[0].message.content and r.instructions == "Answer in one word."


def test_previous_response_id_continues_the_chat_and_finds_it_in_the_cache(real):
    """The second turn's prompt is the first turn's chat with its answer, then the new input: the same tokens as
    the chat route's three messages, and the cache holds all of the first turn but its last token (EOS)."""
    c = real.client()
    first = c.responses.create(model="default", input=Q1, max_output_tokens=24, temperature=0)
    second = c.responses.create(model="default", input=Q2, previous_response_id=first.id, max_output_tokens=24,
                                temperature=0)
    same = chat(c, [{"role": "user", "content": Q1}, {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": Q2}])
    assert second.output_text == same.choices[0].message.content == "The capital of Spain is Madrid."
    assert second.usage.input_tokens == same.usage.prompt_tokens
    assert second.usage.input_tokens_details.cached_tokens == first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.previous_response_id == first.id
    # a previous response's instructions are not carried over (OpenAI's rule): the third turn has none
    told = c.responses.create(model="default", input=Q1, instructions="Answer in one word.", max_output_tokens=24,
                              temperature=0)
    third = c.responses.create(model="default", input=Q2, previous_response_id=told.id, max_output_tokens=24,
                               temperature=0)
    bare = chat(c, [{"role": "user", "content": Q1}, {"role": "assistant", "content": told.output_text},
                    {"role": "user", "content": Q2}])
    assert third.usage.input_tokens == bare.usage.prompt_tokens and third.instructions is None


def test_a_stream_is_openai_s_typed_events_in_order_and_ends_with_the_stored_response(real):
    c = real.client()
    events = list(c.responses.create(model="default", input=Q1, max_output_tokens=24, temperature=0, stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"] and deltas >= 2
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == events[-4].text == "The capital of France is Paris."
    assert events[0].response.status == "in_progress" and final.status == "completed"
    assert c.responses.retrieve(final.id).model_dump() == final.model_dump()
    with c.responses.stream(model="default", input=Q1, max_output_tokens=24, temperature=0) as stream:
        helped = stream.get_final_response()           # the client's accumulator takes our events
    assert helped.output_text == text and helped.usage.input_tokens_details.cached_tokens > 0


def test_an_answer_cut_at_max_output_tokens_is_incomplete_whole_and_streamed(real):
    c = real.client()
    r = c.responses.create(model="default", input=Q1, max_output_tokens=3, temperature=0)
    assert (r.status, r.incomplete_details.reason, r.usage.output_tokens) == ("incomplete", "max_output_tokens", 3)
    assert r.output[0].status == "incomplete"
    events = list(c.responses.create(model="default", input=Q1, max_output_tokens=3, temperature=0, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == r.output_text


def test_stored_responses_are_read_and_deleted_and_store_false_keeps_none(real):
    c = real.client()
    r = c.responses.create(model="default", input=Q1, max_output_tokens=4, temperature=0)
    assert c.responses.retrieve(r.id).output_text == r.output_text
    c.responses.delete(r.id)
    for call in (lambda: c.responses.retrieve(r.id),
                 lambda: c.responses.create(model="default", input=Q2, previous_response_id=r.id, max_output_tokens=4)):
        with pytest.raises(openai.NotFoundError, match="no stored response .* was deleted"):
            call()
    kept = c.responses.create(model="default", input=Q1, max_output_tokens=4, temperature=0, store=False)
    assert kept.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(kept.id)


@pytest.mark.parametrize("extra, param, message", [
    ({"tools": [{"type": "web_search"}]}, "tools", "tools (function calling, web search, ...) are not supported"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "this server runs no reasoning model"),
    ({"background": True}, "background", "background responses are not supported"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format",
     "text.format 'json_schema' is not supported"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "input[0]",
     "input[0] is a 'function_call_output' item"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content",
     "input[0].content[0] is a 'input_image' part"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "input[0].role must be one of"),
    ({"input": ""}, "input", "input is empty"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be an integer >= 1"),
    ({"max_output_tokens": 5000}, "max_output_tokens", "lower max_output_tokens to at most"),
    ({"temperature": "hot"}, "temperature", "temperature"),
    ({"frequency_penalty": 1}, "frequency_penalty", "unknown parameter 'frequency_penalty'"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "metadata holds 17 pairs; at most 16"),
    ({"metadata": {"k": "v" * 513}}, "metadata", "values at most 512"),
    ({"user": "u" * 513}, "user", "user is at most 512 characters"),
    ({"reasoning": {"effort": "low", "summary": None}}, "reasoning", "this server runs no reasoning model"),
    ({"input": [{"role": "tool", "content": "1"}]}, "input[0].role", "must be one of user, assistant, system, "
                                                                      "developer"),
    ({"previous_response_id": "resp-nope"}, "previous_response_id", "no stored response 'resp-nope'"),
])
def test_what_this_server_cannot_honour_is_a_400_or_404_naming_the_field(real, extra, param, message):
    r = httpx.post(f"{real.url}/v1/responses", timeout=30, json={"model": "default", "input": Q1, **extra})
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err
    assert not real.host.inflight


def test_a_client_that_leaves_mid_stream_aborts_its_response(real):
    with httpx.stream("POST", f"{real.url}/v1/responses", timeout=30,
                      json={"input": "Write the numbers from 1 to 100, separated by commas.", "max_output_tokens": 300,
                            "stream": True, "temperature": 0}) as r:   # greedy: it counts on, it cannot end first
        lines = r.iter_lines()
        assert sum(1 for _, ln in zip(range(24), lines) if ln.startswith("event: response.output_text.delta")) >= 3
    wait_until(lambda: not real.host.inflight, what="the abort")
    snap = real.engine.snapshot()
    assert snap.requests[-1].state == "aborted" and snap.requests[-1].output_tokens < 300
    assert snap.metrics["in_use_slots"] == 0
    real.engine.check_invariants()


def test_a_response_is_its_owner_s_and_keyless_callers_on_a_keyed_server_read_none(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=1024),
                 settings=ServerSettings(model="default", api_key="user-key", admin_key="admin-key")) as s:
        admin = openai.OpenAI(base_url=f"{s.url}/v1", api_key="admin-key", max_retries=0)
        user = openai.OpenAI(base_url=f"{s.url}/v1", api_key="user-key", max_retries=0)
        theirs = admin.responses.create(model="default", input=Q1, max_output_tokens=4, temperature=0)
        mine = user.responses.create(model="default", input=Q1, max_output_tokens=4, temperature=0)
        with pytest.raises(openai.NotFoundError, match="no stored response"):
            user.responses.retrieve(theirs.id)                    # not told apart from an id that never was
        with pytest.raises(openai.NotFoundError):
            user.responses.create(model="default", input=Q2, previous_response_id=theirs.id, max_output_tokens=4)
        with pytest.raises(openai.NotFoundError):
            user.responses.delete(theirs.id)
        assert admin.responses.retrieve(mine.id).id == mine.id     # the admin reads everyone's
    with serving(Engine(smollm2_runner, pool_slots=1024),
                 settings=ServerSettings(model="default", admin_key="admin-key")) as s:
        # keyless callers may ask (no --api-key), but could never read a response back: none is kept for them
        r = httpx.post(f"{s.url}/v1/responses", json={"input": Q1, "max_output_tokens": 2}, timeout=30).json()
        assert r["store"] is False
        got = httpx.get(f"{s.url}/v1/responses/{r['id']}", timeout=30)
        assert got.status_code == 404 and "keyless callers would read each other's" in got.json()["error"]["message"]
        admin = httpx.get(f"{s.url}/v1/responses/{r['id']}", headers={"Authorization": "Bearer admin-key"}).json()
        assert "no stored response" in admin["error"]["message"]


def test_each_owner_keeps_its_own_newest_responses():
    store = ResponseStore(open_server=False, max_stored=2)
    alice, admin = (Caller(admin=a, identity=i, authenticated=True) for a, i in ((False, "key:a"), (True, "admin")))
    store.put(admin, "resp-admin", Turns(), {"id": "resp-admin"})
    for k in range(5):
        store.put(alice, f"resp-{k}", Turns(), {"id": f"resp-{k}"})
    assert store.get(admin, "resp-admin").body["id"] == "resp-admin"     # alice's traffic pushed out none of it
    assert [store.get(alice, f"resp-{k}").body["id"] for k in (3, 4)] == ["resp-3", "resp-4"]
    with pytest.raises(Exception, match="no stored response 'resp-2'"):
        store.get(alice, "resp-2")
    store.delete(alice, "resp-4")
    store.put(alice, "resp-5", Turns(), {})
    assert store.get(alice, "resp-3") and store.get(alice, "resp-5")     # the deleted one freed its place


def test_the_store_keeps_the_newest_and_forgets_the_oldest():
    store = ResponseStore(open_server=True, max_stored=2)
    anon = Caller(admin=False, identity="anonymous", authenticated=False)
    for k in range(3):
        store.put(anon, f"resp-{k}", Turns().then([{"role": "user", "content": str(k)}], [f"msg-{k}"]),
                  {"id": f"resp-{k}"})
    assert [store.get(anon, f"resp-{k}").body["id"] for k in (1, 2)] == ["resp-1", "resp-2"]
    with pytest.raises(Exception, match="older than the newest 2 kept per key"):
        store.get(anon, "resp-0")
    assert store.history(anon, "resp-2") == Turns(({"role": "user", "content": "2"},), ("msg-2",))
    assert store.history(anon, None) == Turns()
    with pytest.raises(ValueError, match="1 messages with 2 item ids"):
        Turns().then([{"role": "user", "content": "x"}], ["msg-a", "msg-b"])


def test_the_openapi_document_lists_the_responses_routes(real):
    doc = httpx.get(f"{real.url}/openapi.json", timeout=30).json()
    assert {"post"} <= set(doc["paths"]["/v1/responses"]) and {"get", "delete"} <= set(
        doc["paths"]["/v1/responses/{response_id}"])
    assert "ResponsesRequest" in json.dumps(doc["components"]["schemas"])


def test_a_response_echoes_what_was_asked_and_takes_its_own_echo_and_output_back(real):
    c = real.client()
    r = c.responses.create(model="default", input=Q1, max_output_tokens=4, temperature=0, tool_choice="none",
                           parallel_tool_calls=False, text={"verbosity": "low"}, prompt_cache_key="k1",
                           safety_identifier="u1", metadata={"run": "7"}, reasoning={"effort": None, "summary": None})
    assert (r.tool_choice, r.parallel_tool_calls, r.text.verbosity, r.prompt_cache_key, r.safety_identifier,
            r.metadata) == ("none", False, "low", "k1", "u1", {"run": "7"})
    assert r.completed_at >= r.created_at and r.reasoning.effort is None
    # a previous answer passed back as an input item (its output_text parts), and a tool-only assistant turn
    again = c.responses.create(model="default", temperature=0, max_output_tokens=24, reasoning=r.reasoning.model_dump(),
                               input=[{"role": "user", "content": Q1}, r.output[0].model_dump(),
                                      {"type": None, "role": "assistant", "content": None},
                                      {"role": "user", "content": Q2}])
    same = chat(c, [{"role": "user", "content": Q1}, {"role": "assistant", "content": r.output_text},
                    {"role": "assistant", "content": ""}, {"role": "user", "content": Q2}])
    assert again.output_text == same.choices[0].message.content


def test_a_conversation_that_outgrows_the_context_says_the_earlier_turns_are_in_the_prompt(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=300), settings=ServerSettings(model="default")) as s:
        c = s.client()
        first = c.responses.create(model="default", input="word " * 200, max_output_tokens=2, temperature=0)
        with pytest.raises(openai.BadRequestError, match=r"does not fit a pool of 300 slots; shorten the input; the "
                                                         r"prompt holds the conversation of previous_response_id as "
                                                         r"well as the new input"):
            c.responses.create(model="default", input="word " * 60, previous_response_id=first.id)
