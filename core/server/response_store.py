"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: each owner's newest MAX_STORED, in memory.

Each keeps the conversation it answered (its messages, then its answer as an assistant message, each with its item
id), so a response that names it as `previous_response_id` continues that chat (the prompt starts with everything
the earlier turn had, and the radix cache finds it) and GET /v1/responses/{id}/input_items lists it.
A response is its owner's: another caller gets 404, as for an id that never existed (on a server with keys, the
key's identity, and none for keyless callers, who would read each other's; on an open server, everyone is the same
"anonymous").
The store lives with the server process; a restart forgets it, as SGLang's in-memory store does.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from core.server.auth import Caller
from core.server.errors import APIError
from core.server.response_items import input_item

MAX_STORED = 1024


@dataclass(frozen=True)
class Turns:
    """A conversation as the store keeps it: its messages, oldest first, and each one's item id (an answer's is
    the id of its response's output message), so its input items keep their ids from one response to the next."""
    messages: tuple[dict[str, str], ...] = ()
    ids: tuple[str, ...] = ()

    def then(self, messages: list[dict[str, str]], ids: list[str]) -> "Turns":
        if len(messages) != len(ids):
            raise ValueError(f"{len(messages)} messages with {len(ids)} item ids; give each message its id")
        return Turns(self.messages + tuple(messages), self.ids + tuple(ids))


@dataclass(frozen=True)
class StoredResponse:
    turns: Turns                            # the chat it answered (not its instructions), its answer last
    body: dict                              # the response object, as the client got it

    def input_items(self) -> list[dict]:
        """Its input items, oldest first: the conversation it continued and its own input, as OpenAI's items."""
        t = self.turns
        return [input_item(m, i) for m, i in zip(t.messages[:-1], t.ids[:-1])]


class ResponseStore:
    def __init__(self, open_server: bool, max_stored: int = MAX_STORED) -> None:
        self.open_server = open_server      # no keys at all: one user, who reads every response
        self.max_stored = max_stored        # per owner: one caller's traffic never pushes out another's
        self._by_owner: dict[str, OrderedDict[str, StoredResponse]] = {}    # owner -> its responses, oldest first
        self._lock = threading.Lock()

    def keeps_for(self, caller: Caller) -> bool:
        """Whether `caller` could ever read a response back: not a keyless caller on a server with keys (such a
        response is answered with store: false, and takes no room)."""
        return caller.owns_requests or self.open_server

    def put(self, caller: Caller, response_id: str, turns: Turns, body: dict) -> None:
        if not self.keeps_for(caller):
            return
        with self._lock:
            mine = self._by_owner.setdefault(caller.identity, OrderedDict())
            mine[response_id] = StoredResponse(turns, body)
            while len(mine) > self.max_stored:
                mine.popitem(last=False)

    def _find(self, caller: Caller, response_id: str, param: str) -> tuple[str, StoredResponse]:
        """(owner, response) among what `caller` may read (its own; the admin everyone's), or a 404 that does not
        tell another caller's response from none."""
        if not self.keeps_for(caller):
            raise APIError(404, f"no stored response {response_id!r} for a caller without a key: on a server with "
                                f"keys, keyless callers would read each other's responses; send the API key",
                           param, "response_not_found")
        with self._lock:
            owners = list(self._by_owner) if caller.admin else [caller.identity]
            for owner in owners:
                item = self._by_owner.get(owner, {}).get(response_id)
                if item is not None:
                    return owner, item
        raise APIError(404, f"no stored response {response_id!r} for this key: it was never stored (store: "
                            f"false), was deleted, is older than the newest {self.max_stored:,} kept per key, "
                            f"or the server restarted", param, "response_not_found")

    def get(self, caller: Caller, response_id: str, param: str = "response_id") -> StoredResponse:
        return self._find(caller, response_id, param)[1]

    def delete(self, caller: Caller, response_id: str) -> None:
        owner, _ = self._find(caller, response_id, "response_id")
        with self._lock:
            self._by_owner.get(owner, {}).pop(response_id, None)

    def history(self, caller: Caller, previous_id: Optional[str]) -> Turns:
        """The conversation a response continuing `previous_id` starts with (none without one)."""
        if previous_id is None:
            return Turns()
        return self.get(caller, previous_id, "previous_response_id").turns
