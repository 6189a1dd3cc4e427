"""How the dashboard reaches an engine: one small interface, two implementations.

`EngineClient` is everything a page may ask of an engine. `InProcessClient` (in_process.py) wraps
an engine in this process (AppTest, unit tests); `HttpClient` (http_client.py) speaks to
`python -m core.server`, so the page never shares a GIL with a serving engine.
Pages use this interface only, never `core.engine.engine`.
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence, Union

from core.cache.events import Event
from core.engine.config import EngineConfig
from core.engine.sampling import SamplingParams
from core.observe.snapshot import EngineSnapshot

Prompt = Union[str, Sequence[int], Sequence[dict]]


class EngineClient(Protocol):
    """What a dashboard page may do with an engine, local or remote."""

    def version(self) -> int:
        """A cheap number that changes whenever the engine's state changes (poll this, then
        fetch a snapshot only when it moved)."""

    def versions(self) -> tuple[int, int]:
        """(version(), the seq of the last cache event that changed the tree) in one call: the tree
        changes only at admissions, finishes and evictions, not at every decode step, so a page can
        redraw at once when it does and keep its chosen pace for token counts."""

    def snapshot(self) -> EngineSnapshot:
        """The engine's state as of its last finished step (never waits behind a running one)."""

    def events_since(self, seq: int, limit: int = 2000) -> list[Event]:
        """Cache events with seq > `seq`, oldest first, at most `limit` (the newest ones if more)."""

    def submit(self, prompt: Prompt, params: SamplingParams, extra_key: Optional[str] = None) -> str:
        """Queue a request; returns its rid. Bad input raises ValueError with the engine's message."""

    def abort(self, rid: str) -> bool: ...

    def abort_all(self) -> int:
        """Abort every waiting and running request this client may abort (all, for the admin); how many."""

    def config(self) -> EngineConfig: ...

    def rebuild(self, config: EngineConfig) -> Optional[str]:
        """Swap in an engine with new settings; an error message (old engine kept) or None."""

    def reset_cache(self) -> Optional[str]:
        """Empty the tree (flush_cache); an error message when requests still run, else None."""

    def last_error(self) -> Optional[str]: ...

    def is_admin(self) -> bool:
        """True when this client may rebuild, flush and step the engine (the server's admin role):
        the dashboard disables those controls otherwise, with a note saying which key they need."""

    def is_stepping(self) -> bool:
        """True in step mode: the engine loop is stopped and advances one `step()` at a time."""

    def set_step_mode(self, on: bool) -> None: ...

    def step(self) -> bool:
        """One scheduler step in step mode; False when there was nothing to do."""

    def token_bytes(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's raw bytes as hex (JSON-friendly), so labels decode whole runs: byte-level
        BPE splits "Ü" over two tokens that decode to "�" one at a time."""

    def request_tokens(self, rid: str) -> Optional[dict]:
        """{"prompt_ids": [...], "output_ids": [...]} of a request still listed in the snapshot, or
        None: the page walks the tree with them to highlight the path the request matched and
        inserted."""
