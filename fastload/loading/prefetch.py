"""Background prefetch: run an iterator in a thread, a bounded number of items ahead."""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Iterator
from typing import Any

_DONE = object()
_EXIT_WAIT_S = 10.0  # how long exit waits for a prefetch thread to finish its item
_running: set[ThreadPrefetcher] = set()
_running_lock = threading.Lock()


class ThreadPrefetcher:
    """Iterates ``source`` in a daemon thread, keeping up to ``depth`` items ready.

    An exception from ``source`` is re-raised in the consumer, unchanged, in its place; the next
    item follows it (``source`` decides whether there is one: torch's iterator carries on after
    a batch that raised, a generator ends). Closing (or dropping) the prefetcher stops the
    thread at its next item.
    """

    def __init__(self, source: Iterator[Any], depth: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True,
                                        name="fastload-prefetch")
        self._thread.start()

    def _run(self, source: Iterator[Any]) -> None:
        with _running_lock:
            _running.add(self)
        try:
            while True:
                try:
                    item = next(source)
                except StopIteration:
                    break
                except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                    item, ok = exc, False  # then goes on: torch's iterator carries on after a bad batch
                else:
                    ok = True
                if not self._put((ok, item)):
                    self._given_up()
                    return
            self._put((True, _DONE))
        finally:
            with _running_lock:
                _running.discard(self)

    def _given_up(self) -> None:
        """Run in the thread when the prefetcher was closed before ``source`` ended: a subclass
        takes back what its source has asked for ahead."""

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> ThreadPrefetcher:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                ok, item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                # Never wait on a thread that will send nothing more (a silent end would hide lost data).
                if self._stop.is_set():
                    raise StopIteration from None  # closed: the iteration was given up
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("fastload: the prefetch thread ended without delivering its "
                                       "end of data or an error; the iteration is incomplete") from None
        if not ok:
            raise item  # the next call carries on with the item after it
        if item is _DONE:
            self.close()
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()

    def __del__(self) -> None:
        self._stop.set()


@atexit.register
def _stop_before_exit() -> None:
    """Stop every prefetch thread and let it finish its item before the interpreter finalises.

    A daemon thread still running at finalisation is ended by pthread_exit when it next takes
    the GIL; inside torch's C++ code (building a batch) that unwinding aborts the process
    ("terminate called without an active exception"), e.g. when a script ends mid-epoch.
    """
    with _running_lock:
        prefetchers = list(_running)
    for prefetcher in prefetchers:
        prefetcher.close()
    for prefetcher in prefetchers:
        prefetcher._thread.join(timeout=_EXIT_WAIT_S)
