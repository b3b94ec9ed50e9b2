"""mode="ray": every call fastload makes on Ray, refused once Ray was shut down under it.

Ray's own ``ray.get``, ``ray.wait``, ``ray.kill`` and ``.remote`` start a new local Ray when none
is running (``ray.init()``, its auto-init). Called from a loader's threads after the user's
``ray.shutdown()``, they would start one behind the user's back and leave its processes running;
through :class:`RayCalls` they raise :class:`~fastload.errors.ClusterLostError` instead, which
ends the pass in the loop with what happened and what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from fastload.errors import ClusterLostError

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
        return self._context().get_job_id() if self.ray.is_initialized() else ""

    def get(self, refs: Any, **options: Any) -> Any:
        self.live()
        return self._get(refs, **options)

    def wait(self, refs: list[Any], **options: Any) -> tuple[list[Any], list[Any]]:
        self.live()
        return self._wait(refs, **options)

    def put(self, value: Any) -> Any:
        self.live()
        return self._put(value)

    def kill(self, actor: Any) -> None:
        self.live()
        self._kill(actor, no_restart=True)

    def call(self, method: Any, *args: Any) -> Any:
        """``method.remote(*args)``: an actor's method, or a class made remote (an actor started)."""
        self.live()
        return method.remote(*args)

    def nodes(self) -> list[dict[str, Any]]:
        self.live()
        return self.ray.nodes()

    def cpus(self) -> tuple[float, float]:
        """The cluster's free CPUs and all its CPUs."""
        self.live()
        return (float(self.ray.available_resources().get("CPU", 0)),
                float(self.ray.cluster_resources().get("CPU", 0)))

    def node_id(self) -> str:
        """The id of this process's own Ray node."""
        self.live()
        return self._context().get_node_id()


def _without_auto_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, a ``ray.*`` function, without Ray's wrapper that calls ``ray.init()`` first when Ray
    is not running (then the call fails instead); as it is where Ray wraps it otherwise."""
    inner = getattr(fn, "__wrapped__", None)
    code = getattr(fn, "__code__", None)
    return inner if inner is not None and code is not None and code.co_name == "auto_init_wrapper" else fn
