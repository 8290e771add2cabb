"""The house rules of ``src/glyd``, read from the source (no import of the package needed).

* no import cycles between modules (imports inside functions count too: a lazy cycle is still one);
* each package imports only the layers below it (codec < kernels < ops < nn < store < hf < apps;
  diffusers beside hf, using it);
* files stay under 600 lines and functions under 80, with the exceptions named below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "glyd"

#: The base modules every layer may use.
BASE = {"errors", "_env", "_version", "_dist", "timing"}
#: Top-level part of glyd -> the parts it may import (besides BASE and itself).
ALLOWED: dict[str, set[str]] = {
    "codec": set(),
    "filecodec": set(),
    "kernels": {"codec"},
    "kv": {"codec", "kernels"},
    "ops": {"codec", "kernels"},
    "nn": {"codec", "ops"},
    "store": {"codec"},
    "hf": {"codec", "ops", "nn", "store", "kv"},
    # Beside hf: diffusers models, through hf's packer, skeleton and checks.
    "diffusers": {"codec", "ops", "nn", "store", "hf"},
    "apps": {"codec", "filecodec", "kernels", "kv", "ops", "nn", "store", "hf", "diffusers", "glyd"},
    "cli": {"glyd", "apps"},
    # The package's face: the codec at once, the rest lazily by name; the transformers hook;
    # ops.choose_layout when glyd.pack is asked for layout="auto"; compress, from_pretrained and
    # save_pretrained route a diffusers model to glyd.diffusers.
    "glyd": {"codec", "ops", "hf", "diffusers"},
    **{b: set() for b in BASE},
}
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
#: (file relative to src/glyd, function) -> why it is longer.
LONG_FUNCTIONS = {
    # One Gluon kernel body: its tile loop, the decode and the MMA share registers and layouts that
    # the compiler must see in one function (its helpers are in fixed12/mma_v2_parts.py).
    ("kernels/fixed12/mma_v2.py", "_gl_kernel"): "one Gluon kernel",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """glyd modules that ``name`` imports; ``from a import b`` counts ``a.b`` when it is a module."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            found = subs + ([base] if len(subs) < len(node.names) else [])
        for f in found:
            while f not in mods and "." in f:
                f = f.rsplit(".", 1)[0]
            if f in mods and f != name and f.startswith("glyd"):
                out.add(f)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "glyd"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_every_part_has_a_rule(graph):
    assert {_part(m) for m in graph} <= set(ALLOWED), "a new top-level part of glyd needs a line in ALLOWED"


def test_layers(graph):
    bad = []
    for mod, deps in graph.items():
        me = _part(mod)
        for d in deps:
            other = _part(d)
            if other != me and other not in BASE and other not in ALLOWED[me]:
                bad.append(f"{mod} imports {d}")
    assert bad == []


def test_file_sizes():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_function_sizes():
    long = {}
    for p in PKG.rglob("*.py"):
        rel = str(p.relative_to(PKG))
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (rel, node.name) not in LONG_FUNCTIONS:
                    long[f"{rel}:{node.name}"] = n
    assert long == {}
    for rel, _ in LONG_FUNCTIONS:  # an exception for a file that is gone is stale
        assert (PKG / rel).is_file(), rel


def test_test_modules_have_unique_names():
    # pytest imports a test file outside a package by its bare name: two test_cli.py stop collection
    tests = Path(__file__).resolve().parent
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue
        assert path.name not in seen, f"{path} and {seen[path.name]} share a module name"
        seen[path.name] = path
