"""Where a dataset's bytes live: local files, object stores, and the node cache between them."""

from __future__ import annotations

import os
from typing import Any, Literal

from fastload.config import cache_dir as resolve_cache_dir
from fastload.config import parse_size


def node_cache(directory: str | os.PathLike[str] | None, limit: int | str,
               policy: Literal["keep", "lru"] = "keep") -> Any:
    """The node cache for remote datasets' bytes (a ``NodeCache``), or None when ``limit`` is 0."""
    if policy not in ("keep", "lru"):
        raise ValueError(f"cache_policy={policy!r}: must be 'keep' or 'lru'")
    if limit in (0, "0"):
        return None
    from fastload.storage.cache import NodeCache

    return NodeCache(resolve_cache_dir(directory), parse_size(limit, name="cache_limit"), policy)
