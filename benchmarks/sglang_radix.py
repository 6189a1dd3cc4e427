"""SGLang's own radix cache and KV slot allocators, imported from its PyPI wheel, for bench_radix.py.

`load()` fetches sglang==0.5.23 with `pip download --no-deps` into a temporary folder (kept under the system
temp dir between runs; nothing is vendored into this repository) and imports the real source of
`sglang/srt/mem_cache/radix_cache.py`, `base_prefix_cache.py`, `cache_init_params.py`, `evict_policy.py`,
`events.py`, `utils.py` and `allocator/{base,token,paged}.py` straight from the wheel. Every other `sglang`
module those import (GPU kernels, platforms, metrics, environment, managers) is an import-level stub: a
module whose every attribute is an inert placeholder. None of the placeholders is called on the path the
benchmark drives (match_prefix, inc/dec_lock_ref, alloc, evict, insert, free), which is pure Python + torch.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

VERSION = "0.5.23"
MEM = "sglang/srt/mem_cache/"
REAL = {  # module name -> path inside the wheel
    "sglang.srt.mem_cache.radix_cache": MEM + "radix_cache.py",
    "sglang.srt.mem_cache.base_prefix_cache": MEM + "base_prefix_cache.py",
    "sglang.srt.mem_cache.cache_init_params": MEM + "cache_init_params.py",
    "sglang.srt.mem_cache.evict_policy": MEM + "evict_policy.py",
    "sglang.srt.mem_cache.events": MEM + "events.py",
    "sglang.srt.mem_cache.utils": MEM + "utils.py",
    "sglang.srt.mem_cache.allocator": MEM + "allocator/__init__.py",
    "sglang.srt.mem_cache.allocator.base": MEM + "allocator/base.py",
    "sglang.srt.mem_cache.allocator.token": MEM + "allocator/token.py",
    "sglang.srt.mem_cache.allocator.paged": MEM + "allocator/paged.py",
}


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub


class _Stub(metaclass=_StubMeta):
    """Stands for any class, function or constant of a stubbed module: callable, subclassable, falsy."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __bool__(self) -> bool:
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `sglang.*`: the REAL modules from the extracted wheel, a stub for every other one."""

    def __init__(self, src: Path) -> None:
        self.src = src

    def find_spec(self, name, path=None, target=None):
        if name != "sglang" and not name.startswith("sglang."):
            return None
        if name in REAL:
            file = self.src / REAL[name]
            pkg = [str(file.parent)] if file.name == "__init__.py" else None
            return importlib.util.spec_from_file_location(name, file, submodule_search_locations=pkg)
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module) -> None:
        pass


def _wheel(cache: Path) -> Path:
    found = sorted(cache.glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"sglang=={VERSION}",
                        "-d", str(cache)], check=True)
        found = sorted(cache.glob(f"sglang-{VERSION}-*.whl"))
    return found[0]


def load(cache: Path = Path(tempfile.gettempdir()) / "radix-bench-sglang") -> types.SimpleNamespace:
    """The real SGLang classes: RadixCache, RadixKey, the params/result dataclasses and both allocators."""
    src = cache / "src"
    if not (src / REAL["sglang.srt.mem_cache.radix_cache"]).exists():
        with zipfile.ZipFile(_wheel(cache)) as z:
            for member in REAL.values():
                z.extract(member, src)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(src))
    rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    bp = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
    token = importlib.import_module("sglang.srt.mem_cache.allocator.token")
    paged = importlib.import_module("sglang.srt.mem_cache.allocator.paged")
    return types.SimpleNamespace(
        RadixCache=rc.RadixCache, RadixKey=rc.RadixKey, CacheInitParams=params.CacheInitParams,
        MatchPrefixParams=bp.MatchPrefixParams, InsertParams=bp.InsertParams, EvictParams=bp.EvictParams,
        TokenToKVPoolAllocator=token.TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=paged.PagedTokenToKVPoolAllocator, version=VERSION, wheel=str(_wheel(cache)))
