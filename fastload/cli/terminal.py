"""The ``fastload`` command's words on a terminal: manifest values as text, counts in words."""

from __future__ import annotations

from typing import Any


def free_text(value: Any, default: str = "?") -> str:
    """A free-form manifest value as text: any JSON value prints, none crashes."""
    if value is None or value == "":
        return default
    return value if isinstance(value, str) else str(value)


def plural(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``, ``3 classes``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"
