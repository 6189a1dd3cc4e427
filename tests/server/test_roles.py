"""Issue 26, item 4: two roles. With --api-key A --admin-key B, A generates and reads the engine's shape
but no prompt, cannot touch the engine (403 on every admin route), cannot abort B's requests, and
request ids are unguessable; step mode shows in /health."""
from __future__ import annotations

import re

import httpx
import openai
import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.server import host as host_module
from core.server.app import ServerSettings
from radixui.connect.http_client import HttpClient
from tests.server.conftest import serving, tiny_factory, wait_until

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]
A, B = "key-a-inference", "key-b-admin"
ADMIN_ROUTES = [("POST", "/flush_cache", None), ("POST", "/state/rebuild", {"pool_slots": 128}),
                ("POST", "/state/step_mode", {"on": True}), ("POST", "/state/step", None)]


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def two_keys(tiny_runner):
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", api_key=A, admin_key=B)) as s:
        yield s


def test_the_inference_key_gets_403_on_every_admin_route_and_changes_nothing(two_keys):
    s = two_keys
    engine, version = s.engine, s.host.version()
    for method, path, body in ADMIN_ROUTES:
        r = httpx.request(method, s.url + path, headers=bearer(A), json=body)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "admin_key_required" and "--admin-key" in r.json()["error"]["message"]
        assert httpx.request(method, s.url + path, json=body).status_code == 401, path   # no key at all
    assert s.engine is engine and engine.running and s.host.version() == version
    # the admin key may do all of it
    assert httpx.post(s.url + "/flush_cache", headers=bearer(B)).status_code == 200
    assert httpx.post(s.url + "/state/step_mode", headers=bearer(B), json={"on": True}).json()["stepping"] is True
    assert httpx.post(s.url + "/state/step_mode", headers=bearer(B), json={"on": False}).json()["stepping"] is False


def test_without_the_admin_key_a_snapshot_and_the_events_carry_no_prompt_text(two_keys):
    s = two_keys
    admin, user = HttpClient(s.url, admin_key=B), HttpClient(s.url, api_key=A, admin_key="")
    try:
        rid = user.submit(PROMPT, SamplingParams(max_new_tokens=4), extra_key="tenant-secret")
        wait_until(lambda: not s.host.inflight, what="the request to finish")
        full, hidden = admin.snapshot(), user.snapshot()
        mine = next(r for r in full.requests if r.rid == rid)
        assert mine.prompt_tokens == 8 and mine.output_tokens == 4
        seen = next(r for r in hidden.requests if r.rid == rid)
        assert (seen.prompt_tokens, seen.output_tokens, seen.prompt_text, seen.output_text) == (8, 4, "", "")
        assert any(n.token_ids == tuple(PROMPT) for n in full.cache.nodes)        # the admin sees the tree's tokens
        assert all(set(n.token_ids) <= {0} for n in hidden.cache.nodes)           # the user only its shape
        assert [len(n.token_ids) for n in hidden.cache.nodes] == [len(n.token_ids) for n in full.cache.nodes]
        assert "tenant-secret" not in httpx.get(s.url + "/state/snapshot", headers=bearer(A)).text
        assert hidden.token_text == {} and set(hidden.pool.slot_tokens.tolist()) <= {-1, 0}
        # layer 0's K norm is a function of the token alone (RoPE keeps norms): the heatmap is the admin's
        assert full.pool.k_norms is not None and float(full.pool.k_norms.max()) > 0 and hidden.pool.k_norms is None
        assert httpx.get(s.url + "/state/snapshot", headers=bearer(A)).json()["pool"]["k_norms"] is None
        events = httpx.get(s.url + "/state/events", headers=bearer(A), params={"limit": 10_000}).json()["events"]
        inserts = [e for e in events if e["kind"] == "insert"]
        assert inserts and all(set(e["token_ids"]) == {0} for e in inserts)
        assert all(e.get("extra_key") != "tenant-secret" for e in events)
        assert user.request_tokens(rid)["prompt_ids"] == PROMPT        # its own request's tokens: yes
    finally:
        admin.close()
        user.close()


