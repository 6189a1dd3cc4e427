import numpy as np
import pandas as pd
import pytest

from core.observe.snapshot import EVICTABLE, FREE_STALE, IN_USE, LOCKED, NEVER_WRITTEN, PADDING, SLOT_STATES, PoolView
from core.observe.time_travel import empty_snapshot
from radixui.figures.plot import validate
from radixui.figures.slots import (
    MAX_COLS,
    OCCUPANCY_ORDER,
    OCCUPIED,
    STATE_COLOURS,
    bin_slots,
    kv_heatmap,
    slot_owners,
    slot_row_figure,
    slot_table,
    written_range,
)


def trace(fig, name):
    (t,) = [t for t in fig.data if t.name == name]
    return t


def big_pool(num_slots=100_000, layers=30, occupied=(12_345, 50_001, 99_998), state=EVICTABLE):
    states = np.full(num_slots + 1, NEVER_WRITTEN, dtype=np.int8)
    states[0] = PADDING
    k = np.zeros((layers, num_slots + 1), dtype=np.float32)
    for i, s in enumerate(occupied):
        states[s] = state
        k[:, s] = 5.0 + i
    return PoolView(num_layers=layers, num_slots=num_slots, page_size=1, states=states,
                    slot_tokens=np.full(num_slots + 1, -1), k_norms=k)


# ----- the slot row ------------------------------------------------------------------------------
def test_slot_table_at_time_3_matches_the_article(walk):
    _, tok, steps = walk
    df = slot_table(steps[3].pool, steps[3].snapshot, tok.token_text)
    assert list(df.columns) == ["slot", "token_id", "text", "node", "state", "stale"]
    assert df["text"].tolist() == ["", "Why", "my", "code", "throws", "errors", "won't", "compile", "runs",
                                   "out", "is", "slow"]
    assert [None if v is pd.NA else int(v) for v in df["node"]] == [None, 2, 4, 4, 1, 1, 6, 6, None, None, 5, 5]
    assert df["state"].tolist() == ["padding"] + ["evictable"] * 7 + ["free_stale"] * 2 + ["evictable"] * 2
    assert df.loc[df["stale"], "slot"].tolist() == [8, 9]


def test_slot_table_range_and_errors(walk):
    _, tok, steps = walk
    df = slot_table(steps[3].pool, steps[3].snapshot, tok.token_text, lo=6, hi=10)
    assert df["slot"].tolist() == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="outside the pool"):
        slot_table(steps[3].pool, steps[3].snapshot, lo=5, hi=99)


def test_slot_owners(walk):
    _, _, steps = walk
    owners = slot_owners(steps[2].snapshot, 12)
    assert owners.tolist() == [-1, 2, 4, 4, 1, 1, 3, 3, 3, 3, 5, 5]


def test_slot_row_figure_cells_text_and_strike_through(walk):
    _, tok, steps = walk
    fig = slot_row_figure(steps[3].pool, steps[3].snapshot, tok.token_text)
    validate(fig)
    cells = trace(fig, "slots")
    assert list(cells.x) == list(range(12))
    texts = list(cells.text[0])
    assert texts[1] == "Why" and texts[6] == "won't" and texts[0] == ""
    assert texts[8] == "<s>runs</s>" and texts[9] == "<s>out</s>"          # free but stale
    assert [SLOT_STATES[int(c)] for c in cells.z[0]] == ["padding"] + ["evictable"] * 7 + ["free_stale"] * 2 + \
        ["evictable"] * 2
    # "#N" under every run, as in the tree's circles: never "node 2" in one place and "6" in another
    assert list(trace(fig, "owner labels").text) == ["#2", "#4", "#1", "#6", "#5"]
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "#N under a run: tree node N holds those slots" in notes
    assert "free_pages (front is handed out next): [8,9]" in notes
    assert [t.name for t in fig.data if t.showlegend] == [
        "padding (never handed out)", "never written", "free, stale KV", "cached, evictable",
        "locked (running request)", "in use (running request)"]


