"""An engine in the dashboard's own process (AppTest, unit tests, no RADIX_ENGINE_URL): `EngineHolder`
keeps the live engine and swaps it on a rebuild only once the new one loads; `InProcessClient` is the
EngineClient over it."""
from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from core.cache.events import Event
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from core.observe.snapshot import EngineSnapshot
from radixui.connect.client import Prompt


class EngineHolder:
    """The live engine and its config; `rebuild` swaps engines only when the new one loads."""

    def __init__(self, load_runner: Callable[[EngineConfig], ModelRunner], first_config: Callable[[], EngineConfig]) -> None:
        self.load_runner, self.first_config = load_runner, first_config
        self.lock = threading.Lock()
        self.config: Optional[EngineConfig] = None
        self.engine: Optional[Engine] = None

    def get(self) -> Engine:
        with self.lock:
            if self.engine is None:
                self._build(self.first_config())
            return self.engine

    def rebuild(self, config: EngineConfig) -> Optional[str]:
        """Returns an error message (and keeps the old engine) when `config` does not work."""
        with self.lock:
            try:
                self._build(config)
            except ValueError as exc:
                return str(exc)
            except Exception as exc:  # a model that fails to load in some other way
                return f"could not load {config.model!r}: {type(exc).__name__}: {exc}"
            return None

    def _build(self, config: EngineConfig) -> None:
        """The new engine runs as the old one did: in step mode, it waits for Step, as the server's rebuild does."""
        engine = Engine(self.load_runner(config.validate()), config)
        old, self.engine, self.config = self.engine, engine, config
        if old is None or old.running:
            engine.start()
        if old is not None:
            old.stop()


class InProcessClient:
    """An engine in this process, held by an `EngineHolder` (rebuilds swap the engine)."""

    def __init__(self, holder: "EngineHolder") -> None:
        self.holder = holder

    @property
    def _engine(self):
        return self.holder.get()

    def version(self) -> int:
        e = self._engine
        return hash((id(e), e.version()))

    def versions(self) -> tuple[int, int]:
        e = self._engine
        return hash((id(e), e.version())), e.cache.events.last_tree_seq

    def snapshot(self) -> EngineSnapshot:
        return self._engine.snapshot(wait=False)

    def events_since(self, seq: int, limit: int = 2000) -> list[Event]:
        return self._engine.events_since(seq)[-limit:]

    def submit(self, prompt: Prompt, params: SamplingParams, extra_key: Optional[str] = None) -> str:
        return self._engine.submit(prompt, params, extra_key=extra_key).rid

    def abort(self, rid: str) -> bool:
        return self._engine.abort(rid)

    def abort_all(self) -> int:
        e = self._engine
        return sum(bool(e.abort(r.rid)) for r in e.snapshot().requests if r.state in ("waiting", "running"))

    def config(self) -> EngineConfig:
        return self._engine.config

    def rebuild(self, config: EngineConfig) -> Optional[str]:
        return self.holder.rebuild(config)

    def reset_cache(self) -> Optional[str]:
        try:
            self._engine.reset_cache()
        except ValueError as exc:
            return str(exc)
        return None

    def last_error(self) -> Optional[str]:
        return self._engine.last_error

    def is_admin(self) -> bool:
        return True          # the engine is this process's own

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
