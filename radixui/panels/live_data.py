"""What the Live page keeps between reruns, fetched incrementally through the client: the events
since the last reset (only the new ones each time), token bytes for the labels, and figures that
are rebuilt only when their inputs changed."""
from __future__ import annotations

from typing import Any, Callable, MutableMapping, Optional

from core.cache.events import ev_get, ev_kind
from core.observe.snapshot import EngineSnapshot
from core.observe.time_travel import Replayer, empty_snapshot
from core.observe.token_bytes import TokenDecoder

MAX_EVENTS = 100_000   # the engine's ring; time travel covers at most this many events
FETCH = 20_000


class EventStore:
    """Events after a known state of the cache, in order, fetched with `events_since(last_seq)` so each refresh
    moves only what is new. The state is the cache at its latest reset (`base` None: empty), or, when the
    engine's ring had already dropped events this tab never saw (a tab opened late) or the store trimmed its
    oldest, a snapshot of the cache at `start_seq` (`base`), so time travel always has a complete history
    from there on."""

    def __init__(self) -> None:
        self.events: list = []
        self.last_seq = 0
        self.start_seq = 0      # the seq of the state the events follow
        self.base = None        # that state as a CacheSnapshot; None: the empty cache of a reset (or the start)
        self.shape: Optional[tuple] = None   # (num_slots, page_size, policy) of the engine: the empty cache's
        self.engine_id: Optional[str] = None  # the engine these events are from
        self.replayer: Optional[Replayer] = None

    @property
    def rebased(self) -> bool:
        """Whether the history starts at a snapshot rather than at a reset."""
        return self.base is not None

    def sync(self, client: Any, snap: EngineSnapshot) -> None:
        # a rebuilt engine starts counting again, and one replaced behind this tab's back (another tab's Apply, an
        # admin's rebuild, a restart) may have counted past where this tab stopped: its seq alone cannot tell
        if snap.seq < self.last_seq or self.engine_id not in (None, snap.engine_id):
            self.__init__()
        self.engine_id = snap.engine_id
        self.shape = (snap.cache.num_slots, snap.cache.page_size, snap.cache.policy)
        while self.last_seq < snap.seq:
            new = client.events_since(self.last_seq, FETCH)
            if not new:
                break
            if int(ev_get(new[0], "seq")) != self.last_seq + 1:   # the ring dropped some: follow `snap` on
                self._rebase(snap.cache, [e for e in new if int(ev_get(e, "seq")) > snap.cache.seq])
                if len(new) < FETCH:
                    break
                continue
            self._add(new)
            if len(new) < FETCH:
                break

    def _rebase(self, base, events: list) -> None:
        self.base, self.start_seq, self.replayer = base, int(base.seq), None
        self.events, self.last_seq = [], int(base.seq)
        self._add(events)

    def _add(self, new: list) -> None:
        for i in range(len(new) - 1, -1, -1):
            if ev_kind(new[i]) == "reset":
                self.events, self.base, self.replayer = [], None, None
                self.start_seq = int(ev_get(new[i], "seq"))
                new = new[i + 1:]
                break
        self.events.extend(new)
        if new:
            self.last_seq = int(ev_get(new[-1], "seq"))
        elif self.start_seq > self.last_seq:
            self.last_seq = self.start_seq
        if self.replayer is not None and new:
            self.replayer.extend(new)
        if len(self.events) > MAX_EVENTS:     # keep the newest, from the state just before them
            cut = len(self.events) - MAX_EVENTS
            at = int(ev_get(self.events[cut - 1], "seq"))
            base = self._replayer().at(at)
            self.base, self.start_seq, self.replayer = base, at, None
            del self.events[:cut]

    def recent(self, n: int = 2000) -> list:
        return self.events[-n:]

    def recent_upto(self, seq: int, n: int = 2000) -> list:
        """The last `n` events with seq <= `seq`: those a snapshot of that seq describes (the store may
        already hold later ones, fetched after the snapshot), so highlights, ghosts and the eviction
        caption come from the same step as the tree they are drawn on."""
        end = len(self.events)
        while end and int(ev_get(self.events[end - 1], "seq")) > seq:
            end -= 1
        return self.events[max(0, end - n):end]

    def replayer_for(self, snap: EngineSnapshot) -> Replayer:
        """A Replayer over the events since the base state, extended as events arrive (its checkpoints
        stay valid), so a time-travel step replays at most one checkpoint interval."""
        self.shape = (snap.cache.num_slots, snap.cache.page_size, snap.cache.policy)
        return self._replayer()

    def _replayer(self) -> Replayer:
        if self.replayer is None:
            initial = self.base if self.base is not None else empty_snapshot(*self.shape, seq=self.start_seq)
            self.replayer = Replayer(initial, self.events)
        return self.replayer


HIDDEN_TOKEN = "▪"     # a token of a redacted snapshot (the server hides token ids from the inference key)
FIGURE_STATE = ("_figs", "_tree_painted", "tree_focus", "tt_seq")   # what a tab drew from one engine


def follow_engine(state: MutableMapping, snap: EngineSnapshot) -> None:
    """When `snap` comes from another engine than the last run's (a server restarted or replaced, another tab's
    Apply), drop what was drawn from the old one: figures are cached by seq and step, which a new engine counts
    again from 0, so an empty 4,096-slot pool had stayed drawn under a new 100,000-slot one. Says how many
    requests ended with the old engine, and forgets this tab's own (unless this tab's Apply said so already)."""
    last, state["_engine_id"] = state.get("_engine_id"), snap.engine_id
    live = sum(1 for r in snap.requests if r.state in ("waiting", "running"))
    ended, state["_engine_live"] = state.get("_engine_live", 0), live
    if last is None or last == snap.engine_id:
        return
    for name in FIGURE_STATE:
        state.pop(name, None)
    mine = state.get("my_requests") or {}
    state["my_requests"] = {}
    if state.pop("_engine_applied", False) or not (ended or mine):
        return
    n = max(ended, len(mine))
    state["flash"] = ("warning", f"The engine server now runs a new engine (restarted or replaced): {n} request"
                                 f"{' that was' if n == 1 else 's that were'} waiting or running ended with the "
                                 f"old one.")


def event_store(state: MutableMapping) -> EventStore:
    if "_events" not in state:
        state["_events"] = EventStore()
    return state["_events"]


def decoder(state: MutableMapping, client: Any, snap: EngineSnapshot, model: str) -> TokenDecoder:
    """A TokenDecoder for the snapshot's tokens; their bytes come from the client once per token
    (when that call fails, labels join per-token pieces)."""
    if snap.redacted:         # every id is 0: drawn as what it is, a token whose text this key may not read
        return TokenDecoder({}, unknown=HIDDEN_TOKEN)
    known: dict = state.setdefault("_token_bytes", {}).setdefault(model, {})
    missing = [t for t in snap.token_text if t not in known]
    if missing:
        try:
            hexes = client.token_bytes(missing)
        except (ValueError, KeyError, OSError):   # OSError covers an unreachable server
            hexes = None
        if hexes and len(hexes) == len(missing):
            known.update({t: bytes.fromhex(h) for t, h in zip(missing, hexes)})
    return TokenDecoder(snap.token_text, known)


def cached_figure(state: MutableMapping, name: str, key: tuple, build: Callable[[], Any],
                  fresh: bool = True) -> Any:
    """Rebuild a figure only when its inputs (the key) changed; with `fresh=False` (a hidden view)
    keep whatever was built last, and build only when there is none yet."""
    store = state.setdefault("_figs", {})
    if name not in store or (fresh and store[name][0] != key):
        store[name] = (key, build())
    return store[name][1]
