"""radixui/connect/origin.py: which pages' sessions the dashboard answers (app.py stops the others first)."""
from __future__ import annotations

import pytest

from radixui.connect.origin import foreign_origin


@pytest.mark.parametrize("headers, allowed", [
    ({}, ()),                                                                       # no Origin: no browser's page
    ({"Origin": "http://127.0.0.1:8501", "Host": "127.0.0.1:8501"}, ()),
    ({"Origin": "http://LOCALHOST:8501", "Host": "localhost:8501"}, ()),
    ({"Origin": "http://[::1]:8501", "Host": "[::1]:8501"}, ()),
    ({"Origin": "https://dash.example", "Host": "dash.example"}, ()),               # a proxy's `Host $host`
    ({"Origin": "https://dash.example", "Host": "dash.example:443"}, ()),
    ({"Origin": "https://dash.example", "Host": "127.0.0.1:8501", "X-Forwarded-Host": "dash.example"}, ()),
    ({"Origin": "https://dash.example:8443", "Host": "127.0.0.1:8501"}, ("https://dash.example:8443",)),
])
def test_the_dashboards_own_origin_and_those_the_operator_lists_are_answered(headers, allowed):
    assert foreign_origin(headers, allowed) is None


@pytest.mark.parametrize("headers", [
    {"Origin": "http://localhost:8502", "Host": "localhost:8501"},                # another local port's page
    {"Origin": "http://127.0.0.1:3000", "Host": "127.0.0.1:8501"},
    {"Origin": "http://localhost:8501", "Host": "127.0.0.1:8501"},                # another name is another origin
    {"Origin": "null", "Host": "127.0.0.1:8501"},
    {"Origin": "https://dash.example", "Host": "dash.example:8443"},
    {"Origin": "http://evil.example", "Host": "127.0.0.1:8501,evil.example"},
])
def test_a_page_of_any_other_origin_is_refused_with_what_to_do(headers):
    assert "answers only pages of its own origin" in foreign_origin(headers, ("https://dash.example:8443",))