def test_request_ids_are_unguessable_and_only_the_owner_or_the_admin_may_abort(two_keys):
    s = two_keys
    s.engine.stop()      # step mode: what is submitted stays in flight until we step
    admin, user = HttpClient(s.url, admin_key=B), HttpClient(s.url, api_key=A, admin_key="")
    try:
        rids = [admin.submit(PROMPT, SamplingParams(max_new_tokens=4)) for _ in range(3)]
        assert all(re.fullmatch(r"req-[0-9a-f]{24}", r) for r in rids) and len(set(rids)) == 3
        theirs = rids[0]
        r = httpx.post(f"{s.url}/state/requests/{theirs}/abort", headers=bearer(A))
        assert r.status_code == 404 and "of yours" in r.json()["error"]["message"]     # refused, existence not told
        assert user.abort(theirs) is False and user.request_tokens(theirs) is None
        assert theirs in s.host.inflight                                                  # still running
        mine = user.submit(PROMPT, SamplingParams(max_new_tokens=4))
        assert user.abort(mine) is True and admin.abort(theirs) is True               # owner; admin may abort any
        for rid in rids[1:]:
            assert admin.abort(rid) is True
        wait_until(lambda: not s.host.inflight, what="the aborts to land")
    finally:
        s.engine.start()
        admin.close()
        user.close()


def test_a_running_request_keeps_its_owner_however_many_requests_finish_after_it(two_keys, monkeypatch):
    """The owners of finished requests are forgotten past KEEP_OWNERS, oldest first; a running one's never is."""
    monkeypatch.setattr(host_module, "KEEP_OWNERS", 3)
    s = two_keys
    s.engine.stop()      # step mode: the long request stays in flight; an aborted one finishes at once
    user = HttpClient(s.url, api_key=A, admin_key="")
    try:
        running = user.submit(PROMPT, SamplingParams(max_new_tokens=4))
        finished = []
        for _ in range(5):
            finished.append(user.submit(PROMPT, SamplingParams(max_new_tokens=4)))
            assert user.abort(finished[-1]) is True
            wait_until(lambda: finished[-1] not in s.host.inflight, what="the abort to land")
        newest = user.submit(PROMPT, SamplingParams(max_new_tokens=4))
        assert list(s.host.owners) == [running, *finished[-3:], newest]
        assert user.request_tokens(running) is not None and user.abort(running) is True and user.abort(newest)
        assert user.abort(finished[0]) is False and user.request_tokens(finished[0]) is None
        wait_until(lambda: not s.host.inflight, what="the abort to land")
    finally:
        s.engine.start()
        user.close()


def test_an_openai_response_id_names_its_choices_for_the_abort_route(two_keys):
    s = two_keys
    s.engine.stop()
    try:
        with httpx.stream("POST", f"{s.url}/v1/completions", headers=bearer(A), timeout=30,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 50, "n": 2, "stream": True}) as r:
            wait_until(lambda: len(s.host.inflight) == 2, what="both choices to reach the engine")
            response_id = next(iter(s.host.inflight)).rsplit("-", 1)[0]
            assert re.fullmatch(r"cmpl-[0-9a-f]{24}", response_id)
            assert httpx.post(f"{s.url}/state/requests/{response_id}/abort", headers=bearer(B)).json()["aborted"]
            lines = [ln for ln in r.iter_lines() if ln]
        assert lines[-1] == "data: [DONE]" and '"code":"request_aborted"' in lines[-2]
    finally:
        s.engine.start()


def test_step_mode_shows_in_health_as_503(two_keys):
    s = two_keys
    assert httpx.get(s.url + "/health").json() == {"status": "ok", "engine_loop": "running", "model": "tiny"}
    httpx.post(s.url + "/state/step_mode", headers=bearer(B), json={"on": True})
    r = httpx.get(s.url + "/health")
    assert r.status_code == 503 and r.json()["status"] == "stepping" and r.headers["retry-after"]
    httpx.post(s.url + "/state/step_mode", headers=bearer(B), json={"on": False})
    assert httpx.get(s.url + "/health").status_code == 200


def test_bearer_is_read_in_any_case_and_the_keys_must_differ(two_keys):
    s = two_keys
    for header in (f"bearer {A}", f"BEARER {A}", f"Bearer   {A}"):
        assert httpx.get(s.url + "/v1/models", headers={"Authorization": header}).status_code == 200, header
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": f"Basic {A}"}).status_code == 401
    c = openai.OpenAI(base_url=f"{s.url}/v1", api_key=A, max_retries=0)
    assert c.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(ValueError, match="must differ"):
        with serving(Engine(s.engine.runner, pool_slots=64), settings=ServerSettings(api_key="k", admin_key="k")):
            pass


