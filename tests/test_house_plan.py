"""The house plan holds: folders show the parts, imports point one way, no module reads another's
private state, and every module imports alone. docs/ARCHITECTURE.md states the same rules.

The import graph is built from the source with ast (deferred imports inside functions and
`if TYPE_CHECKING:` imports included): a cycle or a wrong-way edge is named by its files.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "radixui")

# Who may import whom. A module's part is the longest prefix of its name listed here; it may import its
# own part and the parts listed for it. Everything points down: cache <- observe <- engine <- server <- radixui.
LAYERS: dict[str, set[str]] = {
    "core.env": set(),
    "core.cache": {"core.env"},
    "core.observe": {"core.cache", "core.env"},
    "core.engine": {"core.observe", "core.cache", "core.env"},
    "core.kv_events": {"core.observe", "core.cache", "core.env"},
    "core.lab": {"core.engine", "core.observe", "core.cache", "core.env"},
    "core.server": {"core.kv_events", "core.engine", "core.observe", "core.cache", "core.env"},
    "core.replicas": {"core.server", "core.engine", "core.observe", "core.cache", "core.env"},
    "core.__main__": {"core.engine", "core.observe", "core.cache", "core.env"},
    "core": set(),
    "radixui": {"core.server", "core.lab", "core.kv_events", "core.engine", "core.observe", "core.cache", "core.env"},
    "app": {"radixui"},
}
# Reading another module's underscore name, allowed only where there is no public way. Each entry says why.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {
    ("core.lab.__main__", "os._exit"): "the documented way to leave a process without running atexit hooks",
    ("core.engine.model.native_linear", "torch.ops.aten._weight_int8pack_mm"):
        "an op in torch's operator registry (the CPU int8 weight-only matmul gpt-fast uses), not a module's state",
    ("core.engine.model.native_layers", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu"):
        "the op behind CPU SDPA, in torch's operator registry: the one that also returns the log-sum-exp",
}


def module_files() -> dict[str, Path]:
    out = {"app": ROOT / "app.py"}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = module_files()


def part_of(module: str) -> str:
    best = ""
    for part in LAYERS:
        if (module == part or module.startswith(part + ".")) and len(part) > len(best):
            best = part
    assert best, f"{module} belongs to no part of LAYERS; add its folder there"
    return best


def imports_of(module: str, path: Path) -> set[str]:
    """Every project module `module` imports (absolute and relative, at any depth of the file)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
            if not all(n in MODULES for n in names):      # `from pkg import name`: pkg/__init__ is imported
                names.append(base)
        else:
            continue
        for name in names:
            while name and name not in MODULES:      # `from core.lab import sweep`: the module, else its package
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def test_every_import_points_down_the_layers():
    wrong = []
    for mod, deps in GRAPH.items():
        mine = part_of(mod)
        for dep in deps:
            theirs = part_of(dep)
            if theirs != mine and theirs not in LAYERS[mine] and not (mine == "core" and dep == "core.env"):
                wrong.append(f"{mod} -> {dep}  ({mine} may import only {sorted(LAYERS[mine]) or 'nothing'})")
    assert not wrong, "imports against the one-way rule:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_files():
    """Tarjan's strongly connected components over the file graph; a package's __init__ counts as a file."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in GRAPH:
        if v not in index:
            visit(v)
    described = []
    for comp in cycles:
        edges = [f"{a} -> {b}" for a in comp for b in sorted(GRAPH[a]) if b in comp]
        described.append(" | ".join(edges))
    assert not cycles, "import cycles (each line: the edges inside one cycle):\n" + "\n".join(described)


def _own_names(tree: ast.Module) -> set[str]:
    """Underscore names this module defines: functions, classes, methods, assigned attributes."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            own.add(node.value)     # __slots__ = ("_prompt", ...)
    return own


def test_no_module_reads_another_modules_private_names():
    """`x._name` where x is not self, cls or super() and `_name` is not defined in this module; and
    `from m import _name`. Dunders are public."""
    found = []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        own = _own_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}")
                continue
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                continue
            if node.attr in own:
                continue
            text = ast.unparse(node)
            if (mod, text) in PRIVATE_ALLOWED:
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert not found, "reads of another module's private names (add a public method instead):\n" + "\n".join(found)


