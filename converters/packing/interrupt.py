"""Ctrl-C while packing: held until the packing thread is between files, then handled there.

Python runs a SIGINT handler between any two bytecodes of the main thread, including the instant
after a lock was acquired and before the ``with`` block that releases it has begun (CPython
bpo-29988). When that lock is one the writer thread needs (write-behind's back-pressure
condition, a future's), the writer blocks on it for good and the packing thread, cleaning up,
waits for the writer for good: an interrupted pack hangs instead of exiting. So while the
threads run, the handler only notes the interrupt; the packing thread calls ``check()`` between
files and while it waits for the writer to finish, where it holds no lock, and the original
handler runs there. A second Ctrl-C does not wait for that.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def interrupt_between_files() -> Iterator[Callable[[], None]]:
    """Hold SIGINT for the duration; yields ``check``, which runs a held interrupt's handler."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield lambda: None  # signals reach only the main thread; SIG_IGN / SIG_DFL stay as they are
        return
    held: list[FrameType | None] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:  # pressed twice: the user does not want to wait for a safe point
            previous(signum, frame)
        else:
            held.append(frame)

    def check() -> None:
        if held:
            previous(signal.SIGINT, held.pop())

    signal.signal(signal.SIGINT, hold)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)
    check()  # one that came after the last file: the threads are done, handle it now