def test_only_an_api_key_leaves_the_admin_routes_off(tiny_runner):
    with serving(Engine(tiny_runner, pool_slots=64), settings=ServerSettings(model="tiny", api_key=A)) as s:
        r = httpx.post(s.url + "/flush_cache", headers=bearer(A))
        assert r.status_code == 403 and "started without one" in r.json()["error"]["message"]
        client = HttpClient(s.url, api_key=A, admin_key="")
        try:
            assert "admin key" in client.rebuild(client.config())      # the sidebar shows the message
            with pytest.raises(PermissionError, match="admin key"):
                client.set_step_mode(True)
        finally:
            client.close()


def test_the_dashboard_logs_in_with_its_own_key_from_the_environment(two_keys, monkeypatch):
    s = two_keys
    monkeypatch.delenv("RADIX_API_KEY", raising=False)
    monkeypatch.setenv("RADIX_ADMIN_KEY", B)
    admin = HttpClient(s.url)                                # RADIX_ADMIN_KEY: everything
    try:
        rid = admin.submit(PROMPT, SamplingParams(max_new_tokens=2))
        wait_until(lambda: not s.host.inflight, what="the request to finish")
        assert admin.request_tokens(rid)["prompt_ids"] == PROMPT
        assert any(n.token_ids == tuple(PROMPT) for n in admin.snapshot().cache.nodes)
        assert admin.reset_cache() is None and admin.rebuild(admin.config()) is None
    finally:
        admin.close()
    monkeypatch.delenv("RADIX_ADMIN_KEY")
    monkeypatch.setenv("RADIX_API_KEY", A)
    user = HttpClient(s.url)                                 # RADIX_API_KEY: reads and its own requests
    try:
        rid = user.submit(PROMPT, SamplingParams(max_new_tokens=2))
        wait_until(lambda: not s.host.inflight, what="the request to finish")
        assert user.snapshot().requests[-1].rid == rid and user.version() == s.host.version()
        assert "admin key" in user.reset_cache() and "admin key" in user.rebuild(user.config())
    finally:
        user.close()
    monkeypatch.delenv("RADIX_API_KEY")
    nobody = HttpClient(s.url)
    with pytest.raises(RuntimeError, match="missing or wrong API key"):
        nobody.version()
    nobody.close()


