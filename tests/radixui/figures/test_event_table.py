import pytest

from core.cache.events import ResetEvent
from radixui.figures.event_table import COLUMNS, EVENT_KINDS, describe_event, event_counts, event_table


def by_seq(cache):
    return {e.seq: e for e in cache.events}


@pytest.mark.parametrize("seq, sentence", [
    (1, "cache reset: tree emptied, every slot back in free_pages"),
    (2, "no cached prefix: all 5 tokens must be computed (miss)"),
    (3, "alloc(5) from free_pages: slots 1–5"),
    (4, "inserted node 1 under the root: 'Why my code throws errors' in slots 1–5"),
    (5, "split node 1 after 1 token: new node 2 holds the common prefix"),
    (6, "matched 1 of 5 tokens along node 2; 4 left to compute"),
    (7, "locked path 2 for a running request"),
    (9, "inserted node 3 under node 2: 'GPU memory runs out' in slots 6–9"),
    (10, "unlocked path 2"),
    (11, "split node 1 after 2 tokens: new node 4 holds the common prefix"),
    (12, "matched 3 of 5 tokens along nodes 2 → 4; 2 left to compute"),
    (19, "evicted node 3 ([6,7,8,9], 'GPU memory runs out', last used at time 1)"),
    (20, "freed slots 6–9 to the back of free_pages (old KV stays until overwritten)"),
    (21, "alloc(2) from free_pages: slots 6–7"),
    (22, "inserted node 6 under node 4: 'won't compile' in slots 6–7"),
])
def test_describe_event_sentences(walk, seq, sentence):
    cache, tok, _ = walk
    e = by_seq(cache)[seq]
    assert describe_event(e, tok.token_text) == sentence
    assert describe_event(e.to_dict(), tok.token_text) == sentence     # a remote engine's dicts


def test_describe_without_tokenizer_shows_ids(walk):
    cache, _, _ = walk
    assert describe_event(by_seq(cache)[19]) == "evicted node 3 ([6,7,8,9], '6 7 8 9', last used at time 1)"


def test_event_table_newest_first_with_highlights(walk):
    cache, tok, steps = walk
    df = event_table(steps[3].events, tok.token_text)
    assert list(df.columns) == COLUMNS
    assert df["seq"].tolist() == [23, 22, 21, 20, 19, 18, 17]
    assert df["kind"].tolist() == ["unlock", "insert", "alloc", "free", "evict", "lock", "match"]
    assert df["highlight"].tolist() == ["", "", "", "", "evict", "", ""]
    assert df.loc[df["kind"] == "evict", "node"].tolist() == [3]
    assert df.loc[df["kind"] == "match", "node"].tolist() == [4]      # a match's node: the end of its path
    assert df.loc[df["kind"] == "alloc", "node"].isna().all()


def test_event_table_filters_kinds_and_limits(walk):
    cache, tok, _ = walk
    events = list(cache.events)
    df = event_table(events, tok.token_text, kinds=["split", "evict"])
    assert df["seq"].tolist() == [19, 11, 5]
    assert df["highlight"].tolist() == ["evict", "split", "split"]
    assert event_table(events, kinds=["match"], limit=2)["seq"].tolist() == [17, 12]
    empty = event_table([], tok.token_text)
    assert empty.empty and list(empty.columns) == COLUMNS


def test_event_counts(walk):
    cache, _, _ = walk
    counts = event_counts(cache.events)
    assert list(counts) == list(EVENT_KINDS)
    assert counts["split"] == 2 and counts["evict"] == 1 and counts["insert"] == 4 and counts["reset"] == 1
    assert event_counts([ResetEvent(seq=1, time=0)])["match"] == 0
