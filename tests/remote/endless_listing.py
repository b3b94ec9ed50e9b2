"""A server that speaks S3's ListObjectsV2 and whose listing never ends: every page says it is
truncated and gives the next continuation token (a hostile or broken store). Both store clients
reach it as they reach S3 (path-style requests to an endpoint); moto cannot be made to list so.

``pages`` counts the list requests answered. After ``cap`` pages it does end, so that a client
that does not stop itself fails a test instead of filling memory."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlparse

from tests.remote.s3_server import KEY, REGION, SECRET


class EndlessListing:
    """Serves ``/<bucket>?list-type=2&prefix=<prefix>`` pages of ``per_page`` keys of ``key_bytes`` bytes."""

    def __init__(self, per_page: int = 1000, key_bytes: int = 1000, cap: int = 200) -> None:
        self.per_page, self.key_bytes, self.cap = per_page, key_bytes, cap
        self.pages = 0
        self._lock = threading.Lock()
        listing = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                body = listing.page(query.get("prefix", [""])[0], int(query.get("continuation-token", ["0"])[0]))
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="endless-listing", daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def storage_options(self) -> dict[str, Any]:
        return {"key": KEY, "secret": SECRET, "endpoint_url": self.endpoint_url,
                "client_kwargs": {"region_name": REGION}}

    def page(self, prefix: str, number: int) -> bytes:
        with self._lock:
            self.pages += 1
        stem = "k" * (self.key_bytes - len(prefix) - 16)
        keys = "".join(f"<Contents><Key>{prefix}{stem}{number * self.per_page + i:012d}.jpg</Key>"
                       "<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;e&quot;</ETag>"
                       "<Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>" for i in range(self.per_page))
        more = number + 1 < self.cap
        token = f"<NextContinuationToken>{number + 1}</NextContinuationToken>" if more else ""
        return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
                f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix>{prefix}</Prefix>'
                f"<KeyCount>{self.per_page}</KeyCount><MaxKeys>{self.per_page}</MaxKeys>"
                f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>{keys}{token}</ListBucketResult>").encode()

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
