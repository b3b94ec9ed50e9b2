"""mode="ray", step one: joining the Ray cluster whose actors will decode (or refusing, saying why)."""

from __future__ import annotations

import logging
import socket
from types import ModuleType

from fastload.config import ray_address
from fastload.errors import ClusterUnreachableError
from fastload.optional import require

PURPOSE = "DataLoader(mode='ray') (decoding on a Ray cluster)"
PROBE_S = 5.0
"""How long a ``host:port`` is given to accept a connection before it is called unreachable: Ray's
own ``ray.init`` keeps retrying a dead address for minutes."""

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
        _probe(target)
    try:
        ray.init(address=target, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ClusterUnreachableError(f"ray_address={target!r}: no Ray cluster answered ({exc}); {_HOW}") from exc
    return ray


def _probe(address: str) -> None:
    """Refuse, quickly, a ``host:port`` where nothing listens."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray_address={address!r}: give 'host:port' (the head's GCS address, as "
                         "`ray start --head` prints it), 'auto', 'local' or a 'ray://' client address")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except OSError as exc:
        raise ClusterUnreachableError(f"ray_address={address!r}: no Ray cluster is reachable there "
                                      f"({type(exc).__name__}: {exc}); {_HOW}") from exc
