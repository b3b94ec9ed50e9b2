"""The latency proxy's process: a round trip added to each request, bodies spliced (started by
``LatencyProxy`` in latency_proxy.py, which reads its CPU apart from the client's).

The fault tests keep ``FaultProxy`` (faults, bandwidth caps); this one does only what a far store's
distance does to a request, at as little CPU as it can: one event loop, request and response heads
parsed (small), bodies moved socket to socket by ``os.splice`` through a 1 MiB pipe, never through
a Python object. Client connections stay alive across requests although moto's server closes after
each response (a length-framed response gets the client's ``Connection`` back), as a real store's
endpoint keeps them. ``GET /_latency_proxy/stats`` is answered by the proxy itself: the requests, the
bytes of their ``Range`` headers and the client connections (this one too) since the last
``POST /_latency_proxy/clear``, and its own CPU-seconds.

    python tests/remote/latency_proxy_server.py UPSTREAM_HOST UPSTREAM_PORT --latency 0.02   # prints its port
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from typing import Any

CONTROL = "/_latency_proxy/"
_HEAD_LIMIT = 1 << 18
_PIPE = 1 << 20  # bytes a splice moves at most (the pipe is grown to this)
_SPLICE = hasattr(os, "splice")


class _Closed(Exception):
    """A peer closed the connection, or sent what this proxy does not forward."""


async def _wait(loop: asyncio.AbstractEventLoop, fd: int, readable: bool) -> None:
    """Until ``fd`` can be read (or written)."""
    done = loop.create_future()
    add, remove = (loop.add_reader, loop.remove_reader) if readable else (loop.add_writer, loop.remove_writer)
    add(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        remove(fd)


async def _recv_head(loop: asyncio.AbstractEventLoop, sock: socket.socket, buf: bytearray) -> bytes | None:
    """The next message head from ``buf`` and then ``sock`` (what follows it stays in ``buf``); None
    on a clean EOF before it."""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > _HEAD_LIMIT:
            raise _Closed("head too long")
        if not (data := await loop.sock_recv(sock, 1 << 16)):
            if buf.strip():
                raise _Closed("EOF inside a head")
            return None
        buf += data
    head = bytes(buf[:end + 4]).lstrip(b"\r\n")
    del buf[:end + 4]
    return head


def _parse(head: bytes) -> tuple[list[str], list[str], dict[str, str]]:
    """The start line's words, the header lines, and the headers by lower-case name."""
    lines = head.decode("latin-1").split("\r\n")
    lines = [ln for ln in lines if ln]
    start = lines[0].split(" ", 2)
    if len(start) < 2:
        raise _Closed(f"not HTTP: {lines[0]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return start, lines[1:], fields


def _head(start: list[str], lines: list[str], drop: tuple[str, ...], add: list[str]) -> bytes:
    kept = [ln for ln in lines if ln.partition(":")[0].strip().lower() not in drop]
    return "\r\n".join([" ".join(start), *kept, *add, "", ""]).encode("latin-1")


async def _pump(loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket, n: int,
                pipe: tuple[int, int]) -> None:
    """Move ``n`` bytes from ``src`` to ``dst`` (``n`` < 0: up to EOF) in the kernel."""
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK if _SPLICE else 0
    while n:
        want = _PIPE if n < 0 else min(n, _PIPE)
        try:
            got = os.splice(src.fileno(), pipe[1], want, flags=flags) if _SPLICE else 0
            data = b"" if _SPLICE else await loop.sock_recv(src, want)
        except BlockingIOError:
            await _wait(loop, src.fileno(), readable=True)
            continue
        if not (got or data):
            if n < 0:
                return
            raise _Closed("EOF inside a body")
        if not _SPLICE:
            await loop.sock_sendall(dst, data)
            got = len(data)
        n = n - got if n > 0 else n
        while _SPLICE and got:
            try:
                got -= os.splice(pipe[0], dst.fileno(), got, flags=flags)
            except BlockingIOError:
                await _wait(loop, dst.fileno(), readable=False)


class _Proxy:
    """The proxy process's state: where to forward, the latency, what it has counted."""

    def __init__(self, upstream: tuple[str, int], latency: float) -> None:
        self.upstream, self.latency = upstream, latency
        self.requests = self.range_bytes = self.connections = 0

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "range_bytes": self.range_bytes,
                "connections": self.connections, "latency_s": self.latency,
                "cpu_s": time.process_time(), "pid": os.getpid()}

    def _control(self, method: str, target: str) -> bytes:
        if method == "POST" and target == CONTROL + "clear":
            self.requests = self.range_bytes = self.connections = 0
        elif not (method == "GET" and target == CONTROL + "stats"):
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        body = json.dumps(self.stats()).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body), body)

    def _count(self, fields: dict[str, str]) -> None:
        self.requests += 1
        lo, _, hi = fields.get("range", "").removeprefix("bytes=").partition("-")
        if lo.isdigit() and hi.isdigit():
            self.range_bytes += int(hi) - int(lo) + 1

    async def serve(self, client: socket.socket) -> None:
        """One client connection: its requests in turn, each forwarded on a new upstream connection."""
        loop = asyncio.get_running_loop()
        self.connections += 1
        buf, pipe = bytearray(), os.pipe() if _SPLICE else (-1, -1)
        with contextlib.suppress(OSError, ValueError):
            import fcntl
            fcntl.fcntl(pipe[1], fcntl.F_SETPIPE_SZ, _PIPE)
        try:
            while (head := await _recv_head(loop, client, buf)) is not None:
                start, lines, fields = _parse(head)
                if start[1].startswith(CONTROL):
                    await loop.sock_sendall(client, self._control(start[0], start[1]))
                    continue
                if "chunked" in fields.get("transfer-encoding", "").lower():
                    await loop.sock_sendall(client, b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n"
                                                    b"Connection: close\r\n\r\n")  # FaultProxy forwards these
                    return
                self._count(fields)
                if self.latency > 0:
                    await asyncio.sleep(self.latency)
                if not await self._forward(loop, client, buf, start, lines, fields, pipe):
                    return
        except (_Closed, OSError):
            pass  # a peer hung up or broke framing: drop the connection, as a server would
        finally:
            client.close()
            for fd in pipe:
                if fd >= 0:
                    os.close(fd)

    async def _forward(self, loop: asyncio.AbstractEventLoop, client: socket.socket, buf: bytearray,
                       start: list[str], lines: list[str], fields: dict[str, str],
                       pipe: tuple[int, int]) -> bool:
        """One request upstream and its response back; says whether the client connection stays."""
        conn = fields.get("connection", "").lower()
        client_close = "close" in conn or (len(start) > 2 and start[2] < "HTTP/1.1" and "keep-" not in conn)
        length = int(fields.get("content-length", "0") or 0)
        if fields.get("expect", "").lower() == "100-continue":
            await loop.sock_sendall(client, b"HTTP/1.1 100 Continue\r\n\r\n")
        up = socket.socket()
        up.setblocking(False)
        try:
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(up, self.upstream)
            early = bytes(buf[:length])
            del buf[:length]
            await loop.sock_sendall(up, _head(start, lines, ("expect",), []) + early)
            await _pump(loop, client, up, length - len(early), pipe)
            ubuf = bytearray()
            while True:  # interim 1xx heads pass through
                rstart, rlines, rfields = _parse(await _recv_head(loop, up, ubuf) or b"")
                if not rstart[1].startswith("1") or rstart[1] == "101":
                    break
                await loop.sock_sendall(client, _head(rstart, rlines, (), []))
            if start[0] == "HEAD" or rstart[1] in ("204", "304"):
                body = 0
            elif "content-length" in rfields and "chunked" not in rfields.get("transfer-encoding", ""):
                body = int(rfields["content-length"])
            else:  # framed by the upstream's EOF: forwarded as it is, and the client closed after it
                await loop.sock_sendall(client, _head(rstart, rlines, (), []) + bytes(ubuf))
                await _pump(loop, up, client, -1, pipe)
                return False
            out = _head(rstart, rlines, ("connection",), ["Connection: close"] if client_close else [])
            await loop.sock_sendall(client, out + bytes(ubuf[:body]))
            await _pump(loop, up, client, body - min(body, len(ubuf)), pipe)
            return not client_close
        finally:
            up.close()


async def _main(proxy: _Proxy, host: str) -> None:
    loop = asyncio.get_running_loop()
    listener = socket.create_server((host, 0), backlog=1024)
    listener.setblocking(False)
    print(listener.getsockname()[1], flush=True)
    tasks: set[asyncio.Task[None]] = set()
    while True:
        client, _ = await loop.sock_accept(listener)
        client.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = loop.create_task(proxy.serve(client))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("upstream_host")
    p.add_argument("upstream_port", type=int)
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to each request (0)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--parent", type=int, default=0, help="die with this process (Linux)")
    args = p.parse_args(argv)
    if args.parent and sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != args.parent:
            sys.exit("latency proxy: parent gone before start")
    asyncio.run(_main(_Proxy((args.upstream_host, args.upstream_port), args.latency), args.host))


if __name__ == "__main__":
    main(sys.argv[1:])