def test_slot_row_time_2_pool_is_full(walk):
    _, tok, steps = walk
    fig = slot_row_figure(steps[2].pool, steps[2].snapshot, tok.token_text)
    assert "free_pages: []" in fig.layout.annotations[0].text.split(" · ")[1]
    assert "GPU" in trace(fig, "slots").text[0][6]


def test_slot_row_caps_cells(walk):
    pool = big_pool(1000, 2, occupied=(5, 120))
    fig = slot_row_figure(pool, empty_snapshot(1000), max_cells=64, lo=100)
    assert len(trace(fig, "slots").x) == 64 and trace(fig, "slots").x[0] == 100
    assert "showing slots 100–163" in fig.layout.annotations[0].text


def test_slot_row_draws_more_than_64_slots_and_drops_text_that_cannot_fit():
    pool = big_pool(1000, 2, occupied=tuple(range(1, 151)))
    pool.slot_tokens[1:151] = 7
    fig = slot_row_figure(pool, empty_snapshot(1000), lo=0, hi=150, token_text=lambda ids: "tok")
    cells = trace(fig, "slots")
    assert len(cells.x) == 150
    assert set(cells.text[0]) == {""}             # 7.7 px a cell: no text, hover keeps it
    assert "token 7: 'tok'" in cells.customdata[0][5]
    fig = slot_row_figure(pool, empty_snapshot(1000), lo=0, hi=20, token_text=lambda ids: "tok")
    assert list(trace(fig, "slots").text[0][1:4]) == ["tok"] * 3


def test_written_range_zooms_to_the_slots_that_hold_kv():
    pool = big_pool(1000, 2, occupied=(5, 120))
    assert written_range(pool) == (0, 125)           # the last written slot + 4 free ones
    assert written_range(big_pool(1000, 2, occupied=())) == (0, 16)
    assert written_range(big_pool(10, 2, occupied=(9,))) == (0, 11)


# ----- the heatmap -------------------------------------------------------------------------------
def test_heatmap_shape_and_values_full_resolution(walk):
    _, _, steps = walk
    pool = steps[3].pool
    fig = kv_heatmap(pool)
    validate(fig)
    k = trace(fig, "k_norms")
    z = np.asarray(k.z)
    assert z.shape == (3, 12)
    # the walkthrough writes 10 * layer + slot into every written slot, 0 elsewhere
    expected = np.zeros((3, 12), dtype=np.float32)
    for layer in range(3):
        expected[layer, 1:] = 10 * layer + np.arange(1, 12)
    expected[:, 0] = np.nan   # padding holds no KV: blank, not the colour of a zero norm
    np.testing.assert_array_equal(z, expected)
    assert list(k.x) == list(range(12)) and list(k.y) == [0, 1, 2]
    strip = trace(fig, "states")
    np.testing.assert_array_equal(np.asarray(strip.z)[0], pool.states)
    assert fig.layout.meta["bin_width"] == 1


def test_heatmap_slot_range_is_full_resolution():
    pool = big_pool()
    fig = kv_heatmap(pool, lo=50_000, hi=50_010)
    k = trace(fig, "k_norms")
    assert list(k.x) == list(range(50_000, 50_010))
    assert np.asarray(k.z).shape == (30, 10)
    z = np.asarray(k.z, dtype=float)[0]
    assert z[1] == 6.0 and np.isnan(np.delete(z, 1)).all()   # never written: blank, not zero


def test_downsampling_keeps_every_occupied_slot_visible():
    occupied = (12_345, 50_001, 99_998)
    pool = big_pool(occupied=occupied)
    b = bin_slots(pool)
    assert len(b.starts) <= MAX_COLS and b.width == 51
    assert b.k_max.shape == (30, len(b.starts))
    for i, s in enumerate(occupied):
        col = int(np.searchsorted(b.starts, s, side="right")) - 1
        assert b.starts[col] <= s < b.starts[col] + b.width
        assert b.states[col] == EVICTABLE
        assert (b.k_max[:, col] == 5.0 + i).all()
    assert np.isin(b.states, OCCUPIED).sum() == 3           # and nothing else looks occupied
    fig = kv_heatmap(pool)
    strip = np.asarray(trace(fig, "states").z)[0]
    assert (strip == EVICTABLE).sum() == 3
    assert np.asarray(trace(fig, "k_norms").z).shape == (30, len(b.starts))


