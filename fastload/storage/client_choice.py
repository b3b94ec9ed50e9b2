"""Which object-store client a process uses: ``choice``, else FASTLOAD_STORE_CLIENT, else the default.

The default, for s3:// (and s3a://), is obstore (leaner: bench/client_bench.py) where it is
installed, takes the storage_options given, and this process was not forked from one that used it
(its runtime does not survive a fork); fsspec everywhere else, and for every scheme obstore does not
serve. A client asked for by name that cannot serve is an error, except in a forked process, which
reads through fsspec with a warning. ``FASTLOAD_STORE_CLIENT=fsspec`` is the way back to s3fs."""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from typing import Any

from fastload.errors import MissingDependencyError
from fastload.storage.client import CLIENT_NAMES, ClientName, StoreClient

DEFAULT_CLIENT = "obstore"
"""The default for the schemes obstore serves (OBSTORE_SCHEMES) where it can; fsspec where it cannot."""

OBSTORE_SCHEMES = ("s3", "s3a")
"""The schemes read through obstore (its GCS, Azure and HTTP stores take other options than gcsfs's,
adlfs's and fsspec's http, which fastload's storage_options name)."""


def make_client(url: str, scheme: str, options: dict[str, Any], max_in_flight: int,
                choice: ClientName | None = None) -> StoreClient:
    """This process's client for the folder ``url``: ``choice``, else FASTLOAD_STORE_CLIENT, else the default."""
    named = choice or _from_environment()
    wanted = named or DEFAULT_CLIENT
    if wanted not in CLIENT_NAMES:
        raise ValueError(f"{url}: store client {wanted!r} is unknown; use one of {', '.join(CLIENT_NAMES)}")
    if wanted == "obstore" and scheme in OBSTORE_SCHEMES:  # other schemes: fsspec is the only client
        reason = _why_not_obstore(options)
        if reason is None:
            from fastload.storage.client_obstore import ObstoreClient

            return ObstoreClient(url, options, max_in_flight)
        if named and "fork" not in reason:  # the default where obstore cannot serve is fsspec, as it was
            error = MissingDependencyError if "pip install" in reason else ValueError
            raise error(f"{url}: the obstore client was asked for (FASTLOAD_STORE_CLIENT or client=) but {reason}; "
                        "use FASTLOAD_STORE_CLIENT=fsspec")
        if named:
            _warn_once(f"{url}: this process was forked from one that used obstore, whose runtime does not "
                       "survive a fork, so it reads through fsspec (s3fs); start DataLoader workers with "
                       "multiprocessing_context='forkserver' (or 'spawn') to keep obstore in them")
    from fastload.storage.client_fsspec import FsspecClient

    return FsspecClient(url, scheme, options, max_in_flight)


def _from_environment() -> str:
    """The client FASTLOAD_STORE_CLIENT names ("" when it is not set)."""
    return os.environ.get("FASTLOAD_STORE_CLIENT", "").strip().lower()


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
