import pytest

from tests.radixui.walkthrough import article_walkthrough


@pytest.fixture(scope="module")
def walk():
    """(cache, tokenizer, steps) of the article's walkthrough: time 0..3 on a pool of 11 slots."""
    return article_walkthrough()
