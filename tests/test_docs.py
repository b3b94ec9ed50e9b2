"""The reference docs (mkdocs.yml + docs/) build with warnings as errors, and the API page is
made from the docstrings in fastload/ and converters/."""

from __future__ import annotations

import ast
import html
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, parse_python

DOCS = REPO / "docs"


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # mkdocs is in the dev extra: without it this test fails (a missing tool is not a pass).
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        assert importlib.util.find_spec(module) is not None, (
            f"{module} is not installed; it is a dev dependency: pip install -e '.[dev]'")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        check=False, cwd=config.parent, capture_output=True, text=True, timeout=120)


def _nav_pages(config: Path) -> set[str]:
    import yaml  # installed with mkdocs

    def walk(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [page for value in node.values() for page in walk(value)]
        return [page for item in node for page in walk(item)]

    return set(walk(yaml.safe_load(config.read_text())["nav"]))


def _text(page: Path) -> str:
    """A built page as plain text, whitespace collapsed (block tags are on lines of their own)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.read_text())).split())


def _class_docs(path: Path, name: str) -> tuple[str, list[str]]:
    """A class's docstring summary (markup removed) and its __init__ parameter names, read from
    the source, so the check follows the docstring when it changes."""
    tree = parse_python(path)
    cls = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name)
    summary = ast.get_docstring(cls).split("\n\n")[0]
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    params = [arg.arg for arg in init.args.args + init.args.kwonlyargs if arg.arg != "self"]
    return " ".join(summary.replace("`", "").split()), params


def test_the_docs_build_strict_with_every_page_in_the_nav_and_the_api_from_docstrings(tmp_path):
    site = tmp_path / "site"
    built = _mkdocs_build(REPO / "mkdocs.yml", site)
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"

    pages = {p.name for p in DOCS.glob("*.md")}
    nav = _nav_pages(REPO / "mkdocs.yml")
    assert pages == nav, f"pages not in mkdocs.yml's nav: {pages - nav}; nav without a page: {nav - pages}"
    for name in pages:
        out = site / "index.html" if name == "index.md" else site / name.removesuffix(".md") / "index.html"
        assert out.is_file(), f"{name} was not built"

    api = _text(site / "python-api" / "index.html")
    for path, name in (("fastload/loading/loader.py", "DataLoader"), ("fastload/dataset.py", "PackedDataset")):
        summary, params = _class_docs(REPO / path, name)
        assert f"fastload.{name}" in api
        assert summary in api, f"the API page lacks {name}'s docstring: {summary!r}"
        # The signature block under the heading (the overview's `DataLoader(...)` does not match).
        start = re.search(rf"\b{name}\(\s*\w+:", api).start()
        signature = api[start:api.index("Bases:", start)]
        missing = [p for p in params if not re.search(rf"\b{p}:", signature)]
        assert not missing, f"{name}'s rendered signature lacks {missing}"


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    # The strict build really treats warnings as errors, with the validation mkdocs.yml asks for.
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy)
    for package in ("fastload", "converters"):
        (copy / package).symlink_to(REPO / package)
    (copy / "docs" / "stray.md").write_text("# Stray\n\nA page nobody linked.\n")
    built = _mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "stray.md" in built.stdout + built.stderr
