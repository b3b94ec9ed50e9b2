"""The reference docs (mkdocs.yml + docs/) build with warnings as errors, with mkdocs alone, and
the API page is plain Markdown made from the docstrings in fastload/ and converters/ by
docs/gen_api.py: what is checked in is what the script writes from today's docstrings."""

from __future__ import annotations

import ast
import difflib
import functools
import html
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, parse_python

DOCS = REPO / "docs"


def _need(module: str) -> None:
    # In the dev extra: without it these tests fail (a missing tool is not a pass).
    assert importlib.util.find_spec(module) is not None, (
        f"{module} is not installed; it is a dev dependency: pip install -e '.[dev]' "
        "(or the docs tools alone: pip install --group docs)")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    _need("mkdocs")
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
    (copy / "docs" / "stray.md").write_text("# Stray\n\nA page nobody linked.\n")
    built = _mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "stray.md" in built.stdout + built.stderr


@functools.cache
def _generator():
    _need("griffe")
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_page_is_what_gen_api_writes_from_the_docstrings():
    gen_api, page = _generator(), (DOCS / "python-api.md").read_text()
    fresh = gen_api.generate(page)
    stale = list(difflib.unified_diff(page.splitlines(), fresh.splitlines(), "checked in", "from the docstrings",
                                      lineterm="", n=1))
    assert not stale, (f"docs/python-api.md is not what the docstrings give: run `{gen_api.COMMAND}` "
                       "and commit the page:\n" + "\n".join(stale[:40]))
    blocks = re.findall(r"^<!-- api (.*?) -->$", page, re.MULTILINE)
    assert len(blocks) >= 15 and len(re.findall(r"^<!-- /api -->$", page, re.MULTILINE)) == len(blocks)


def test_gen_api_renders_a_changed_docstring_and_refuses_an_unknown_option(tmp_path):
    gen_api = _generator()
    page = "# P\n\n<!-- api fastload.tune = fastload.loading.tuner.tune -->\nold text\n<!-- /api -->\nafter\n"
    out = gen_api.generate(page)
    summary = ast.get_docstring(next(node for node in parse_python(REPO / "fastload/loading/tuner.py").body
                                     if isinstance(node, ast.FunctionDef) and node.name == "tune"))
    assert "old text" not in out and out.endswith("<!-- /api -->\nafter\n")
    assert "#### `fastload.tune`\n\n```text\nfastload.tune(" in out
    assert " ".join(summary.split("\n\n")[0].replace("``", "`").split()) in " ".join(out.split())
    with pytest.raises(ValueError, match=r"unknown options \['member'\]; use members: or inherited:"):
        gen_api.generate(page.replace("tuner.tune -->", "tuner.tune; member: x -->"))


def test_no_page_keeps_a_mkdocstrings_directive_and_the_site_needs_mkdocs_alone():
    """A `::: path` line is raw text on the repository's web page; the site's only plugin is
    mkdocs's own search, so the `docs` tools (the extra, and the dependency group that installs
    them without fastload) build it."""
    import configparser
    import tomllib

    import yaml  # installed with mkdocs

    raw = [f"{page.name}:{k}" for page in DOCS.glob("*.md")
           for k, line in enumerate(page.read_text().splitlines(), 1) if line.startswith(":::")]
    assert not raw, f"mkdocstrings directives left in the docs: {raw}"
    assert yaml.safe_load((REPO / "mkdocs.yml").read_text())["plugins"] == ["search"]
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    extra = config["options.extras_require"]["docs"].split()
    group = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]["docs"]
    assert extra == group and any(r.startswith("mkdocs") for r in group)
    dev = config["options.extras_require"]["dev"].split()
    assert set(group) <= set(dev)
