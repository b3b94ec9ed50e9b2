"""The obstore client's two translations: fsspec-style storage_options into an S3Store's settings,
and obstore's errors into the builtin ones fastload's retry and messages classify."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

# storage_options obstore takes (s3fs's names), and the config_kwargs/client_kwargs inside them
_TOP = {"key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "config_kwargs",
        "skip_instance_cache", "region_name"}
_CLIENT_KWARGS = {"region_name", "endpoint_url", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
_CONFIG_KWARGS = {"retries", "connect_timeout", "read_timeout", "max_pool_connections"}  # fastload's own defaults


def untranslated(options: dict[str, Any]) -> set[str]:
    """The storage_options obstore has no equivalent for (``config_kwargs.x`` for nested ones)."""
    out = {key for key in options if key not in _TOP}
    for group, known in (("client_kwargs", _CLIENT_KWARGS), ("config_kwargs", _CONFIG_KWARGS)):
        nested = options.get(group) or {}
        out |= {f"{group}.{key}" for key in nested if key not in known}
    return out


def s3_settings(url: str, options: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(bucket, prefix, keyword arguments of S3Store)`` for the folder ``url`` (``s3://bucket/prefix``)."""
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    client = options.get("client_kwargs") or {}
    config = options.get("config_kwargs") or {}
    settings: dict[str, Any] = {}
    for ours, theirs, nested in (("access_key_id", "key", "aws_access_key_id"),
                                 ("secret_access_key", "secret", "aws_secret_access_key"),
                                 ("session_token", "token", "aws_session_token"),
                                 ("region", "region_name", "region_name")):
        value = options.get(theirs) or client.get(nested)
        if value:
            settings[ours] = str(value)
    if options.get("anon"):
        settings["skip_signature"] = True
    endpoint = options.get("endpoint_url") or client.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") \
        or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        # a store of one's own (MinIO, moto, R2, ...): path-style requests, as s3fs sends them there
        settings["endpoint"] = str(endpoint).rstrip("/")
        settings["virtual_hosted_style_request"] = False
    settings["client_options"] = {
        "allow_http": bool(endpoint) and str(endpoint).startswith("http://"),
        "connect_timeout": timedelta(seconds=float(config.get("connect_timeout", 10))),
        # a whole request's bound; reads have fastload's tighter deadline (config.request_deadline)
        "timeout": timedelta(minutes=30),
        "pool_max_idle_per_host": str(int(config.get("max_pool_connections", 64))),
    }
    if config.get("read_timeout") is not None:  # botocore's meaning: the most seconds between two reads
        settings["client_options"]["read_timeout"] = timedelta(seconds=float(config["read_timeout"]))
    # fastload retries itself (bounded, with jitter, naming the object): obstore's own retries off
    settings["retry_config"] = {"max_retries": 0, "retry_timeout": timedelta(minutes=5)}
    return bucket, prefix.strip("/"), settings


_CONNECT = re.compile(r"tcp connect error|Connection refused|ConnectError|dns error", re.IGNORECASE)
_TRANSIENT = re.compile(r"status code: (5\d\d|429)|SlowDown|error sending request|error decoding response body|"
                        r"connection closed|connection reset|IncompleteMessage|timed out|operation timed out|"
                        r"unexpected EOF|broken pipe|end of file before message length|body error|HTTP error", re.IGNORECASE)


def first_line(exc: BaseException) -> str:
    """obstore's message without its debug dump (its first line), or the class's name."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def builtin_error(exc: BaseException) -> BaseException:
    """``exc`` as the builtin error fastload classifies (FileNotFoundError, PermissionError,
    FileExistsError for a failed condition, ConnectionError for what a retry may cure, else OSError),
    its message cut to obstore's first line; other exceptions as they are."""
    module = type(exc).__module__ or ""
    if not module.startswith("obstore") and not isinstance(exc, FileNotFoundError):
        return exc
    text, full, kind = first_line(exc), str(exc), type(exc).__name__
    for code in ("NoSuchBucket", "AccessDenied", "SlowDown"):  # S3's code, in the body obstore quotes
        if code in full and code not in text:
            text += f" ({code})"
    if "NoSuchBucket" in full:
        new: BaseException = FileNotFoundError(text.replace("NoSuchBucket", "NoSuchBucket: the bucket does not exist"))
    elif isinstance(exc, FileNotFoundError) or kind == "NotFoundError" or "status code: 404" in full:
        new = FileNotFoundError(text)
    elif kind in ("PermissionDeniedError", "UnauthenticatedError") or "status code: 403" in full:
        new = PermissionError(text)
    elif kind in ("AlreadyExistsError", "PreconditionError"):
        new = FileExistsError(text)
    elif _CONNECT.search(str(exc)):
        new = ConnectionRefusedError(text)
    elif _TRANSIENT.search(str(exc)):
        new = ConnectionError(text)
    else:
        new = OSError(text)
    new.__cause__ = exc
    return new
