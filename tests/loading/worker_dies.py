"""A loop whose DataLoader worker is killed, run as its own process: what the loop's process sees
after the error, when torch's SIGCHLD handler runs only after the loader has raised (as it may on
a loaded machine: here SIGCHLD is held back while the loop iterates). Prints one JSON line.

python -m tests.loading.worker_dies {fastload|torch}
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch

import fastload
from tests.loading.helpers import Numbers


class KillsItsWorker(Numbers):
    """The worker process that reads sample 13 SIGKILLs itself (as the OOM killer would)."""

    def __getitem__(self, i: int):
        if i == 13 and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def _wait_dead(pid: int) -> None:
    """Until ``pid`` has ended, without reaping it (ChildProcessError: reaped already)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass


def main(kind: str) -> dict[str, object]:
    make = fastload.DataLoader if kind == "fastload" else torch.utils.data.DataLoader
    loader = make(KillsItsWorker(400), batch_size=2, num_workers=2)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    first: str | None = None
    try:
        for _ in it:
            pass
    except (RuntimeError, OSError, EOFError) as exc:  # torch's own loader may also end in a bare OSError
        first = f"{type(exc).__name__}: {exc}"
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})  # the SIGCHLD comes late
            for pid in pids:  # and another worker is killed after the error
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _wait_dead(pid)
            signal.raise_signal(signal.SIGCHLD)  # the handler has run by the next line
        except RuntimeError as again:
            return {"first": first, "again": str(again)}
    return {"first": first, "again": None}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
    os._exit(0)
