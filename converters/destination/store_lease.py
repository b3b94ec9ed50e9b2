"""A pack to an object store holds a lease on its URL: one object that the store itself lets only
one pack create (a conditional write), renewed while the pack runs, so a second pack is refused.

The lease names the pack folders (``gen-<16 hex>/``) its pack writes. A pack that finds an expired
lease, or one whose holder on this machine has died (kill -9), takes it over with another
conditional write and inherits those folders: their objects are fastload's, and only they and what
a published manifest lists are ever deleted from a store.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastload.errors import FastloadError, PackError
from fastload.format.layout import STORE_LEASE_NAME
from fastload.storage.remote import RemoteStore

LEASE_SECONDS = 120.0
"""A lease not renewed for this long is another pack's no longer: its holder died on another machine."""
RENEW_SECONDS = 15.0
_MAX_LEASE_BYTES = 2**16
_CLOCK_SLACK_SECONDS = 60.0  # clocks this far apart are common enough to be no sign of a wrong one


class StoreLease:
    """``URL/.fastload-pack.lease``, held from ``__enter__`` to ``__exit__``.

    Args:
        store: the dataset's folder in the store.
        generation: the pack folder this pack writes its shards and index in.
    """

    def __init__(self, store: RemoteStore, generation: str) -> None:
        self.store, self.generation = store, generation
        self.token = uuid.uuid4().hex
        self.generations: list[str] = [generation]  # ours, then those inherited from a dead pack
        self.etag = ""
        self.lost: str | None = None
        self.writing = False  # set once the pack may have written in its folder: kept for the next pack
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> StoreLease:
        self._acquire()
        self._renewer = threading.Thread(target=self._renew_until_stopped, name="fastload-lease", daemon=True)
        self._renewer.start()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.lost is not None:
            return
        try:
            if exc_type is None or not (self.writing or self.generations[1:]):
                self.store.remove([STORE_LEASE_NAME])
            else:  # failed with objects in its folders: the next pack takes the lease (and them) over at once
                self._write(expires=0.0)
        except (OSError, FastloadError):
            pass  # expires on its own after LEASE_SECONDS

    def check(self) -> None:
        """Raise PackError if another pack took the lease over (this one stalled past its expiry)."""
        if self.lost is not None:
            raise PackError(f"{self.store.url}: {self.lost}; nothing of this pack was published: run it again "
                            "once the other pack is done")

    def _acquire(self) -> None:
        where = self.store.display(STORE_LEASE_NAME)
        for _ in range(8):  # each pass either wins, refuses, or lost a race that changed the lease
            found = self._read()
            if found is None:
                if self._write(if_match=None):
                    return
                continue
            body, etag = found
            holder = _describe(body)
            if not _stale(body):
                raise PackError(f"{self.store.url}: another pack ({holder}) is writing here (its lease {where} "
                                f"is renewed every {RENEW_SECONDS:.0f} s); wait for it to finish, or if it died on "
                                f"another machine, {_when_to_retry(body)}")
            inherited = [g for g in body.get("generations", []) if isinstance(g, str) and g != self.generation]
            self.generations = [self.generation, *inherited]
            if self._write(if_match=etag):
                return
        raise PackError(f"{where}: the lease changed under every attempt to take it; another pack is starting "
                        "here: wait for it to finish")

    def _read(self) -> tuple[dict[str, Any], str] | None:
        """The lease's body and ETag, or None when there is none."""
        where = self.store.display(STORE_LEASE_NAME)
        try:
            etag = self.store.stat(STORE_LEASE_NAME).etag
            data = self.store.read_file(STORE_LEASE_NAME, _MAX_LEASE_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            data = None  # far larger than any lease fastload writes
        try:
            body = None if data is None else json.loads(data)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict) or body.get("fastload") != "pack lease":
            what = (f"over {_MAX_LEASE_BYTES // 1024} KiB" if data is None
                    else f"{len(data)} bytes" if data else "an empty object")
            raise PackError(f"{where}: is not a fastload pack lease ({what}); fastload "
                            "keeps its lease at that name: remove the object or pack into another prefix")
        return body, etag

    def _write(self, if_match: str | None = "", expires: float | None = None) -> bool:
        """Write our lease only if it is absent (``if_match`` None) or still the version ``if_match``
        (``""``: the one we last wrote); False when the store says the condition failed."""
        now = time.time()
        body = {"fastload": "pack lease", "token": self.token, "host": socket.gethostname(), "boot": _boot_id(),
                "pid": os.getpid(), "renewed": now, "expires": now + LEASE_SECONDS if expires is None else expires,
                "generations": self.generations}
        condition = self.etag if if_match == "" else if_match
        etag = put_conditional(self.store, STORE_LEASE_NAME, json.dumps(body).encode(), condition)
        if etag is None:
            found = self._read()  # a retried PUT that had landed the first time is ours all the same
            if found is None or found[0].get("token") != self.token or found[0].get("renewed") != now:
                return False
            etag = found[1]
        self.etag = etag
        return True

    def _renew_until_stopped(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(RENEW_SECONDS):
            try:
                if not self._write():
                    self.lost = "another pack took this pack's lease over"
                    return
                last = time.monotonic()
            except (OSError, FastloadError) as exc:
                if time.monotonic() - last > LEASE_SECONDS:
                    self.lost = f"the lease could not be renewed for {LEASE_SECONDS:.0f} s ({exc})"
                    return


def put_conditional(store: RemoteStore, name: str, data: bytes, if_match: str | None) -> str | None:
    """PUT ``data`` at ``name`` only if no object is there (``if_match`` None) or the object there has
    ETag ``if_match``; the new ETag, or None when the store refused on the condition."""
    if store.scheme not in ("s3", "s3a"):
        raise PackError(f"{store.url}: packing to {store.scheme}:// needs conditional writes, which fastload "
                        "uses on S3-compatible stores only; pack to a local folder and copy it, or to s3://")
    return store.put_if(name, data, if_match)  # through the store's client, obstore or fsspec


def _expiry(body: dict[str, Any]) -> float | None:
    """When the lease ends by its writer's clock; None when it names no finite time (NaN, Infinity,
    not a number: fastload never writes such a lease, so no pack holds it)."""
    expires = body.get("expires")
    if isinstance(expires, bool) or not isinstance(expires, (int, float)) or not math.isfinite(expires):
        return None
    return float(expires)


def _stale(body: dict[str, Any]) -> bool:
    """Whether the pack that wrote ``body`` no longer holds its lease."""
    expires = _expiry(body)
    if expires is None or expires < time.time():
        return True
    here = body.get("host") == socket.gethostname() and body.get("boot") == _boot_id()
    return here and isinstance(body.get("pid"), int) and not _alive(body["pid"])


def _when_to_retry(body: dict[str, Any]) -> str:
    """When a pack refused by a live lease may try again, by this machine's clock."""
    ahead = (_expiry(body) or 0.0) - time.time()
    if ahead <= LEASE_SECONDS + _CLOCK_SLACK_SECONDS:
        return f"run this again after {max(ahead, 0.0):.0f} s"
    # A lease lasts LEASE_SECONDS from its last renewal: its writer's clock is ahead of this one's.
    where = f"{body.get('host', '?')}"
    return (f"remove the lease object: it expires {ahead:.0f} s from now by this machine's clock, longer than "
            f"a lease lasts ({LEASE_SECONDS:.0f} s), so the clocks of this machine and {where} disagree "
            "(waiting would not end it in time); then run this again")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _describe(body: dict[str, Any]) -> str:
    renewed = body.get("renewed")
    ago = f", renewed {time.time() - renewed:.0f} s ago" if isinstance(renewed, (int, float)) else ""
    return f"pid {body.get('pid', '?')} on {body.get('host', '?')}{ago}"
