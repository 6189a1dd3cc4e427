"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: each owner's newest MAX_STORED, in memory.

Each keeps the conversation it answered (its messages, then its answer as an assistant message), so a response
that names it as `previous_response_id` continues that chat: the prompt starts with everything the earlier turn
had, and the radix cache finds it. A response is its owner's: another caller gets 404, as for an id that never
existed (on a server with keys, the key's identity, and none for keyless callers, who would read each other's;
on an open server, everyone is the same "anonymous").
The store lives with the server process; a restart forgets it, as SGLang's in-memory store does.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from core.server.auth import Caller
from core.server.errors import APIError

MAX_STORED = 1024


@dataclass(frozen=True)
class StoredResponse:
    messages: tuple[dict[str, str], ...]    # the chat it answered, its answer last
    body: dict                              # the response object, as the client got it


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

    def put(self, caller: Caller, response_id: str, messages: list[dict[str, str]], body: dict) -> None:
        if not self.keeps_for(caller):
            return
        with self._lock:
            mine = self._by_owner.setdefault(caller.identity, OrderedDict())
            mine[response_id] = StoredResponse(tuple(messages), body)
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

    def history(self, caller: Caller, previous_id: Optional[str]) -> list[dict[str, str]]:
        """The messages a response continuing `previous_id` starts with ([] without one)."""
        if previous_id is None:
            return []
        return list(self.get(caller, previous_id, "previous_response_id").messages)
