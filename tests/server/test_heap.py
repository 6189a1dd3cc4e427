"""settle_heap / release_memory (core/server/model_store.py): the server freezes what is alive once its model is
loaded, so no full collection walks the model's ~400k objects mid-stream; a rebuild unfreezes, so the dropped
engine's reference cycles are still collected, then freezes again."""
from __future__ import annotations

import gc
import weakref

from core.server.model_store import release_memory, settle_heap


class Node:
    """An object in a reference cycle: only the cyclic collector frees it, as a dropped engine's cycles."""

    def __init__(self) -> None:
        self.me = self


def test_a_settled_heap_is_not_walked_and_a_rebuild_still_collects_the_old_engines_cycles():
    old = Node()
    ref = weakref.ref(old)
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        del old
        gc.collect()
        assert ref() is not None                 # frozen: a full collection did not walk it
        release_memory()
        assert ref() is None                     # unfrozen and collected
        assert gc.get_freeze_count() > 0         # what is alive frozen again
    finally:
        gc.unfreeze()
