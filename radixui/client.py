"""How the dashboard reaches an engine: one small interface, two implementations.

`EngineClient` is everything a page may ask of an engine. `InProcessClient` wraps an
`EngineHolder` in this process (AppTest, unit tests); `HttpClient` (radixui/http_client.py)
speaks to `python -m core.server`, so the page never shares a GIL with a serving engine.
Pages import only this module, never `core.engine`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, Sequence, Union

from core.events import Event
from core.sampling import SamplingParams
from core.snapshot import EngineSnapshot

if TYPE_CHECKING:
    from radixui.state import EngineConfig, EngineHolder

Prompt = Union[str, Sequence[int], Sequence[dict]]


class EngineClient(Protocol):
    """What a dashboard page may do with an engine, local or remote."""

    def version(self) -> int:
        """A cheap number that changes whenever the engine's state changes (poll this, then
        fetch a snapshot only when it moved)."""

    def snapshot(self) -> EngineSnapshot:
        """The engine's state as of its last finished step (never waits behind a running one)."""

    def events_since(self, seq: int, limit: int = 2000) -> list[Event]:
        """Cache events with seq > `seq`, oldest first, at most `limit` (the newest ones if more)."""

    def submit(self, prompt: Prompt, params: SamplingParams, extra_key: Optional[str] = None) -> str:
        """Queue a request; returns its rid. Bad input raises ValueError with the engine's message."""

    def abort(self, rid: str) -> bool: ...

    def config(self) -> "EngineConfig": ...

    def rebuild(self, config: "EngineConfig") -> Optional[str]:
        """Swap in an engine with new settings; an error message (old engine kept) or None."""

    def reset_cache(self) -> Optional[str]:
        """Empty the tree (flush_cache); an error message when requests still run, else None."""

    def last_error(self) -> Optional[str]: ...

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


class InProcessClient:
    """An engine in this process, held by an `EngineHolder` (rebuilds swap the engine)."""

    def __init__(self, holder: "EngineHolder") -> None:
        self.holder = holder

    @property
    def _engine(self):
        return self.holder.get()

    def version(self) -> int:
        e = self._engine
        return hash((id(e), e._version, e.cache.events.last_seq, e.step_count))

    def snapshot(self) -> EngineSnapshot:
        return self._engine.snapshot(wait=False)

    def events_since(self, seq: int, limit: int = 2000) -> list[Event]:
        return self._engine.events_since(seq)[-limit:]

    def submit(self, prompt: Prompt, params: SamplingParams, extra_key: Optional[str] = None) -> str:
        return self._engine.submit(prompt, params, extra_key=extra_key).rid

    def abort(self, rid: str) -> bool:
        return self._engine.abort(rid)

    def config(self) -> "EngineConfig":
        from radixui.state import EngineConfig
        self._engine
        return self.holder.config or EngineConfig()

    def rebuild(self, config: "EngineConfig") -> Optional[str]:
        return self.holder.rebuild(config)

    def reset_cache(self) -> Optional[str]:
        try:
            self._engine.reset_cache()
        except ValueError as exc:
            return str(exc)
        return None

    def last_error(self) -> Optional[str]:
        return self._engine.last_error

    def is_stepping(self) -> bool:
        return not self._engine.running

    def set_step_mode(self, on: bool) -> None:
        e = self._engine
        if on and e.running:
            e.stop()
        elif not on and not e.running:
            e.start()

    def step(self) -> bool:
        return self._engine.step()

    def token_bytes(self, token_ids: Sequence[int]) -> list[str]:
        return [b.hex() for b in self._engine.token_bytes(token_ids)]

    def request_tokens(self, rid: str) -> Optional[dict]:
        return self._engine.request_tokens(rid)
