import math

from radixui.figures.kpis import MISSING, kpis

FULL = {"hit_rate": 0.625, "hit_rate_recent": 0.8, "prefill_tokens_computed": 1500, "prefill_tokens_skipped": 2500,
        "evicted_tokens": 12345, "decode_tokens_per_s": 41.25, "waiting": 3, "running": 2, "free_slots": 100,
        "evictable_slots": 7000, "locked_slots": 1092}


def test_kpis_with_every_key():
    tiles = kpis(FULL)
    assert [(label, value) for label, value, _ in tiles] == [
        ("Hit rate", "62.5%"),
        ("Hit rate (last 20)", "80.0%"),
        ("Prefill skipped", "2,500 tok"),
        ("Prefill computed", "1,500 tok"),
        ("Evicted", "12,345 tok"),
        ("Free slots", "100"),
        ("Evictable slots", "7,000"),
        ("Locked slots", "1,092"),
        ("Decode speed", "41.2 tok/s"),
        ("Running / waiting", "2 / 3"),
    ]
    assert all(help_ for _, _, help_ in tiles)
    assert "62% of prompt tokens" in tiles[2][2]


def test_kpis_tolerate_missing_and_bad_values():
    tiles = kpis({})
    assert len(tiles) == 10 and all(value == MISSING for _, value, _ in tiles)
    tiles = dict((label, value) for label, value, _ in
                 kpis({"hit_rate": None, "hit_rate_recent": "n/a", "free_slots": 5, "running": math.nan,
                       "waiting": 1, "decode_tokens_per_s": float("inf")}))
    assert tiles["Hit rate"] == MISSING and tiles["Hit rate (last 20)"] == MISSING
    assert tiles["Free slots"] == "5" and tiles["Locked slots"] == MISSING
    assert tiles["Running / waiting"] == f"{MISSING} / 1"
    assert tiles["Decode speed"] == MISSING
    assert kpis(None)[0][1] == MISSING


def test_hit_rate_given_in_percent():
    assert kpis({"hit_rate": 62.5})[0][1] == "62.5%"
    assert kpis({"hit_rate": 1})[0][1] == "100.0%"
