"""FaultProxy: an HTTP/1.1-aware TCP proxy adding latency, bandwidth caps and S3 faults."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from types import TracebackType
from typing import Self

FAULTS = ("reset", "truncate", "503", "500", "403", "timeout", "endless", "stall")
_PIECE = 1 << 20  # bodies move in reads of up to 1 MiB: no per-byte Python work on the hot path
ENDLESS_CAP = 64 << 20  # an "endless" body ends here, so a client that reads it all fails, not the host
_HEAD_LIMIT = 1 << 18  # longest request/response head accepted
_ERRORS = {  # fault -> status, reason, S3 error code, message
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError",
            "We encountered an internal error. Please try again."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
}
Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter


@dataclass
class ProxyRequest:
    """One request as the proxy saw it: header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class _Pending:
    fault: str
    count: int
    match: Callable[[ProxyRequest], bool] | None


class _Closed(Exception):
    """A peer closed the connection, or sent something that is not HTTP/1.1."""


async def _read_head(reader: Reader, first: bool = False) -> bytes | None:
    """The next message head up to its blank line; None on a clean EOF before it when ``first``."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        if first and isinstance(e, asyncio.IncompleteReadError) and not e.partial.strip():
            return None
        raise _Closed from e
    return head.lstrip(b"\r\n")  # tolerate stray blank lines between messages (RFC 9112 2.2)


def _parse_head(head: bytes) -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
    """The start line's words, the headers in order, and the headers by lower-case name."""
    lines = head.decode("latin-1").split("\r\n")
    start = lines[0].split(" ", 2)
    if len(start) < 2:
        raise _Closed(f"not an HTTP message: {lines[0]!r}")
    headers = [(k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)]
    return start, headers, {k.lower(): v for k, v in headers}


