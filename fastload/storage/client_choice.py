"""Which object-store client a process uses: ``choice``, else FASTLOAD_STORE_CLIENT, else fsspec.

obstore (measured leaner: bench/client_bench.py) is not the default yet: its tokio runtime does not
survive a fork (a DataLoader worker forked after the parent read the store would hang; such a
process reads through fsspec here), and with obstore as the default, tests/remote/test_remote_dataset.py's
reads through reset and truncated responses hung a GET to its 60 s request timeout ("error sending
request"; the cause not found yet), where the fsspec client passes. (Its asyncio bindings also aborted
a process at exit, 2 exits in 100; fastload now uses its blocking calls: 0 in 500.)"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from typing import Any

from fastload.errors import MissingDependencyError
from fastload.storage.client import CLIENT_NAMES, ClientName, StoreClient

DEFAULT_CLIENT = "fsspec"

OBSTORE_SCHEMES = ("s3", "s3a")
"""The schemes read through obstore (its GCS, Azure and HTTP stores take other options than gcsfs's,
adlfs's and fsspec's http, which fastload's storage_options name)."""


def make_client(url: str, scheme: str, options: dict[str, Any], max_in_flight: int,
                choice: ClientName | None = None) -> StoreClient:
    """This process's client for the folder ``url``: ``choice`` or else FASTLOAD_STORE_CLIENT."""
    wanted = choice or _from_environment()
    if wanted not in CLIENT_NAMES:
        raise ValueError(f"{url}: store client {wanted!r} is unknown; use one of {', '.join(CLIENT_NAMES)}")
    if wanted == "obstore" and scheme in OBSTORE_SCHEMES:  # other schemes: fsspec is the only client
        reason = _why_not_obstore(options)
        if reason is None:
            from fastload.storage.client_obstore import ObstoreClient

            return ObstoreClient(url, options, max_in_flight)
        if "fork" not in reason:
            error = MissingDependencyError if "pip install" in reason else ValueError
            raise error(f"{url}: the obstore client was asked for (FASTLOAD_STORE_CLIENT or client=) but {reason}; "
                        "use FASTLOAD_STORE_CLIENT=fsspec")
        _warn_once(f"{url}: this process was forked from one that used obstore, whose runtime does not "
                   "survive a fork, so it reads through fsspec (s3fs); start DataLoader workers with "
                   "multiprocessing_context='forkserver' (or 'spawn') to keep obstore in them")
    from fastload.storage.client_fsspec import FsspecClient

    return FsspecClient(url, scheme, options, max_in_flight)


def _from_environment() -> str:
    return os.environ.get("FASTLOAD_STORE_CLIENT", "").strip().lower() or DEFAULT_CLIENT


def _why_not_obstore(options: dict[str, Any]) -> str | None:
    """None when obstore can serve this store in this process, else the reason it cannot."""
    if importlib.util.find_spec("obstore") is None:
        from fastload.optional import extra_hint

        return f"the obstore package is not installed; pip install obstore (or {extra_hint('remote')})"
    from fastload.storage.obstore_config import untranslated

    unknown = untranslated(options)
    if unknown:
        return f"storage_options {', '.join(sorted(unknown))} are s3fs's own, with no obstore equivalent"
    runtime = sys.modules.get("fastload.storage.client_obstore")
    if runtime is not None and runtime.runtime_inherited():  # type: ignore[attr-defined]
        return "this process was forked after obstore's runtime started in its parent"
    return None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    key = message.split(":", 1)[1]
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)
