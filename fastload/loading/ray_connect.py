"""mode="ray", step one: joining the Ray cluster whose actors will decode (or refusing, saying why)."""

from __future__ import annotations

import logging
import os
import socket
import time
from types import ModuleType

from fastload.config import ray_address
from fastload.errors import ClusterUnreachableError
from fastload.optional import require

PURPOSE = "DataLoader(mode='ray') (decoding on a Ray cluster)"
PROBE_S = 5.0
"""How long a ``host:port`` is given to accept a connection and answer as Ray's GCS before it is
called unreachable: Ray's own ``ray.init`` keeps retrying such an address for minutes."""

_HOW = ("start one (`ray start --head` on a machine of the cluster), pass ray_address='host:port' of a "
        "running cluster's head, or ray_address='local' to start a Ray on this machine")


def connect(address: str | None) -> ModuleType:
    """The ``ray`` module, connected: to the Ray this process already joined (``address`` None),
    else to ``address`` (or ``RAY_ADDRESS``, else ``"auto"``: the cluster this machine is part of);
    ``"local"`` starts a Ray of this process's own, as ``ray.init(address="local")`` does."""
    ray = require("ray", PURPOSE)
    if ray.is_initialized():
        return ray
    target = address or ray_address() or "auto"
    if target not in ("auto", "local") and not target.startswith("ray://"):
        probe(target, subject="ray_address", how=_HOW)
    try:
        ray.init(address=target, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ClusterUnreachableError(f"ray_address={target!r}: no Ray cluster answered ({exc}); {_HOW}") from exc
    return ray


def probe(address: str, *, subject: str, how: str) -> None:
    """Refuse, within ``PROBE_S``, a ``host:port`` where no Ray cluster's head answers: nothing
    listens there, or something that is not Ray's GCS does (``ray.init`` would wait on it for
    minutes). The GCS is a gRPC server: it answers a client's HTTP/2 preface with a SETTINGS frame.
    ``subject`` names the argument in the error, ``how`` says what to do instead."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{subject}={address!r}: give 'host:port' (the head's GCS address, as "
                         "`ray start --head` prints it), 'auto', 'local' or a 'ray://' client address")
    deadline = time.monotonic() + PROBE_S
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # a TLS handshake comes first: the connection is all that can be checked here
            conn.sendall(_HTTP2_PREFACE)
            answer = _read(conn, 9, deadline)
    except OSError as exc:
        raise ClusterUnreachableError(f"{subject}={address!r}: no Ray cluster is reachable there "
                                      f"({type(exc).__name__}: {exc}); {how}") from exc
    if len(answer) < 9 or answer[3] != _SETTINGS:
        said = (f"it sent nothing within {PROBE_S:g} s, where Ray's GCS answers at once" if not answer else
                f"it began with {answer!r}, not the HTTP/2 SETTINGS frame Ray's GCS (a gRPC server) begins with")
        raise ClusterUnreachableError(f"{subject}={address!r}: something listens there but it is not a Ray "
                                      f"cluster's head ({said}); the head's address is the one `ray start --head` "
                                      f"printed (port 6379 unless --port said otherwise); {how}")


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS
_SETTINGS = 4  # the frame type a server's HTTP/2 preface begins with (RFC 9113, 3.4)


def _read(conn: socket.socket, size: int, deadline: float) -> bytes:
    """Up to ``size`` bytes from ``conn``: fewer when it closes, or when ``deadline`` comes first."""
    got = b""
    while len(got) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(size - len(got))
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        got += chunk
    return got