def _build_head(start: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [start, *(f"{k}: {v}" for k, v in headers), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _framing(headers: dict[str, str]) -> tuple[str, int]:
    """("chunked", 0), ("length", n) or ("none", 0) when neither header frames the body."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked", 0
    if "content-length" not in headers:
        return "none", 0
    if not headers["content-length"].isdigit():
        raise _Closed("bad Content-Length")
    return "length", int(headers["content-length"])


async def _copy(reader: Reader, writer: Writer | None, n: int, proxy: FaultProxy | None = None,
                to_eof: bool = False) -> None:
    """Forward ``n`` bytes (or up to EOF) in large pieces, dropping them when ``writer`` is None
    and pacing them to ``proxy.bandwidth`` when one is given."""
    began, sent = time.monotonic(), 0
    while n > 0:
        rate = proxy.bandwidth if proxy else None
        piece = max(4096, min(_PIECE, int(rate / 50))) if rate else _PIECE  # ~20 ms when capped
        if not (data := await reader.read(min(n, piece))):
            if to_eof:
                return
            raise _Closed("EOF inside a body")
        n, sent = n - len(data), sent + len(data)
        if writer is not None:
            writer.write(data)
            await writer.drain()
        if rate:
            await asyncio.sleep(max(0.0, began + sent / rate - time.monotonic()))


async def _copy_chunked(reader: Reader, writer: Writer | None,
                        proxy: FaultProxy | None = None) -> None:
    """Forward a chunked body as it is framed, trailers included."""
    out = writer.write if writer is not None else (lambda data: None)
    try:
        while (size := int((line := await reader.readuntil(b"\r\n")).split(b";")[0], 16)) > 0:
            out(line)
            await _copy(reader, writer, size + 2, proxy)  # the chunk and its CRLF
        out(line)
        while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
            out(trailer)
        out(trailer)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        raise _Closed("bad chunked body") from e


async def _copy_body(reader: Reader, writer: Writer | None, kind: str, length: int,
                     proxy: FaultProxy | None = None) -> None:
    """Forward (or with no ``writer``, drop) a body framed as ``_framing`` says."""
    if kind == "length":
        await _copy(reader, writer, length, proxy)
    elif kind == "chunked":
        await _copy_chunked(reader, writer, proxy)
    if writer is not None:
        await writer.drain()


def _reset(writer: Writer) -> None:
    """Close with RST: SO_LINGER 0 makes close() drop the connection instead of a FIN."""
    with contextlib.suppress(OSError, AttributeError):
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _error_response(fault: str, method: str, request_id: str, close: bool) -> bytes:
    status, reason, code, message = _ERRORS[fault]
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>{request_id}</RequestId>"
            f"<HostId>fastload-fault-proxy</HostId></Error>").encode()
    headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body))),
               ("x-amz-request-id", request_id), ("Date", formatdate(usegmt=True))]
    headers += [("Connection", "close")] if close else []
    return _build_head(f"HTTP/1.1 {status} {reason}", headers) + (b"" if method == "HEAD" else body)


class FaultProxy:
    """Forwards HTTP/1.1 to ``upstream_host:upstream_port``, one upstream connection per client
    connection at a time, keeping client connections alive across requests even when the upstream
    (moto's werkzeug server) closes after each response.

    ``latency`` (seconds before each request is served) and ``bandwidth`` (bytes/second per
    response body, or None) may be set at any time; ``fail_next`` queues faults (see ``FAULTS``).
    ``connections``/``upstream_connections`` count connections accepted/opened;
    ``most_in_flight`` is the most requests it served at once (from a request's head to the end
    of its response) since the start or the last ``clear()``.

    Faults on a response: ``truncate`` sends about half of it and closes; ``stall`` sends the head
    (its Content-Length now larger than what follows) and half the body, then nothing until the
    client hangs up; ``endless`` answers 200 whatever the Range asked, with no length and zeros
    without end (up to ``ENDLESS_CAP``; ``endless_sent`` counts them).
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.latency: float = 0.0
        self.bandwidth: float | None = None
        self.port = 0
        self.connections = self.upstream_connections = 0
        self.endless_sent = 0
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._requests: list[ProxyRequest] = []
        self._faults: Counter[str] = Counter()
        self._errors: list[BaseException] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[ProxyRequest]:
        """A snapshot of the requests seen so far, faulted ones included."""
        with self._lock:
            return list(self._requests)

    @property
    def faults_injected(self) -> dict[str, int]:
        """How many of each fault have been served since the start or the last ``clear()``."""
        with self._lock:
            return dict(self._faults)

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return sum(p.count for p in self._pending)

    @property
    def errors(self) -> list[BaseException]:
        """Unexpected exceptions inside the proxy (bugs, not peers hanging up)."""
        with self._lock:
            return list(self._errors)

    def fail_next(self, fault: str, count: int = 1,
                  match: Callable[[ProxyRequest], bool] | None = None) -> None:
        """Serve ``fault`` instead of the next ``count`` requests for which ``match`` is true."""
        if fault not in FAULTS or count < 1:
            raise ValueError(f"need a fault in {FAULTS} and a count >= 1, not {fault!r}, {count}")
        with self._lock:
            self._pending.append(_Pending(fault, count, match))

    def clear(self) -> None:
        """Forget recorded requests, fault counts and errors."""
        with self._lock:
            self._requests.clear()
            self._faults.clear()
            self._errors.clear()
            self.most_in_flight = self.in_flight

    def reset_faults(self) -> None:
        """Drop pending faults and go back to no latency and no bandwidth cap."""
        with self._lock:
            self._pending.clear()
        self.latency, self.bandwidth = 0.0, None

    def start(self) -> Self:
        if self._thread is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                            daemon=True)
            self._thread.start()
            asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        """Close the listener and every connection (held "timeout" ones too); idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0,
                                                  limit=_HEAD_LIMIT, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _take_fault(self, request: ProxyRequest) -> str | None:
        with self._lock:
            self._requests.append(request)
            for pending in self._pending:
                if pending.match is None or pending.match(request):
                    pending.count -= 1
                    if pending.count == 0:
                        self._pending.remove(pending)
                    self._faults[pending.fault] += 1
                    return pending.fault
        return None

    async def _serve(self, c_reader: Reader, c_writer: Writer) -> None:
        """One client connection: requests in turn until either side closes."""
        task = asyncio.current_task()
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        upstream: tuple[Reader, Writer] | None = None
        serving = False
        try:
            while (head := await _read_head(c_reader, first=True)) is not None:
                serving = self._served(serving, True)
                start, headers, lower = _parse_head(head)
                method, version = start[0], (start[2] if len(start) > 2 else "HTTP/1.0")
                conn = lower.get("connection", "").lower()  # HTTP/1.0 closes unless asked not to
                client_close = "close" in conn or (version < "HTTP/1.1" and "keep-" not in conn)
                expect = lower.get("expect", "").lower() == "100-continue"
                kind, length = _framing(lower)
                fault = self._take_fault(ProxyRequest(method, start[1], lower))
                if self.latency > 0:  # each request pays the round trip, faulted ones too
                    await asyncio.sleep(self.latency)
                if fault == "reset":
                    _reset(c_writer)
                    return
                if fault == "timeout":
                    await c_reader.read()  # hold the connection until the client gives up
                    return
                if fault in _ERRORS:
                    if not expect:  # with Expect the body never comes: answer, then close
                        await _copy_body(c_reader, None, kind, length)
                    rid = f"FAULT{sum(self._faults.values()):012d}"
                    c_writer.write(_error_response(fault, method, rid, expect or client_close))
                    await c_writer.drain()
                    if expect or client_close:
                        return
                    continue
                if expect:  # answered here, so the upstream never has to (werkzeug would)
                    c_writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if upstream is None:
                    upstream = await asyncio.open_connection(
                        self.upstream_host, self.upstream_port, limit=_HEAD_LIMIT)
                    self.upstream_connections += 1
                u_reader, u_writer = upstream
                u_writer.write(_build_head(" ".join(start),
                                           [(k, v) for k, v in headers if k.lower() != "expect"]))
                await _copy_body(c_reader, u_writer, kind, length)
                keep_upstream, keep_client = await self._relay(
                    u_reader, c_writer, method, fault, client_close)
                if not keep_upstream:
                    u_writer.transport.abort()
                    upstream = None
                if not keep_client:
                    return
                serving = self._served(serving, False)  # the response is out: the next head is the client's
        except (_Closed, ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # a peer hung up or broke framing: drop the connection, as a server would
        except asyncio.CancelledError:
            pass  # stop(): ending normally spares asyncio 3.11 a bogus "Exception in callback" log
        except Exception as e:  # noqa: BLE001 - a bug in the proxy or a test's match function,
            with self._lock:  # kept for ``errors`` (tests assert it stays empty)
                self._errors.append(e)
        finally:
            self._served(serving, False)
            self._tasks.discard(task)  # type: ignore[arg-type]
            if upstream is not None:
                upstream[1].transport.abort()
            if not c_writer.transport.is_closing():
                c_writer.close()

    def _served(self, serving: bool, starting: bool) -> bool:
        """Count the connection's request in flight out (``serving``) and a new one in
        (``starting``); whether one is in flight now."""
        with self._lock:
            self.in_flight -= serving
            if starting:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return starting

    async def _relay(self, u_reader: Reader, c_writer: Writer, method: str, fault: str | None,
                     client_close: bool) -> tuple[bool, bool]:
        """Forward one response; says whether the upstream and the client connections stay open."""
        while True:
            start, headers, lower = _parse_head(await _read_head(u_reader) or b"")
            code = int(start[1])
            if not 100 <= code < 200 or code == 101:
                break
            c_writer.write(_build_head(" ".join(start), headers))  # interim: pass it on
        conn = lower.get("connection", "").lower()
        keep_upstream = "close" not in conn and (start[0] != "HTTP/1.0" or "keep-alive" in conn)
        kind, length = _framing(lower)
        if method == "HEAD" or code in (204, 304):
            kind, length = "length", 0
        # Self-delimited bodies keep the client connection whatever the upstream does, the way a
        # real S3 endpoint keeps connections alive; only a body ending at EOF ends it.
        keep_client = not client_close and kind != "none"
        headers = [(k, v) for k, v in headers if k.lower() != "connection"]
        headers += [] if keep_client else [("Connection", "close")]
        head = _build_head(" ".join(start), headers)
        if fault == "truncate":
            await _truncated(u_reader, c_writer, head, kind, length)
            return False, False
        if fault == "stall":
            await _truncated(u_reader, c_writer, head, kind, length, close=False)
            await asyncio.Event().wait()  # until the client hangs up (or stop() cancels)
        if fault == "endless":
            await _copy_body(u_reader, None, kind, length)
            await self._endless(c_writer, [(k, v) for k, v in headers if k.lower() not in _FRAMING])
            return False, False
        c_writer.write(head)
        if kind == "none":  # the body ends at the upstream's EOF
            await _copy(u_reader, c_writer, 1 << 62, self, to_eof=True)
            keep_upstream = False
        await _copy_body(u_reader, c_writer, kind, length, self)
        return keep_upstream, keep_client


    async def _endless(self, c_writer: Writer, headers: list[tuple[str, str]]) -> None:
        """A 200 with ``headers`` (no framing) and zeros until the client hangs up or the cap."""
        c_writer.write(_build_head("HTTP/1.1 200 OK", [*headers, ("Connection", "close")]))
        piece, sent = bytes(1 << 16), 0
        while sent < ENDLESS_CAP:
            c_writer.write(piece)
            await c_writer.drain()
            sent += len(piece)
            with self._lock:
                self.endless_sent += len(piece)
        c_writer.close()


_FRAMING = ("content-length", "content-range", "transfer-encoding")


async def _truncated(u_reader: Reader, c_writer: Writer, head: bytes, kind: str,
                     length: int, close: bool = True) -> None:
    """The head and about half the body, then a close (unless not ``close``); half the head when
    there is no body."""
    if kind == "length" and length == 0:
        c_writer.write(head[: len(head) // 2])
    elif kind == "length":
        c_writer.write(head)
        await _copy(u_reader, c_writer, length // 2)
    elif kind == "chunked":
        line = await u_reader.readuntil(b"\r\n")
        c_writer.write(head + line)
        await _copy(u_reader, c_writer, int(line.split(b";")[0], 16) // 2)
    else:
        body = await u_reader.read()
        c_writer.write(head + body[: len(body) // 2])
    await c_writer.drain()
    if close:
        c_writer.close()
