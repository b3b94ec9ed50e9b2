"""The house stays without import circles: no module of fastload/ or converters/ imports, through
any chain of its own ``import`` statements (function-level and TYPE_CHECKING ones included), a
module that imports it back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, parse_python

PACKAGES = ("fastload", "converters")


def _modules() -> dict[str, Path]:
    """Every module by the name it is imported as (converters/ is installed as fastload.converters)."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            parts = ("fastload", *parts) if package == "converters" else parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, by every import statement in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(parse_python(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 50 and graph["fastload.loading.loader"] and graph["fastload.converters.packing.loop"]  # found the tree
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_is_installed_and_under_the_fastload_name():
    """setup.cfg lists every package of the tree (converters/ as fastload.converters), and no code
    imports a top-level ``converters``: installed, it would not exist."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    found = {".".join(("fastload", *p.parent.relative_to(REPO).parts)) if p.parts[len(REPO.parts)] == "converters"
             else ".".join(p.parent.relative_to(REPO).parts)
             for package in PACKAGES for p in (REPO / package).rglob("__init__.py")}
    assert listed == found
    assert config["options"]["package_dir"].split() == ["fastload.converters", "=", "converters"]
    modules = _modules()
    top_level = [f"{name}: {path}" for name, path in modules.items()
                 for node in ast.walk(parse_python(path))
                 if isinstance(node, (ast.Import, ast.ImportFrom))
                 and any((getattr(node, "module", None) or alias.name).split(".")[0] == "converters"
                         for alias in node.names)]
    assert not top_level, top_level


def test_import_fastload_and_the_pack_api_load_no_heavy_dependency():
    """`import fastload`, the pack API and the CLI's module load neither torch nor an optional
    extra: a pack needs none of them (torch alone is ~200 MB of memory and 0.7 s of start-up)."""
    code = ("import sys; import fastload; from fastload.converters import Writer, pack; import fastload.cli; "
            "print(sorted(m for m in ('torch', 'pyarrow', 'datasets', 'ray', 'nvidia', 'matplotlib', 's3fs') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
