"""JSON from a source (a list's rows and cells, a sidecar, a tar's ``.json`` member, a save_to_disk
``state.json``) parsed with its nesting bounded, so a hostile file is a clear error, never a
RecursionError.

``json.loads`` recurses once per level: 100,000 nested brackets raise RecursionError, and a value
just under Python's limit would make every walk over it after (typing a field, building its array)
recurse as deep. No field, label or state file is nested more than a few levels, so MAX_DEPTH is
refused before parsing; the depth is counted at C speed (strings removed by a regex, the brackets'
running sum by NumPy), and only in text that holds enough brackets to reach it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a source's JSON."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN, _CLOSE = np.zeros(256, np.int8), np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_CLOSE[[ord("]"), ord("}")]] = 1


class BadJson(ValueError):
    """The text is not JSON, or is nested deeper than MAX_DEPTH; the message says which, and where."""


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)`` with its nesting bounded; BadJson saying what is wrong."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise BadJson(f"not UTF-8 text (byte {exc.start})") from None
    depth = nesting(text)
    if depth > MAX_DEPTH:
        raise BadJson(f"nested {depth} levels deep, over the {MAX_DEPTH} accepted (not parsed); flatten it")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadJson(f"not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except ValueError as exc:  # a number of more digits than int() parses
        raise BadJson(f"not valid JSON ({exc})") from None
    except RecursionError:  # unreachable under MAX_DEPTH; kept so no source's JSON ever escapes as one
        raise BadJson(f"nested too deep to parse (over {MAX_DEPTH} levels); flatten it") from None


def nesting(text: str) -> int:
    """How deep ``text``'s arrays and objects nest, brackets inside strings not counted; in text of
    at most MAX_DEPTH opening brackets, their count (which it cannot nest deeper than)."""
    opening = text.count("[") + text.count("{")
    if opening <= MAX_DEPTH:
        return opening
    bare = np.frombuffer(_STRING.sub("", text).encode("utf-8", "surrogatepass"), np.uint8)
    steps = _OPEN[bare].astype(np.int64) - _CLOSE[bare]
    return int(steps.cumsum().max(initial=0))
