"""Which object-store errors are worth retrying, and the bounded backoff (with jitter) that retries them."""

from __future__ import annotations

import errno
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# s3fs turns S3 error codes into OSErrors with these errnos: SlowDown / 503 / 409 (EBUSY),
# InternalError / 500 (EREMOTEIO); the rest are the socket's own.
_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EREMOTEIO, errno.EAGAIN, errno.ECONNRESET, errno.ECONNABORTED,
                     errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE, errno.ENETUNREACH, errno.EHOSTUNREACH}
# Exceptions of the clients under fsspec (aiohttp, botocore, urllib3, http.client), by class name so
# that none of those packages is imported here: a dropped connection, a body cut short, a timeout.
_TRANSIENT_NAMES = {
    "ClientPayloadError", "ServerDisconnectedError", "ClientOSError", "ClientConnectionError",
    "ServerTimeoutError", "ConnectionTimeoutError", "SocketTimeoutError", "IncompleteRead", "IncompleteReadError",
    "ResponseStreamingError", "ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError",
    "ConnectionClosedError", "HTTPClientError", "ProtocolError", "FSTimeoutError", "RemoteDisconnected",
    "ContentLengthError", "TransferEncodingError",
}
# A connection that could not be made at all: the endpoint is wrong or the store is down.
_NO_ANSWER = {"EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError", "ConnectionTimeoutError"}
_TRANSIENT_CODES = ("SlowDown", "reduce your request rate", "InternalError", "ServiceUnavailable",
                    "RequestTimeout", "Throttl")


class ShortRead(Exception):
    """A body that ended before the requested range did (a truncated response): retried."""


def is_transient(exc: BaseException) -> bool:
    """True for failures a retry can cure (timeouts, resets, 5xx, throttling, short bodies);
    False for answers a retry would only repeat (403, 404, bad credentials, a bad request)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ShortRead, TimeoutError, ConnectionError)):
        return True
    for cls in type(exc).__mro__:
        if cls.__name__ in _TRANSIENT_NAMES:
            return True
        if cls.__name__ in ("NoCredentialsError", "PartialCredentialsError", "ParamValidationError"):
            return False
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    text = str(exc)
    if any(code in text for code in _TRANSIENT_CODES):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient(cause)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter (AWS's advice: spreads the retries of many
    workers hitting the same throttled prefix). ``attempts`` counts the first try."""

    attempts: int = 6
    base: float = 0.1
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, ...)."""
        return random.uniform(0, min(self.cap, self.base * 2 ** attempt))

    def call(self, fn: Callable[[], T], what: Callable[[], str]) -> T:
        """``fn()``, retried while it fails transiently; the last failure raises RemoteReadError
        naming ``what()`` (the object and byte range), a permanent one at once."""
        result: list[T] = []

        def once(_: list[int]) -> dict[int, BaseException]:
            try:
                result.append(fn())
            except Exception as exc:  # noqa: BLE001 - classified by call_each
                return {0: exc}
            return {}

        self.call_each(once, 1, lambda _: what())
        return result[0]

    def call_each(self, try_items: Callable[[list[int]], dict[int, BaseException]], count: int,
                  what: Callable[[int], str]) -> None:
        """Items ``0..count-1`` tried together by ``try_items(pending)``, which returns the failures
        by item; the transient ones are tried again (only they), a permanent one or the last try's
        raise as ``call`` does, naming ``what(item)``."""
        pending = list(range(count))
        for attempt in range(1, self.attempts + 1):
            failures = try_items(pending)
            if not failures:
                return
            for item, exc in failures.items():
                if not is_transient(exc):
                    raise describe(exc, what(item)) from exc
                if attempt == self.attempts:
                    raise describe(exc, what(item), attempts=attempt) from exc
            pending = list(failures)
            time.sleep(self.delay(attempt))


def describe(exc: BaseException, what: str, attempts: int = 0) -> Exception:
    """The error a user sees for a failed remote call: the object and range first, then the cause."""
    from fastload.errors import BucketNotFound, RemoteAccessDenied, RemoteNotFound, RemoteReadError

    cause = f"{type(exc).__name__}: {exc}".rstrip(": ")
    url = re.search(r"\b([a-z0-9]+)://([^/\s]+)", what)
    if isinstance(exc, FileNotFoundError) and ("bucket does not exist" in str(exc) or "NoSuchBucket" in str(exc)):
        bucket = url.group(2) if url else "?"
        return BucketNotFound(f"{what}: the bucket {bucket!r} does not exist, or these credentials cannot see it "
                              f"({cause}); fastload creates no buckets: create it first (for S3: aws s3 mb "
                              f"s3://{bucket}), or check the URL and the endpoint")
    if isinstance(exc, FileNotFoundError):
        return RemoteNotFound(f"{what}: no such object ({cause}); check the URL, or re-upload the dataset")
    if isinstance(exc, PermissionError) or "AccessDenied" in str(exc) or "Forbidden" in str(exc):
        return RemoteAccessDenied(f"{what}: access denied ({cause}); check the credentials (the store's "
                                  "own environment variables or config file, or storage_options)")
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return RemoteAccessDenied(f"{what}: no credentials found ({cause}); set the store's environment "
                                  "variables (AWS_ACCESS_KEY_ID, ...) or pass storage_options / "
                                  "--storage-option key=... secret=...")
    if attempts and (isinstance(exc, ConnectionRefusedError) or type(exc).__name__ in _NO_ANSWER):
        return RemoteReadError(f"{what}: failed {attempts} times ({cause}); nothing answers at the store's "
                               "endpoint: check endpoint_url (storage_options, --storage-option endpoint_url=..., "
                               "or the AWS_ENDPOINT_URL environment variable) and that the store is running")
    if attempts:
        return RemoteReadError(f"{what}: failed {attempts} times ({cause}); the store is unreachable or "
                               "overloaded; try again later")
    return RemoteReadError(f"{what}: {cause}")


def condition_failed(exc: BaseException | None) -> bool:
    """A 412 (or a 409 of a write raced by another conditional write), under whatever wrapped it."""
    for _ in range(4):
        if exc is None:
            return False
        response = getattr(exc, "response", None) or {}
        code = str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
        if isinstance(exc, FileExistsError) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return True
        exc = exc.__cause__
    return False


def range_not_satisfiable(exc: BaseException) -> bool:
    """A 416 (the range starts past the object's end), however the client words it."""
    text = str(exc)
    return "416" in text or "not satisfiable" in text.lower() or "InvalidRange" in text
