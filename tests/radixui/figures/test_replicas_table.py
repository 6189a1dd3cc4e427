"""The Replicas page: totals summed from counters (not averaged rates), one request table, and the
page itself (AppTest) attached to the in-process engine."""
from __future__ import annotations

import json
import pathlib
import time
from types import SimpleNamespace

from streamlit.testing.v1 import AppTest

from radixui.figures.replicas_table import request_rows, total_metrics

PAGE = str(pathlib.Path(__file__).resolve().parents[3] / "radixui" / "pages" / "replicas.py")


def snap(prompt: int, cached: int, free: int, num: int, requests=()):
    return SimpleNamespace(metrics={"prompt_tokens": prompt, "cached_tokens": cached, "free_slots": free,
                                    "num_slots": num, "running": 1, "waiting": 0}, requests=tuple(requests))


def req(rid: str, cached: int):
    return SimpleNamespace(rid=rid, state="finished", prompt_tokens=10, cached_tokens=cached, output_tokens=2,
                           output_text="ok", error=None)


def test_totals_weigh_replicas_by_their_tokens():
    # replica A: 2 of 10 prompt tokens cached (20 %); B: 900 of 1,000 (90 %); the true total is 902/1010
    t = total_metrics([snap(10, 2, 50, 100), snap(1000, 900, 25, 100), None])
    assert t["hit_rate"] == 902 / 1010 and t["prompt_tokens"] == 1010 and t["running"] == 2
    assert t["token_usage"] == (200 - 75) / 200


def test_request_table_names_the_replica_of_every_request_newest_first():
    df = request_rows([snap(1, 0, 1, 1, [req("a1", 0), req("a2", 5)]), None, snap(1, 0, 1, 1, [req("c1", 3)])],
                      ["http://a", "http://b", "http://c"])
    assert list(zip(df["replica"], df["request"], df["cached tokens"])) == \
        [("http://a", "a2", 5), ("http://a", "a1", 0), ("http://c", "c1", 3)]


def test_page_with_one_engine_explains_how_to_attach_several():
    at = AppTest.from_file(PAGE, default_timeout=180).run()
    assert not at.exception
    assert any("python -m core.replicas" in i.value for i in at.info)
    assert any("One engine" in m.value for m in at.markdown)


def test_page_shows_non_ascii_prompt_intact_in_the_replica_tree():
    # byte-level BPE splits "ü", "東", "京" and "🚀" over several tokens: joined piece by piece they read
    # "Gr��e, ����� ���"; the page must decode runs of bytes as the Live page does
    from core.engine.sampling import SamplingParams
    from radixui.connect.resources import get_clients

    from radixui.connect.resources import default_config, get_holder

    text = "Grüße, 東京 🚀"
    # the page's own (in-process) engine is shared through cache_resource with the other tests of this process:
    # a fresh one, so the tree is this prompt's alone (a big tree folds small subtrees into "+N" boxes)
    assert get_holder().rebuild(default_config()) is None
    client = get_clients()[0]
    try:
        rid = client.submit(text, SamplingParams(max_new_tokens=1, temperature=0.0))
        deadline = time.time() + 120
        while not any(r.rid == rid and r.state == "finished" for r in client.snapshot().requests):
            assert time.time() < deadline, "the request did not finish"
            time.sleep(0.2)
        at = AppTest.from_file(PAGE, default_timeout=180).run()
    finally:                                  # later tests of this process expect a fresh in-process engine
        assert get_holder().rebuild(default_config()) is None
    assert not at.exception, at.exception
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart"))
    edge = next(t for t in spec["data"] if t.get("name") == "edge text")
    # the label may be cut to its column (one line on a deep tree: "Grüße, 東…"); the hover holds it whole
    assert any(text in t for t in edge["hovertext"]), edge["hovertext"]
    assert not any("\ufffd" in t for t in edge["text"] + edge["hovertext"]), edge["text"]
