"""Several inference keys are tenants (`--api-key` again, or RADIX_API_KEY="A,B"): each key owns its requests, and
its requests live in a cache namespace of its own, so one tenant reads neither another's tokens nor, through
cached_tokens, another's prefixes. One key keeps SGLang's single shared cache."""
from __future__ import annotations

import httpx
import pytest

from core.server.__main__ import parse_args
from core.server.app import ServerSettings
from tests.server.conftest import serving, tiny_factory

TA, TB, ADMIN = "tenant-a-key", "tenant-b-key", "the-admin-key"
PROMPT = [5, 17, 33, 2, 90, 61, 7, 12, 44, 45]


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenants(tiny_runner):
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", api_key=[TA, TB], admin_key=ADMIN)) as s:
        yield s


def complete(s, key: str, prompt: list, **extra) -> dict:
    r = httpx.post(s.url + "/v1/completions", headers=bearer(key), timeout=30,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def cached(out: dict) -> int:
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_tenant_never_hits_another_tenants_prefix_and_still_hits_its_own(tenants):
    assert cached(complete(tenants, TA, PROMPT)) == 0
    assert cached(complete(tenants, TB, PROMPT)) == 0                  # A's prefix is not B's to probe
    assert cached(complete(tenants, TB, PROMPT, cache_salt="x")) == 0
    assert cached(complete(tenants, TA, PROMPT)) == len(PROMPT) - 1    # each its own
    assert cached(complete(tenants, TB, PROMPT)) == len(PROMPT) - 1
    r = httpx.post(tenants.url + "/v1/completions", headers=bearer(TB), timeout=30,
                   json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "cache_salt": "radix:key:0"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_a_tenant_cannot_read_or_abort_another_tenants_request_and_the_admin_can(tenants):
    rid = complete(tenants, TA, PROMPT)["id"] + "-0"
    path = f"/state/requests/{rid}/tokens"
    assert httpx.get(tenants.url + path, headers=bearer(TA)).json()["prompt_ids"] == PROMPT
    assert httpx.get(tenants.url + path, headers=bearer(ADMIN)).status_code == 200
    assert httpx.get(tenants.url + path, headers=bearer(TB)).status_code == 404
    assert httpx.post(f"{tenants.url}/state/requests/{rid}/abort", headers=bearer(TB)).status_code == 404
    assert httpx.get(tenants.url + path, headers=bearer("tenant-c-key")).status_code == 401


def test_keys_come_from_repeated_flags_or_a_comma_list_and_each_once(monkeypatch):
    monkeypatch.delenv("RADIX_ADMIN_KEY", raising=False)
    monkeypatch.setenv("RADIX_API_KEY", "a1, b2")
    assert parse_args([]).api_key == ["a1", "b2"]
    assert parse_args(["--api-key", "x", "--api-key", "y"]).api_key == ["x", "y"]     # the flags win
    monkeypatch.delenv("RADIX_API_KEY")
    assert parse_args([]).api_key == []
    for argv in (["--api-key", "x", "--api-key", "x"], ["--api-key", "x", "--admin-key", "x"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_an_empty_api_key_is_refused_rather_than_leaving_the_server_open(monkeypatch, capsys):
    """`--api-key "$UNSET"` passes "": it counted as a key set, no key was required, and no warning said so."""
    monkeypatch.delenv("RADIX_API_KEY", raising=False)
    for argv in (["--api-key", ""], ["--api-key", "k", "--api-key", "  "]):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert "--api-key is empty" in capsys.readouterr().err