def test_the_live_page_attached_to_a_two_key_server_renders_with_either_key(two_keys, monkeypatch):
    import pathlib

    from streamlit.testing.v1 import AppTest

    from radixui.connect.resources import forget_clients

    app = str(pathlib.Path(__file__).resolve().parents[2] / "app.py")
    HttpClient(two_keys.url, admin_key=B).submit(PROMPT, SamplingParams(max_new_tokens=3))
    wait_until(lambda: not two_keys.host.inflight, what="a request to show")
    monkeypatch.setenv("RADIX_ENGINE_URL", two_keys.url)
    for env in ({"RADIX_API_KEY": A, "RADIX_ADMIN_KEY": B}, {"RADIX_API_KEY": A}):
        monkeypatch.delenv("RADIX_ADMIN_KEY", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        forget_clients()
        at = AppTest.from_file(app, default_timeout=120).run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("data-testid='kpi-line'" in m.value for m in at.markdown), env
    forget_clients()


def test_with_only_the_inference_key_the_dashboard_disables_its_admin_controls_with_a_note(two_keys, monkeypatch):
    """RADIX_API_KEY alone: the Live page renders, and step mode, Step, Reset cache and the engine
    settings' Apply are disabled under a note naming the admin key (toggling step mode used to raise
    PermissionError in the page); with RADIX_ADMIN_KEY they are enabled and there is no note. The
    server's /state/version says which role the caller has."""
    import pathlib

    from streamlit.testing.v1 import AppTest

    from radixui.connect.resources import forget_clients

    assert httpx.get(two_keys.url + "/state/version", headers=bearer(A)).json()["admin"] is False
    assert httpx.get(two_keys.url + "/state/version", headers=bearer(B)).json()["admin"] is True
    app = str(pathlib.Path(__file__).resolve().parents[2] / "app.py")
    monkeypatch.setenv("RADIX_ENGINE_URL", two_keys.url)
    monkeypatch.delenv("RADIX_ADMIN_KEY", raising=False)
    try:
        for env, admin in (({"RADIX_API_KEY": A}, False), ({"RADIX_API_KEY": A, "RADIX_ADMIN_KEY": B}, True)):
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            forget_clients()
            at = AppTest.from_file(app, default_timeout=120).run()
            assert not at.exception, [e.value for e in at.exception]
            step_mode = next(t for t in at.sidebar.toggle if t.label == "Step mode")
            reset = next(b for b in at.sidebar.button if b.label == "Reset cache")
            apply = next(b for b in at.button if b.label == "Apply")
            assert (step_mode.disabled, reset.disabled, apply.disabled) == (not admin,) * 3, env
            notes = [i.value for i in at.sidebar.info if "need the admin key" in i.value]
            assert len(notes) == (0 if admin else 1), env
            if not admin:
                assert "RADIX_ADMIN_KEY" in notes[0]
                assert two_keys.engine.running            # and nothing changed the engine
    finally:
        forget_clients()


def test_requests_sent_without_a_key_belong_to_no_one_but_the_admin(tiny_runner):
    """With only --admin-key the inference routes are open, and every keyless caller looks the same: so
    none of them owns a request, and one cannot read or abort another's by its id (a snapshot lists ids)."""
    with serving(Engine(tiny_runner, pool_slots=64), settings=ServerSettings(model="tiny", admin_key=B)) as s:
        s.engine.stop()
        try:
            victim = httpx.post(s.url + "/state/requests", json={"prompt": PROMPT, "params": {"max_new_tokens": 4}})
            rid = victim.json()["rid"]
            assert rid in [r.rid for r in HttpClient(s.url, admin_key="").snapshot().requests]   # the id is listed
            for r in (httpx.get(f"{s.url}/state/requests/{rid}/tokens"),
                      httpx.post(f"{s.url}/state/requests/{rid}/abort")):
                assert r.status_code == 404, r.text
                assert "without a key" in r.json()["error"]["message"] and "--api-key" in r.json()["error"]["message"]
            assert rid in s.host.inflight                                                  # still running
            assert httpx.post(f"{s.url}/state/requests/{rid}/abort", headers=bearer(B)).json()["aborted"] is True
        finally:
            s.engine.start()


def _cached(s, key: str, prompt: list, **extra) -> int:
    r = httpx.post(s.url + "/v1/completions", headers=bearer(key), timeout=30,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": 1, **extra})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_the_inference_key_cannot_read_the_admins_prompts_back_through_cached_tokens(two_keys):
    """A shared prefix shows in cached_tokens: with the admin's prompts in the inference role's cache, the
    inference key read them back a guessed token at a time. The admin's requests live in a namespace of
    their own, whose name no client may send (cache_salt, extra_key); each role still hits its own prefixes."""
    s = two_keys
    secret = PROMPT + [40, 41, 42, 43, 44, 45, 46, 47]
    assert _cached(s, B, secret) == 0
    assert _cached(s, A, secret) == 0                                    # the admin's prefix is not shared
    assert _cached(s, A, secret) == len(secret) - 1                      # its own is
    assert _cached(s, B, secret) == len(secret) - 1
    salted = PROMPT + [50, 51, 52, 53]
    assert _cached(s, B, salted, cache_salt="x") == 0
    assert _cached(s, A, salted, cache_salt="x") == 0                    # the same salt does not join them
    for guess in ("admin", "admin/x"):
        assert _cached(s, A, salted, cache_salt=guess) == 0
    spaces = {n.extra_key for n in HttpClient(s.url, admin_key=B).snapshot().cache.nodes} - {None}
    admin_spaces = {k for k in spaces if k.startswith("radix:admin:")}
    assert len({k.split("/")[0] for k in admin_spaces}) == 1 and len(next(iter(admin_spaces)).split("/")[0]) == 28
    # the name shows in KV events and to the admin; sent as a cache_salt it joined the admin's cache
    admin_space = next(iter(admin_spaces)).split("/")[0]
    for extra in ({"cache_salt": admin_space}, {"extra_key": admin_space + "/x"}):
        r = httpx.post(s.url + "/v1/completions", headers=bearer(A), timeout=30,
                       json={"model": "tiny", "prompt": secret, "max_tokens": 1, **extra})
        assert r.status_code == 400 and "may not start with 'radix:'" in r.json()["error"]["message"], r.text
    r = httpx.post(s.url + "/generate", headers=bearer(A), timeout=30,
                   json={"input_ids": secret, "extra_key": admin_space, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "extra_key", r.text
