"""mode="ray": every call fastload makes on Ray, refused once Ray was shut down under it.

Ray's own ``ray.get``, ``ray.wait``, ``ray.kill`` and ``.remote`` start a new local Ray when none
is running (``ray.init()``, its auto-init). Called from a loader's threads after the user's
``ray.shutdown()``, they would start one behind the user's back and leave its processes running;
through :class:`RayCalls` they raise :class:`~fastload.errors.ClusterLostError` instead, which
ends the pass in the loop with what happened and what to do. Each call holds Ray's own lock of
``ray.init``/``ray.shutdown`` (waits in slices of ``SLICE_S``): a Ray shut down by another thread
in the middle of a call ends the whole process ("The core worker has already been shutdown").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from fastload.errors import ClusterLostError

SLICE_S = 0.2  # the longest a call holds Ray's connect/shutdown lock while waiting
_WHAT_TO_DO = ("fastload never starts Ray by itself: to go on, save loader.state_dict(), connect again "
               "(ray.init(...)) and load it into the loader for a new pass, or use mode='threads'")


class RayCalls:
    """The ``ray`` module's calls a loader makes, each checking first that the Ray this loader
    joined still runs (``ray.is_initialized()`` and the same job), and none starting Ray.

    Args:
        ray: the ``ray`` module, connected (see :func:`~fastload.loading.ray_connect.connect`).
    """

    def __init__(self, ray: ModuleType) -> None:
        self.ray = ray
        self.exceptions = ray.exceptions
        self._get, self._wait = _without_auto_init(ray.get), _without_auto_init(ray.wait)
        self._kill, self._put = _without_auto_init(ray.kill), _without_auto_init(ray.put)
        self._context = _without_auto_init(ray.get_runtime_context)
        self._lock = _connect_lock(ray)
        self.job = self._job()

    def live(self) -> None:
        """Raise ClusterLostError unless the Ray this loader joined still runs."""
        if not self.ray.is_initialized():
            raise ClusterLostError(f"mode='ray': Ray was shut down (ray.shutdown()) while this loader used it, "
                                   f"and this pass ends here; {_WHAT_TO_DO}")
        if self._job() != self.job:
            raise ClusterLostError(f"mode='ray': Ray was shut down and started again while this loader used it "
                                   f"(its decode actors were in the Ray that ended), and this pass ends here; "
                                   f"{_WHAT_TO_DO}")

    def renew(self) -> bool:
        """At a new pass: whether Ray was started again since this loader's last one (its actors
        are gone with the old one). Raises ClusterLostError when Ray is not running."""
        if not self.ray.is_initialized():
            raise ClusterLostError("mode='ray': Ray is not running (it was shut down); connect again with "
                                   "ray.init(...) before the next pass, or use mode='threads'")
        job = self._job()
        renewed, self.job = job != self.job, job
        return renewed

    def _job(self) -> str:
        with self._lock:
            return self._context().get_job_id() if self.ray.is_initialized() else ""

    @contextmanager
    def _live(self) -> Iterator[None]:
        """Within: Ray's own lock around ``ray.init``'s connect and ``ray.shutdown`` held, and the
        Ray this loader joined checked running. A shutdown in another thread waits for the call
        in progress (calling into a Ray being shut down ends the process), never cuts it."""
        with self._lock:
            self.live()
            yield

    def get(self, refs: Any) -> Any:
        with self._live():
            return self._get(refs)

    def wait(self, refs: list[Any], *, num_returns: int = 1, timeout: float) -> tuple[list[Any], list[Any]]:
        """``ray.wait``, in slices of at most ``SLICE_S`` under the lock: a shutdown waits no longer."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            with self._live():
                done, rest = self._wait(refs, num_returns=num_returns, timeout=max(0.0, min(left, SLICE_S)))
            if len(done) >= num_returns or left <= SLICE_S:
                return done, rest

    def put(self, value: Any) -> Any:
        with self._live():
            return self._put(value)

    def kill(self, actor: Any) -> None:
        with self._live():
            self._kill(actor, no_restart=True)

    def call(self, method: Any, *args: Any) -> Any:
        """``method.remote(*args)``: an actor's method, or a class made remote (an actor started)."""
        with self._live():
            return method.remote(*args)

    def nodes(self) -> list[dict[str, Any]]:
        with self._live():
            return self.ray.nodes()

    def cpus(self) -> tuple[float, float]:
        """The cluster's free CPUs and all its CPUs."""
        with self._live():
            return (float(self.ray.available_resources().get("CPU", 0)),
                    float(self.ray.cluster_resources().get("CPU", 0)))

    def node_id(self) -> str:
        """The id of this process's own Ray node."""
        with self._live():
            return self._context().get_node_id()


def _connect_lock(ray: ModuleType) -> Any:
    """The lock Ray holds through ``ray.init``'s connect and ``ray.shutdown`` (private to Ray: a
    lock of this loader's own where a Ray has none, which orders nothing with Ray's)."""
    lock = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_connect_or_shutdown_lock", None)
    return lock if lock is not None else threading.RLock()


def _without_auto_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, a ``ray.*`` function, without Ray's wrapper that calls ``ray.init()`` first when Ray
    is not running (then the call fails instead); as it is where Ray wraps it otherwise."""
    inner = getattr(fn, "__wrapped__", None)
    code = getattr(fn, "__code__", None)
    return inner if inner is not None and code is not None and code.co_name == "auto_init_wrapper" else fn
