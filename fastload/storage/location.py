"""Where a dataset or a source lives: a local path, or a URL fsspec opens (s3://, gs://, az://, ...)."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

# Schemes fastload hands to fsspec. ``file://`` is a local path; http(s) is read-only.
REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "http", "https")
# the package that brings each scheme's fsspec filesystem, named in "install ..." errors
SCHEME_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
                   "abfs": "adlfs", "abfss": "adlfs", "http": "aiohttp", "https": "aiohttp"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme_of(location: str | os.PathLike[str]) -> str:
    """``"s3"`` for ``s3://bucket/x``, ``""`` for a plain path (``C:\\x`` is not a scheme)."""
    match = _URL.match(os.fspath(location)) if isinstance(location, str) else None
    return match.group(1).lower() if match else ""


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for a URL of an object store or web server, False for a local path or ``file://``."""
    scheme = scheme_of(location)
    if scheme and scheme != "file" and scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{location}: unknown URL scheme {scheme!r}; fastload reads local paths, "
                         f"file:// and {', '.join(s + '://' for s in REMOTE_SCHEMES)}")
    return scheme in REMOTE_SCHEMES


def check_remote_url(url: str) -> str:
    """``url`` itself when it names a bucket (or host) after its scheme; ValueError otherwise."""
    parts = urlsplit(url)
    if not parts.netloc:
        scheme = scheme_of(url) or "s3"
        raise ValueError(f"{url}: names no bucket after {scheme}://; write {scheme}://BUCKET/PREFIX "
                         f"(for example {scheme}://my-bucket/images.fl)")
    return url


def local_path(location: str | os.PathLike[str]) -> str:
    """The local path of a plain path or a ``file://`` URL, absolute (a later chdir cannot move it)."""
    if scheme_of(location) == "file":
        parts = urlsplit(os.fspath(location))
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{location}: a file:// URL names a path on this machine "
                             f"(file:///path), not on host {parts.netloc!r}")
        return os.path.abspath(unquote(parts.path))
    return os.path.abspath(os.fspath(location))


def join(url: str, name: str) -> str:
    """``url/name`` for a remote URL (one slash between)."""
    return url.rstrip("/") + "/" + name


def parse_storage_options(pairs: list[str] | None) -> dict[str, object]:
    """``--storage-option KEY=VALUE`` pairs as fsspec keyword arguments.

    Values are read as JSON where they parse (``anon=true``, ``retries=3``, ``client_kwargs={...}``),
    else kept as strings (``endpoint_url=http://127.0.0.1:9000``).
    """
    import json

    options: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option {pair!r}: write it as KEY=VALUE "
                             "(for example endpoint_url=http://127.0.0.1:9000)")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options
