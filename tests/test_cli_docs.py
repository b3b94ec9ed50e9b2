"""docs/cli.md and docs/benchmarks.md describe every option each command has, and no other, with
the defaults the parser has: the tables are checked against ``fastload --help``'s own parser."""

from __future__ import annotations

import argparse
import re

import pytest

from fastload.cli.parser import build_parser
from tests.conftest import REPO

CLI, BENCHMARKS = (REPO / "docs" / "cli.md").read_text(), (REPO / "docs" / "benchmarks.md").read_text()
# where each command's options are written: tables (by their header line) or a synopsis line
TABLES = {"pack": [(CLI, "| option | meaning |")],
          "bench": [(BENCHMARKS, "| option (bench and doctor) |"), (BENCHMARKS, "| option (bench only) |")],
          "doctor": [(BENCHMARKS, "| option (bench and doctor) |"), (BENCHMARKS, "| option (doctor only) |")]}
SYNOPSES = {**{name: (CLI, f"`fastload {name} PATH") for name in ("info", "verify", "tune")},
            "show": (CLI, "`fastload show DATASET")}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _table_rows(text: str, header: str) -> list[str]:
    lines = text[text.index(header):].splitlines()[2:]
    return [line.split("|")[1] for line in lines[:next(i for i, l in enumerate(lines + [""]) if not l.startswith("|"))]]


def _documented(name: str) -> list[tuple[list[str], str]]:
    """(options, text) of each row (or the synopsis' bracketed parts) that documents ``name``'s options."""
    if name in SYNOPSES:
        text, start = SYNOPSES[name]
        line = text[text.index(start):].split("`")[1]
        return [(re.findall(r"--[a-z][a-z-]*", part), part) for part in re.findall(r"\[([^\]]+)\]", line)]
    rows = []
    for text, header in TABLES[name]:
        for row in _table_rows(text, header):
            rows.append((re.findall(r"--[a-z][a-z-]*", row), row + _meaning(text, row)))
    return rows


def _meaning(text: str, first_cell: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(f"|{first_cell}|"))
    return line.split("|")[2]


@pytest.mark.parametrize("name", ["pack", "info", "show", "verify", "tune", "bench", "doctor"])
def test_every_option_is_documented_with_its_default(name):
    parser = _parsers()[name]
    actions = {s: a for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    rows = _documented(name)
    documented = {option for options, _ in rows for option in options}
    assert documented == set(actions), (f"{name}: undocumented {sorted(set(actions) - documented)}, "
                                        f"not an option {sorted(documented - set(actions))}")
    for options, text in rows:
        if len(set(options)) != 1:
            continue
        default = actions[options[0]].default
        written = re.search(r"\(default `([^`]+)`\)", text) or re.search(rf"{options[0]} (\d+)\b", text)
        if written:
            assert written.group(1) == str(default).removesuffix(".0"), f"{name} {options[0]}: docs say " \
                f"{written.group(1)}, the parser {default}"
