"""A training loop whose DataLoader worker gets SIGKILLed, run as its own process (torch reports a
dead worker from a SIGCHLD handler, which may fire again at any later point of the process that
iterated). Prints one JSON line: the error the loop got and how many records arrived before it.

python -m tests.reliability.kill_worker DATASET {itself|itself-persistent|from-outside} FOLDER
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

import fastload


class KillsItsWorker(fastload.PackedDataset):
    """SIGKILLs the worker process that reads record 13 in epoch ``kill_epoch`` (as the OOM killer
    would)."""

    kill_epoch = 0

    def __getitems__(self, keys: list) -> list:
        if torch.utils.data.get_worker_info() is not None and any(
                self._key(k)[:2] == (13, self.kill_epoch) for k in keys):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitems__(keys)


def note_pid(folder: str, worker_id: int) -> None:
    """A worker_init_fn leaving the worker's pid for the killer."""
    Path(folder, f"worker{worker_id}").write_text(str(os.getpid()))


def _worker_pid(folder: str, worker_id: int, wait_s: float = 60.0) -> int:
    """The pid the worker noted (a loaded machine may deliver worker 0's batch before worker 1 has
    run its init function: wait for it, bounded)."""
    path = Path(folder, f"worker{worker_id}")
    deadline = time.monotonic() + wait_s
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: worker {worker_id} noted no pid in {wait_s:.0f} s")
        time.sleep(0.01)
    return int(path.read_text())


def main(dataset: str, how: str, folder: str) -> dict[str, object]:
    seen: list[int] = []
    if how.startswith("itself"):
        persistent = how == "itself-persistent"
        ds = KillsItsWorker(dataset, image_size=16, train=True)
        ds.kill_epoch = 1 if persistent else 0  # persistent: a whole first epoch, same workers
        loader = fastload.DataLoader(ds, batch_size=2, shuffle=False, num_workers=2,
                                     persistent_workers=persistent)
        if persistent:
            seen += [y for _, labels in loader for y in labels.tolist()]
        batches = iter(loader)
    else:
        loader = fastload.DataLoader(fastload.PackedDataset(dataset, image_size=16, train=True), batch_size=1,
                                     shuffle=False, num_workers=2, prefetch_factor=1,
                                     worker_init_fn=functools.partial(note_pid, folder))
        batches = iter(loader)
        seen += next(batches)[1].tolist()
        os.kill(_worker_pid(folder, 1), signal.SIGKILL)
    try:
        for _, labels in batches:
            seen += labels.tolist()
    except Exception as exc:  # noqa: BLE001 - reported to the test, which judges it
        return {"error": type(exc).__name__, "message": str(exc), "records": len(seen)}
    return {"error": None, "message": "", "records": len(seen)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])), flush=True)
    os._exit(0)  # leave at once: torch's handlers have nothing more to say about this process
