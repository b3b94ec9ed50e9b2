"""moto's S3 server for benchmarks, with ranged GETs that read only the range.

moto (a test double of S3, in Python) answers a ranged GET by reading the whole object and slicing
it: a 4 KB read of a 256 MB shard costs a 256 MB copy in the server, which no real store does and
which would make the server, not the reader, the thing a benchmark measures. This starts the same
server with one change: a GET with a single ``Range: bytes=a-b`` reads those bytes alone. Requests,
responses, headers and errors are moto's.

    python bench/ranged_moto.py -H 127.0.0.1 -p 5000
"""

from __future__ import annotations

import sys
import threading

from moto.s3 import models, responses

_ranged = threading.local()


class _RangeOnly:
    """Stands in for an object's bytes where moto only takes ``len()`` and one slice of them."""

    def __init__(self, key: models.FakeKey) -> None:
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(self.key.size)
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


_value = models.FakeKey.value


def _value_or_range(self: models.FakeKey) -> object:
    return _RangeOnly(self) if getattr(_ranged, "on", False) else _value.fget(self)


_get_object = responses.S3Response.get_object


def _get_object_ranged(self: responses.S3Response) -> object:
    spec = self.headers.get("range", "") if self.headers else ""
    _ranged.on = spec.startswith("bytes=") and "," not in spec and not spec.startswith("bytes=-")
    try:
        return _get_object(self)
    finally:
        _ranged.on = False


models.FakeKey.value = property(_value_or_range, _value.fset)  # type: ignore[assignment]
responses.S3Response.get_object = _get_object_ranged  # type: ignore[method-assign]

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
