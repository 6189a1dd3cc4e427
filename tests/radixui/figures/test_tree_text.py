"""The tree's text: slot runs under nodes, decoded token runs wrapped to their column (never inside
a word, newlines shown as ⏎), escaped for plotly's HTML labels."""
from radixui.figures.tree_text import edge_label, node_label, wrap_label


def test_node_label_runs():
    assert node_label(range(12, 531)) == "12–530"
    assert node_label([1, 4, 5, 6]) == "1, 4–6"
    assert node_label([1, 3, 5, 7, 9, 11, 13], width=10) == "1, 3, 5, …"


def test_edge_label_wraps_and_shortens():
    text = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    assert edge_label([1, 2], text, width=20) == "w1 w2"
    assert edge_label(range(3), text, width=6) == "w0 w1<br>w2"
    long = edge_label(range(100), text, width=12)
    assert long.count("<br>") == 1 and long.endswith("…") and long.startswith("w0 w1 w2")
    assert all(len(line) <= 12 for line in long.split("<br>"))
    assert edge_label([1], lambda ids: "a<b>", width=10) == "a&lt;b&gt;"


def test_wrap_label_newlines_become_visible():
    assert wrap_label("a\nb", 10) == ["a⏎b"]


def test_wrap_label_never_breaks_inside_a_word():
    assert wrap_label("Why my code throws errors", 8) == ["Why my", "code…"]
    assert wrap_label("throws errors", 9) == ["throws", "errors"]
    lines = wrap_label("internationalization is long", 10)
    assert lines[0] == "internati…" and all(len(x) <= 10 for x in lines)
    for width in range(4, 30):
        for line in wrap_label("the cache keeps every prefix it has computed", width):
            assert len(line) <= width
            assert all(w in "the cache keeps every prefix it has computed".split() or w.endswith("…")
                       for w in line.split())


def test_a_chat_label_keeps_the_word_after_the_template_tokens():
    """The chat template's "<|im_start|>system⏎You ..." is one run without spaces: shortened whole
    to fit a narrow column it used to swallow "You"; a newline is a break, so "You" starts the next line."""
    text = "<|im_start|>system\nYou are a patient teaching assistant"
    assert wrap_label(text, 12) == ["<|im_start|…", "You are a…"]
    assert wrap_label(text, 30) == ["<|im_start|>system⏎You are a", "patient teaching assistant"]
    assert wrap_label("a\nb c", 3) == ["a⏎", "b c"]
