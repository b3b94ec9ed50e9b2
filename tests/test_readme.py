"""The README stays a short front page whose links lead somewhere, and the Guarantees page
(docs/guarantees.md) names the tests that check each promise: every one it names exists.

(A renamed test once left a guarantee pointing at nothing.)
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, many_small_jpegs, parse_python

GUARANTEES = REPO / "docs" / "guarantees.md"

# `reliability/test_skip.py::test_name` or `loader/test_errors.py`, paths under tests/
_NAMED = re.compile(r"`((?:[a-z_]+/)*test_[a-z0-9_]+\.py)(?:::([A-Za-z0-9_]+))?")
# [text](target) with a relative target: a file in this repository, maybe with an #anchor
_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s#]+)(?:#[^)\s]*)?\)")


def _defined_names(path) -> set[str]:
    tree = parse_python(path)
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
    named = set(re.findall(r"`make ([a-z-]+)`|^make ([a-z-]+)", text, re.MULTILINE))
    targets = {a or b for a, b in named}
    assert {"demo", "test", "test-quick", "test-all"} <= targets
    for target in targets:
        assert re.search(rf"^{target}:", (REPO / "Makefile").read_text(), re.MULTILINE), \
            f"README names `make {target}`; the Makefile has no {target} target"
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


README_MAX_LINES = 150  # a front page: the rest lives in docs/


def test_the_readme_stays_a_short_front_page():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail to docs/"


def test_the_readme_lists_every_subcommand_the_cli_has():
    import argparse

    from fastload.cli.parser import build_parser

    parsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = (REPO / "README.md").read_text()
    bullet = re.search(r"^- \[CLI reference\].*?(?=^- |\Z)", text, re.MULTILINE | re.DOTALL).group(0)
    listed = re.findall(r"`(?:fastload )?([a-z]+)`", bullet)
    assert sorted(listed) == sorted(parsers.choices), (
        f"README's CLI list names {listed}; `fastload --help` has {list(parsers.choices)}")


def _demo_commands() -> tuple[list[str], str]:
    """The fastload subcommands `make demo` runs, in order, and the number of images it makes."""
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^demo: .*?\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    return re.findall(r"/fastload ([a-z]+)", recipe), re.search(r"--count (\d+)", recipe).group(1)


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_what_the_page_says_make_demo_does_is_what_the_makefile_runs(page):
    commands, count = _demo_commands()
    assert commands[:2] == ["pack", "info"]  # the recipe still reads as this test expects
    said = re.search(r"^make demo +#(.*)$", (REPO / page).read_text(), re.MULTILINE).group(1)
    named = re.findall(r"\b(pack|info|show|verify|tune|bench|doctor)\b", said)
    assert named == commands, f"{page} says `make demo` runs {named}; the Makefile's demo target runs {commands}"
    assert f"{count}-image" in said, f"{page}: {said!r}; the demo makes {count} images"


def test_make_demo_installs_only_what_the_demo_runs():
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo: (.*)$", makefile, re.MULTILINE).group(1)
    assert demo.strip() == "$(VENV)/.installed-plot"  # not the dev extra and its DALI/CUDA wheels
    assert re.search(r"^test: \$\(VENV\)/\.installed-dev$", makefile, re.MULTILINE)


# --- from set-up to the quick start in a new shell (issue 39: `fastload: command not found`) ------

FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"  # a new login shell's: no venv on it


def _section_commands(text: str, heading: str) -> list[str]:
    """The command lines of the first ```sh block under ``## heading``, as a reader pastes them."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture
def clone(tmp_path):
    """A folder standing for the clone after `make demo`: .venv (the running venv) and demo/images."""
    from fastload.converters import pack

    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"the tests run outside a venv ({venv}): nothing to activate")
    (tmp_path / ".venv").symlink_to(venv)
    many_small_jpegs(tmp_path / "demo" / "images", 24, classes=2)
    pack(tmp_path / "demo" / "images", tmp_path / "demo" / "images.fl", progress=False)
    return tmp_path


def _fresh_shell(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in a new non-login bash: the PATH a fresh terminal has, no venv active."""
    env = {"PATH": FRESH_PATH, "HOME": str(cwd), "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_readme_set_up_then_quick_start_work_in_a_fresh_shell(clone):
    assert _fresh_shell("command -v fastload", clone).returncode != 0  # the shell really is fresh
    text = (REPO / "README.md").read_text()
    setup, quick = _section_commands(text, "Set up"), _section_commands(text, "Quick start")
    assert [line.split("#")[0].strip() for line in setup] == ["make demo", "make test"]
    # `make demo` made .venv and demo/ (the fixture's stand-ins); the quick start runs as pasted
    done = _fresh_shell("set -e\n" + "\n".join(quick), clone)
    assert done.returncode == 0, f"the README's quick start in a new shell:\n{quick}\n{done.stdout}\n{done.stderr}"
    assert (clone / "images.fl" / "manifest.json").is_file()


def test_make_demo_ends_with_next_commands_that_work_as_printed(clone):
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo: .*?\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert demo.rstrip().splitlines()[-1].strip() == "@$(MAKE) --no-print-directory demo-next"
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    # run where the clone stands: the printed lines start with `cd` to make's own folder
    shown = subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "demo-next"], cwd=clone,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    commands = [line.strip() for line in shown.splitlines() if line.startswith("  ")]
    assert commands[:2] == [f"cd {clone}", ". .venv/bin/activate"] and len(commands) >= 4, shown
    bare = re.search(r"without activating: (\.venv/bin/fastload .*)$", shown, re.MULTILINE).group(1)
    for script in ("set -e\n" + "\n".join(commands), bare):
        done = _fresh_shell(script, clone)
        assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    assert (clone / "images.fl" / "manifest.json").is_file()
