"""The ``fastload`` command's words on a terminal: untrusted text made harmless to print, counts in words.

A dataset is data from anywhere: its keys, class names, field names and recorded pack arguments
may hold terminal escapes (``\\x1b[2J`` clears the screen, ``\\x1b]8;;`` forges a link) or line
breaks that forge lines of output. ``shown`` is the one way ``info``, ``show`` and ``verify`` print
such text: every character a terminal would act on or hide is written as its Python escape.
"""

from __future__ import annotations

from typing import Any


def shown(text: object) -> str:
    """``text`` as a terminal may print it: control and format characters, line and paragraph
    separators (anything ``str.isprintable`` refuses) escaped as ``\\x1b``, ``\\n``, ``\\u202e``;
    a byte a file name could not decode (a surrogate escape) as ``\\xff``."""
    value = text if isinstance(text, str) else str(text)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in value)


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte: the byte
        return f"\\x{code - 0xDC00:02x}"
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch)
    return named or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def free_text(value: Any, default: str = "?") -> str:
    """A free-form manifest value as printable text: any JSON value prints, none crashes, none escapes."""
    if value is None or value == "":
        return default
    return shown(value)


def plural(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``, ``3 classes``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"
