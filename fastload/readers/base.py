"""What every shard reader shares: lazy per-process handles and record-level error context."""

from __future__ import annotations

import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fastload.errors import CorruptRecordError, ManifestError
from fastload.format import Manifest, RecordIndex, record_checksum
from fastload.format.files import kind_of
from fastload.readers.read_ahead import (
    OPENS_IN_TURN,
    SHARD_OPENS,
    PendingReads,
    batch_fetches,
    cold_reads,
    read_if_cached,
    shard_opens,
    will_need,
)
from fastload.storage.remote_shards import RemoteShards


class ShardReader:
    """Random access to record payloads by global index.

    Handles are opened lazily in the process that reads and re-opened after a fork (the pid is
    remembered), and never pickled: a reader can be handed to DataLoader workers under fork or spawn.
    """

    def __init__(self, root: Path | str, manifest: Manifest, index: RecordIndex,
                 remote: RemoteShards | None = None) -> None:
        self.root = root  # a local folder, or the URL of a dataset in an object store
        self.manifest = manifest
        self.index = index
        self.remote = remote  # set for a dataset in an object store: shards read by byte range
        # where() runs for every decoded sample (its error context): each shard path built once.
        self._shard_paths = [f"{root}/{info.file}" for info in manifest.shards]
        self._pid = -1
        self._handles: dict[int, Any] = {}
        self._opening: dict[int, threading.Lock] = {}  # a lock per shard being opened

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"], state["_handles"], state["_opening"] = -1, {}, {}
        return state

    def handle(self, shard: int) -> Any:
        """The open handle for ``shard`` in this process (decode threads read at once). Each shard
        is opened once however many threads ask; different shards open side by side (a remote
        shard's open is a few round trips to the store)."""
        handle = self._handles.get(shard) if self._pid == os.getpid() else None
        if handle is not None:
            return handle
        with _open_lock:
            if self._pid != os.getpid():
                self._handles, self._opening = {}, {}  # inherited through fork: never reuse the parent's
                self._pid = os.getpid()
            handle = self._handles.get(shard)
            if handle is not None:
                return handle
            opening = self._opening.setdefault(shard, threading.Lock())
        with opening:
            handle = self._handles.get(shard)
            if handle is None:
                handle = self.open_shard(shard)
                with _open_lock:  # close() may be going through the handles
                    self._handles[shard] = handle
        return handle

    def open_shards(self, shards: Iterable[int]) -> None:
        """Open the remote shards among ``shards`` that this process has not opened yet. Each open
        walks the shard's structure in a few round trips to the store, and under a global shuffle
        the first batches want nearly every shard: opened one after another, a batch waited for as
        many walks as it had new shards (134 shards of 8 MB through 20 ms, bench/remote_bench.py:
        the first batch 1.22 s in, side by side 0.60 s). They go in chains side by side (up to
        ``SHARD_OPENS``), as few as keep each chain to ``OPENS_IN_TURN`` walks: each walk fetches
        the pieces around the pages it reads, and a handful of shards opened all at once added
        their pieces to the first seconds' fetches for nothing (5 shards: 10-14 MB more peak
        memory, the fill done later). A local shard opens in well under a millisecond: left to
        ``handle``."""
        if self.remote is None:
            return
        current = self._handles if self._pid == os.getpid() else {}
        wanted = sorted({int(shard) for shard in shards}.difference(current))
        chains = min(SHARD_OPENS, -(-len(wanted) // OPENS_IN_TURN))
        if chains > 1:
            for _ in shard_opens().map(self._open_in_turn, [wanted[k::chains] for k in range(chains)]):
                pass  # the first failure raised here

    def _open_in_turn(self, shards: list[int]) -> None:
        for shard in shards:
            self.handle(shard)

    def open_shard(self, shard: int) -> Any:
        raise NotImplementedError

    def stat_shard(self, shard: int) -> Any:
        """The shard file's stat; a missing, truncated or extended file raises ManifestError."""
        if self.remote is not None:
            return self.remote.check(shard)
        path = Path(self.root) / self.manifest.shards[shard].file
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ManifestError(f"{path}: shard file cannot be opened ({exc.strerror}); the dataset "
                                "is incomplete, re-pack it with `fastload pack`") from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open, a device read without end
            raise ManifestError(f"{path}: shard is {kind_of(st.st_mode)}, not a regular file; the dataset "
                                "is damaged, re-pack it with `fastload pack`")
        expected = self.manifest.shards[shard].bytes
        if st.st_size != expected:
            raise ManifestError(f"{path}: {st.st_size} bytes on disk, the manifest says {expected} "
                                f"(truncated or replaced); run `fastload verify {self.root}` and "
                                "re-pack the dataset")
        return st

    def read(self, i: int, field: str | None = None) -> bytes:
        """Payload bytes of record ``i`` (``field``: of its file field of that name)."""
        return self.read_many([i], field)[0]

    def read_many(self, indices: Sequence[int], field: str | None = None) -> list[bytes]:
        """Payloads of several records (or of their file field ``field``), each checked against
        its stored checksum."""
        return [self._checked(i, data, field) for i, data in zip(indices, self.read_raw(indices, field))]

    def places(self, field: str | None = None) -> Any:
        """The columns locating the records' files (``field``: a file field's files): position,
        offset, size, checksum, width, height."""
        return self.index if field is None else self.index.files[field]

    def prefetched(self, indices: Sequence[int], field: str | None = None) -> Callable[[int], bytes]:
        """``read(i)`` for the records of one batch (``field``: their file field's files) that
        decode threads read one by one: for a remote dataset the whole batch is fetched at once
        first (one round of requests, not one per record and thread) into the node cache, or into
        memory where it has none; each record is still checked when it is read, so a damaged one
        fails alone."""
        if self.remote is None or len(indices) < 2:
            return lambda i: self.read(i, field)
        # Records the node cache holds now are read from it by the decode thread that wants each
        # (as local records are): the batch's bytes are not all in memory at once.
        fetched = dict(zip(indices, self.remote.fetch(self._places(indices, field))))

        def read(i: int) -> bytes:
            data = fetched.get(i)
            return self.read(i, field) if data is None else self._checked(i, data, field)
        return read

    def _checked(self, i: int, data: bytes, field: str | None = None) -> bytes:
        """``data`` if it matches the checksum of record ``i`` (or its file ``field``); else
        CorruptRecordError."""
        expected = int(self.places(field).checksum[i])
        if record_checksum(data) == expected:
            return data
        if self.remote is not None:  # the cached copy may be what is damaged: ask the store
            place = self.locate(i, field)
            data = self.remote.refetch(place)
            if record_checksum(data) == expected:
                self.remote.damaged_copy(place[0], f"{self.where(i, field)}: checksum mismatch")
                return data
        raise self.corrupt(i, "checksum mismatch (the stored bytes changed)", field)

    def read_raw(self, indices: Sequence[int], field: str | None = None) -> list[bytes]:
        """Payloads as stored, unchecked (``start_reads``, waited for at once)."""
        if self.remote is not None:  # in the caller's thread (decode threads fetch batches side by side)
            return self.remote.read(self._places(indices, field))
        return self.start_reads(indices, field).result()

    def start_reads(self, indices: Sequence[int], field: str | None = None) -> PendingReads:
        """Start reading the payloads of ``indices`` (``field``: their file field's files) and return
        at once; ``.result()`` waits for them (unchecked, as stored) and raises what the reads
        raised. Start the next batch before waiting for this one and the disk or store never idles
        between batches (``read_batches``).

        Local records are first hinted to the kernel (``will_read``), then the ones in the page
        cache are read at once (``RWF_NOWAIT``: no thread, no wait) and the ones that would wait
        for the disk by a pool of threads, all in flight together, as a disk serves many random
        reads at once (one thread reading cold records in turn ran at 0.52x the rate of 64
        threads doing so). A remote batch is fetched by a thread of its own, one round of
        requests for the whole batch."""
        try:
            places = self._places(indices, field)
        except Exception as exc:  # noqa: BLE001 - raised by result(), in the batch's turn
            return PendingReads(error=exc)
        if self.remote is not None:
            return PendingReads(future=batch_fetches().submit(self.remote.read, places))
        if len(places) < 2:  # nothing to read side by side: one pread (a probe would copy it twice)
            return PendingReads(wait=lambda: [self._read_at(i, *p, field) for i, p in zip(indices, places)])
        will_need(places)
        out: list[bytes | None] = [read_if_cached(*place) for place in places]
        cold = [k for k, data in enumerate(out) if data is None]
        reads = [cold_reads().submit(self._read_at, indices[k], *places[k], field) for k in cold]

        def wait() -> list[bytes]:
            for k, read in zip(cold, reads):
                out[k] = read.result()
            return out  # type: ignore[return-value]
        return PendingReads(wait=wait, pending=reads)

    def read_batches(self, batches: Iterable[Sequence[int]], field: str | None = None, *,
                     checked: bool = True) -> Iterator[list[bytes]]:
        """The payloads of each batch in turn (checked as ``read_many`` does; ``checked=False``:
        as stored), the next batch's reads in flight while this one is used: no wait for a
        batch's slowest read with the disk or store idle behind it. A batch that cannot be read
        raises in its turn, after the batches before it."""
        pending: deque[tuple[Sequence[int], PendingReads]] = deque()
        try:
            for indices in batches:
                pending.append((indices, self.start_reads(indices, field)))
                if len(pending) > 1:
                    yield self._finish_reads(*pending.popleft(), field, checked)
            if pending:
                yield self._finish_reads(*pending.popleft(), field, checked)
        finally:
            for _, left in pending:  # an iteration stopped early, or a batch that raised
                left.cancel()

    def _finish_reads(self, indices: Sequence[int], pending: PendingReads, field: str | None,
                      checked: bool) -> list[bytes]:
        raw = pending.result()
        return [self._checked(i, data, field) for i, data in zip(indices, raw)] if checked else raw

    def _places(self, indices: Sequence[int], field: str | None) -> list[tuple[Any, int, int]]:
        """``locate`` for each record of a batch; a remote batch's new shards opened side by side first."""
        if self.remote is not None:
            self.open_shards(self.index.shard[list(indices)])
        return [self.locate(i, field) for i in indices]

    def locate(self, i: int, field: str | None = None) -> tuple[Any, int, int]:
        """``(descriptor, offset, size)`` of record ``i``'s bytes (``field``: its file field's) in
        its shard file (a RemoteShard in place of the descriptor for a remote dataset); a record
        the shard does not hold as the index says raises CorruptRecordError."""
        raise NotImplementedError

    def will_read(self, indices: Sequence[int], field: str | None = None) -> None:
        """Ask the kernel to start reading records ``indices`` from disk now, all at once
        (``POSIX_FADV_WILLNEED``: it returns at once), so that the reads that follow one by one
        find them in the page cache instead of each waiting for the disk in turn. A hint only:
        records it cannot locate are left to the read to report. Costs ~2.5 µs a record when
        they are cached already; a batch of cold ~100 KB photos decodes 1.2x faster with it.
        (A remote dataset needs no hint: ``read_raw`` fetches a whole batch at once.)"""
        if self.remote is not None:
            return
        places = []
        for i in indices:
            try:
                places.append(self.locate(i, field))
            except (CorruptRecordError, OSError):
                continue
        will_need(places)

    def _read_at(self, i: int, fd: int, offset: int, size: int, field: str | None = None) -> bytes:
        try:
            data = os.pread(fd, size, offset)
        except OSError as exc:
            raise self.corrupt(i, f"read failed ({exc.strerror})", field) from None
        if len(data) != size:
            raise self.corrupt(i, f"shard file ends early ({len(data)} of {size} bytes)", field)
        return data

    def where(self, i: int, field: str | None = None) -> str:
        """``shard-00001.lmdb record 17 (cat/003.jpg)``: the context every record error carries
        (``... field 'mask'`` for a file field's file)."""
        record = f"{self._shard_paths[int(self.index.shard[i])]} record {i} ({self.index.path[i]})"
        return record if field is None else f"{record} field {field!r}"

    def corrupt(self, i: int, what: str, field: str | None = None) -> CorruptRecordError:
        return CorruptRecordError(f"{self.where(i, field)}: {what}; run `fastload verify {self.root}` "
                                  "and re-pack the dataset if it is damaged")

    def close(self) -> None:
        if self.remote is not None:
            self.remote.stop_fill()
        with _open_lock:
            if self._pid == os.getpid():
                for handle in self._handles.values():
                    self.close_handle(handle)
            self._handles = {}

    def close_handle(self, handle: Any) -> None:
        handle.close()


_open_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