def test_core_has_at_most_five_top_level_modules():
    top = sorted(p.name for p in (ROOT / "core").glob("*.py"))
    assert len(top) <= 5, top


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_two_modules_share_a_file_name(pkg):
    names = Counter(p.name for p in (ROOT / pkg).rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_every_folder_is_a_package_with_a_docstring_on_every_module():
    missing = []
    for mod, path in MODULES.items():
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        if ast.get_docstring(ast.parse(path.read_text())) is None:
            missing.append(str(path.relative_to(ROOT)))
    for pkg in PACKAGES:
        for folder in (ROOT / pkg).rglob("*"):
            if folder.is_dir() and any(folder.glob("*.py")) and not (folder / "__init__.py").exists():
                missing.append(f"{folder.relative_to(ROOT)}/__init__.py")
    assert not missing, missing


FORK_IMPORTS = r"""
import os, sys, importlib
# third-party libraries first (the slow part, shared); then one forked child per project module, so each
# child starts with no project module imported and imports its one module alone
import numpy, torch, transformers, streamlit, plotly.graph_objects, pandas, fastapi, zmq, msgspec  # noqa
import transformers.modeling_utils, transformers.models.auto.modeling_auto, numba, uvicorn, networkx  # noqa
import prometheus_client, httpx, openai  # noqa
bad = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            assert not [m for m in sys.modules if m == "core" or m.startswith(("core.", "radixui"))]
            importlib.import_module(name)
        except BaseException as exc:
            sys.stderr.write(f"{name}: {type(exc).__name__}: {exc}\n")
            code = 1
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        bad.append(name)
print(" ".join(bad))
sys.exit(1 if bad else 0)
"""


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module of core/ and radixui/ (pages included: they render only when Streamlit runs them)
    imported by itself, in a process where no project module was imported before: no module depends
    on another having been imported first. One interpreter loads the third-party libraries once, then
    forks a child per module."""
    names = [m for m in MODULES if m != "app" and not m.endswith("__main__")]
    r = subprocess.run([sys.executable, "-c", FORK_IMPORTS, *names], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"modules that fail to import alone: {r.stdout.strip()}\n{r.stderr[-4000:]}"


COMMANDS = ("radix-engine", "radix-server", "radix-lab", "radix-kv-events", "radix-replicas", "radix-run")


def test_pip_install_e_gives_an_importable_package_and_its_commands(tmp_path):
    """`pip install -e .` in a fresh venv: the commands exist and answer --help from any directory. The
    venv borrows this one's installed libraries through a .pth file (no download), so what is checked
    is the project's own packaging: pyproject.toml, its packages and its entry points."""
    import site
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    libs = [p for p in {*site.getsitepackages(), sysconfig.get_paths()["purelib"]} if Path(p).is_dir()]
    (purelib / "borrowed.pth").write_text("\n".join(libs) + "\n")
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for cmd in COMMANDS:
        r = subprocess.run([str(venv / "bin" / cmd), "--help"], cwd=outside, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("usage:"), (cmd, r.stdout[-500:], r.stderr[-2000:])
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import core.engine.engine, radixui.figures.tree; "
                        "print(core.engine.engine.__file__)"], cwd=outside, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().startswith(str(ROOT)), r.stderr[-2000:]


def test_a_built_package_ships_every_native_kernel_source():
    """A wheel (pip install . without -e) must carry the C sources native_kernels.py compiles on first use: without
    them the engine silently ran the torch fallbacks. Every source and header it hashes matches a package-data glob
    of its package in pyproject.toml."""
    import fnmatch
    import tomllib

    from core.engine.model import native_kernels

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [*native_kernels.SOURCES, *native_kernels.HEADERS]
    assert len(files) >= 10
    for path in files:
        rel = path.relative_to(ROOT)
        package, name = ".".join(rel.parent.parts), rel.name
        assert any(fnmatch.fnmatch(name, g) for g in data.get(package, [])), (
            f"{rel} is not in [tool.setuptools.package-data] {package!r}: add a glob for it")


def test_every_radix_variable_is_read_in_core_env_and_listed_in_the_readme():
    from core import env

    readme = (ROOT / "README.md").read_text()
    assert [v for v in env.VARIABLES if f"`{v}`" not in readme] == []
    readers = []
    for mod, path in MODULES.items():
        text = path.read_text()
        if mod != "core.env" and ("os.environ" in text or "getenv" in text) and "RADIX_" in text:
            for line in text.splitlines():
                if "RADIX_" in line and ("environ.get" in line or "getenv" in line or "environ[" in line):
                    readers.append(f"{mod}: {line.strip()}")
    assert readers == [], readers
