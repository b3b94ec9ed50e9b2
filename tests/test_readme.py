"""The README's Guarantees name the tests that check them: every one it names exists.

(A renamed test once left a guarantee pointing at nothing.)
"""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

# `reliability/test_skip.py::test_name` or `loader/test_errors.py`, paths under tests/
_NAMED = re.compile(r"`((?:[a-z_]+/)*test_[a-z0-9_]+\.py)(?:::([A-Za-z0-9_]+))?")


def _guarantees() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("\n## Guarantees")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _defined_names(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def test_every_test_the_guarantees_name_exists():
    named = _NAMED.findall(_guarantees())
    assert len(named) >= 10  # the pattern still matches how the section writes them
    missing = []
    for rel, name in named:
        path = REPO / "tests" / rel
        if not path.is_file():
            missing.append(rel)
        elif name and name not in _defined_names(path):
            missing.append(f"{rel}::{name}")
    assert not missing, f"README Guarantees name tests that do not exist: {missing}"