def test_bin_state_is_the_most_occupied_inside():
    assert OCCUPANCY_ORDER == ("never_written", "padding", "free_stale", "evictable", "locked", "in_use")
    states = np.array([PADDING, NEVER_WRITTEN, FREE_STALE, NEVER_WRITTEN, EVICTABLE, FREE_STALE,
                       LOCKED, EVICTABLE, IN_USE, LOCKED], dtype=np.int8)
    pool = PoolView(num_layers=1, num_slots=9, page_size=1, states=states, slot_tokens=np.full(10, -1),
                    k_norms=np.arange(10, dtype=np.float32)[None, :])
    b = bin_slots(pool, max_cols=5)                  # bins of two slots
    assert b.width == 2 and b.starts.tolist() == [0, 2, 4, 6, 8]
    assert b.states.tolist() == [PADDING, FREE_STALE, EVICTABLE, LOCKED, IN_USE]
    assert b.k_max[0].tolist() == [1, 3, 5, 7, 9]


def test_heatmap_without_kv_shows_states_only():
    pool = big_pool(1000, 4, occupied=(5, 120))
    pool = PoolView(num_layers=4, num_slots=1000, page_size=1, states=pool.states, slot_tokens=pool.slot_tokens,
                    k_norms=None)
    fig = kv_heatmap(pool)
    validate(fig)
    assert [t.name for t in fig.data if t.type == "heatmap"] == ["states"]
    assert "no K norms in this snapshot" in " ".join(a.text for a in fig.layout.annotations)


def test_state_colours_cover_every_state_and_are_far_apart():
    assert set(STATE_COLOURS) == set(SLOT_STATES)
    rgb = {k: np.array([int(v[i:i + 2], 16) for i in (1, 3, 5)]) for k, v in STATE_COLOURS.items()}
    gaps = {(a, b): float(np.linalg.norm(rgb[a] - rgb[b])) for a in rgb for b in rgb if a < b}
    assert min(gaps.values()) >= 80, min(gaps.items(), key=lambda kv: kv[1])
    # never written, free-but-stale and cached were near-identical greys before
    assert gaps[("free_stale", "never_written")] >= 80 and gaps[("evictable", "free_stale")] >= 80


def test_heatmap_of_100k_slots_is_bounded():
    """The drawn size is bounded whatever the pool (the build time is benchmarks/bench_ui.py's)."""
    fig = kv_heatmap(big_pool())
    k = np.asarray(trace(fig, "k_norms").z)
    assert k.shape == (30, 1961) and fig.layout.meta["bin_width"] == 51
    assert np.asarray(trace(fig, "states").z).shape == (1, 1961)

def test_the_line_under_the_slot_row_fits_the_figure_width():
    """Ten free slots and a cut range at 900 px: the notes shrink (free list to runs, then the short
    forms) until the one line fits, instead of running off the right edge."""
    from radixui.figures.slots import NOTE_CHAR_PX, row_notes
    free = [131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 3, 5, 7, 9, 11]
    for width in (1200, 900, 600, 400):
        notes = row_notes(free, 0, 160, True, width)
        assert len(" · ".join(notes)) * NOTE_CHAR_PX <= width - 20 or width == 400, (width, notes)
    assert row_notes(free, 0, 160, False, 1200)[1].startswith("free_pages (front is handed out next): [131–140, 3")
    assert row_notes([6, 7, 8, 9], 0, 12, False, 900) == [
        "#N under a run: tree node N holds those slots", "free_pages (front is handed out next): [6,7,8,9]"]
