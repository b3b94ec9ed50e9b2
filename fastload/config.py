"""Settings that come from outside the code: size strings and the environment (read here only)."""

from __future__ import annotations

import math
import os
import re

MAX_PIXELS = 178_956_970
"""Images over this many pixels are refused, at pack and at read, before a pixel is decoded
(decompression bombs): Pillow's own error threshold (twice its warning one)."""

MAX_FILE_SIZE = "1GB"
"""Source files larger than this are refused by ``fastload pack`` before a byte is read."""

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: str | int, *, name: str = "size") -> int:
    """Bytes from ``"256MB"``, ``"1.5GiB"``, ``"64k"`` or a plain integer (decimal units, ``iB`` binary)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size like '256MB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{name}: must be positive, got {value}")
        return value
    match = _SIZE.match(str(value))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{name}: cannot read {value!r} as a size; write it like '256MB', '1GiB' or '65536'"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{name}: must be positive, got {value!r}")
    return size


def format_size(num_bytes: float) -> str:
    """Human-readable decimal size: ``1.23 GB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.2f} {unit}"
        num_bytes /= 1000
    raise AssertionError("unreachable")


def env_int(name: str) -> int | None:
    """An integer override from the environment (``FASTLOAD_*``), or None when unset."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


REQUEST_TIMEOUT = 60.0
"""Seconds an object-store GET may wait for its answer to begin; its whole body then has these plus
``REQUEST_SECONDS_PER_MB`` per MB it holds. Past that a stalled, slow-dripping or short (lying
Content-Length) response is abandoned and retried like a timeout (``FASTLOAD_REQUEST_TIMEOUT``
overrides the 60)."""

REQUEST_SECONDS_PER_MB = 4.0
"""A GET's deadline grows by this per MB of body: a floor of 250 KB/s for each of the many requests
in flight (a 100 KB record gets 60.4 s, a 16 MiB coalesced span 127 s)."""


def request_timeout() -> float:
    """The base of every GET's deadline: ``FASTLOAD_REQUEST_TIMEOUT`` seconds, else REQUEST_TIMEOUT."""
    raw = os.environ.get("FASTLOAD_REQUEST_TIMEOUT", "").strip()
    if not raw:
        return REQUEST_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"environment variable FASTLOAD_REQUEST_TIMEOUT={raw!r}: give a number of "
                         "seconds above 0, like 60")
    return seconds


def request_deadline(num_bytes: int) -> float:
    """Seconds a GET whose body holds ``num_bytes`` may take in all."""
    return request_timeout() + REQUEST_SECONDS_PER_MB * max(num_bytes, 0) / 1e6


def region_decode_wanted() -> bool:
    """False when ``FASTLOAD_JPEG_DECODER=pillow`` asks for Pillow's whole-image JPEG decode
    instead of the native region decoder (an escape hatch; the default is ``region``)."""
    raw = os.environ.get("FASTLOAD_JPEG_DECODER", "").strip().lower()
    if raw in ("", "region"):
        return True
    if raw == "pillow":
        return False
    raise ValueError(f"environment variable FASTLOAD_JPEG_DECODER={raw!r}: use 'region' or 'pillow'")


def ray_address() -> str | None:
    """``RAY_ADDRESS`` (Ray's own variable: the cluster to join, ``host:6379`` or ``auto``), or None."""
    return os.environ.get("RAY_ADDRESS", "").strip() or None


def available_cpus() -> int:
    """Cores this process may run on (affinity and ``FASTLOAD_CPUS`` respected)."""
    override = env_int("FASTLOAD_CPUS")
    if override is not None:
        return max(1, override)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


CACHE_LIMIT = "50GB"
"""Default bound of the node cache of remote datasets' bytes (``cache_limit=``, ``--cache-limit``)."""


def cache_dir(given: str | os.PathLike[str] | None) -> str:
    """The node cache folder: ``given``, else ``FASTLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastload``
    (``~/.cache/fastload``). One folder per node, shared by every process and rank on it."""
    if given is not None:
        return os.path.abspath(os.fspath(given))
    env = os.environ.get("FASTLOAD_CACHE_DIR", "").strip()
    if env:
        return os.path.abspath(env)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


PIXEL_CACHE_LIMIT = "200GB"
"""Default bound of the pixel cache (``pixel_cache_limit=``): every dataset's decoded pixels on
this node together. ImageNet-1k's train set at the default 256 px takes ~330 GB; what does not fit
decodes as without a cache."""


def pixel_cache_dir(given: str | os.PathLike[str] | bool | None) -> str:
    """The pixel cache folder: ``given`` (a path), else ``FASTLOAD_PIXEL_CACHE_DIR``, else
    ``pixels`` in the node cache folder (see :func:`cache_dir`). One folder per node."""
    if given is not None and not isinstance(given, bool):
        return os.path.abspath(os.fspath(given))
    env = os.environ.get("FASTLOAD_PIXEL_CACHE_DIR", "").strip()
    return os.path.abspath(env) if env else os.path.join(cache_dir(None), "pixels")
