"""The README stays a short front page whose links lead somewhere, and the Guarantees page
(docs/guarantees.md) names the tests that check each promise: every one it names exists.

(A renamed test once left a guarantee pointing at nothing.)
"""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

GUARANTEES = REPO / "docs" / "guarantees.md"

# `reliability/test_skip.py::test_name` or `loader/test_errors.py`, paths under tests/
_NAMED = re.compile(r"`((?:[a-z_]+/)*test_[a-z0-9_]+\.py)(?:::([A-Za-z0-9_]+))?")
# [text](target) with a relative target: a file in this repository, maybe with an #anchor
_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s#]+)(?:#[^)\s]*)?\)")


def _defined_names(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def test_every_test_the_guarantees_name_exists():
    named = _NAMED.findall(GUARANTEES.read_text())
    assert len(named) >= 10  # the pattern still matches how the page writes them
    missing = []
    for rel, name in named:
        path = REPO / "tests" / rel
        if not path.is_file():
            missing.append(rel)
        elif name and name not in _defined_names(path):
            missing.append(f"{rel}::{name}")
    assert not missing, f"docs/guarantees.md names tests that do not exist: {missing}"


def test_the_readme_keeps_the_set_up_commands_and_its_links_lead_to_files():
    text = (REPO / "README.md").read_text()
    for command in ("make demo", "make test"):
        assert command in text
        target = command.split()[1]
        assert re.search(rf"^{target}:", (REPO / "Makefile").read_text(), re.MULTILINE), \
            f"README names `{command}`; the Makefile has no {target} target"
    links = _LINK.findall(text)
    assert any(link.startswith("docs/") for link in links)
    broken = [link for link in links if not (REPO / link).exists()]
    assert not broken, f"README links to files that do not exist: {broken}"


def test_no_install_line_installs_the_unrelated_pypi_fastload():
    """``pip install fastload`` / ``'fastload[x]'`` would install a file downloader of that name."""
    from fastload.optional import DISTRIBUTION

    wrong = re.compile(r"pip install\s+['\"]?fastload(?:\[|['\"\s]|$)", re.MULTILINE)
    files = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "fastload").rglob("*.py")), *sorted((REPO / "converters").rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}: {m.group(0)!r}" for path in files for m in wrong.finditer(path.read_text())]
    assert not found, found
    assert re.search(rf"^name = {re.escape(DISTRIBUTION)}$", (REPO / "setup.cfg").read_text(), re.MULTILINE)


def test_make_demo_installs_only_what_the_demo_runs():
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo: (.*)$", makefile, re.MULTILINE).group(1)
    assert demo.strip() == "$(VENV)/.installed-plot"  # not the dev extra and its DALI/CUDA wheels
    assert re.search(r"^test: \$\(VENV\)/\.installed-dev$", makefile, re.MULTILINE)
