"""Reliability fixtures: packed datasets whose labels are record numbers, and ways to damage copies."""

from __future__ import annotations

import queue as queue_module
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import flip_payload_byte
from tests.loading.helpers import write_id_list

RECORDS = 40  # labels are record numbers 0..39; several shards of a few records each


@pytest.fixture(scope="session")
def id_set(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``id_set(storage)`` → a read-only packed dataset of ``RECORDS`` pictures (JPEG and PNG,
    48-160 px) in several shards, whose label is the record number."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("reliability")
    listing = write_id_list(base / "pictures", RECORDS)
    made: dict[str, Path] = {}

    def get(storage: str = "lmdb") -> Path:
        if storage not in made:
            made[storage] = base / f"ids-{storage}.fl"
            pack(listing, made[storage], format=storage, shard_size="48KB", workers=2, progress=False)
        return made[storage]

    return get


@pytest.fixture
def damaged(id_set: Callable[[str], Path], tmp_path: Path) -> Callable[..., Path]:
    """``damaged(*records, storage="lmdb")`` → a private copy with one payload byte flipped in each
    of ``records`` (their checksums no longer match)."""

    def make(*records: int, storage: str = "lmdb") -> Path:
        out = shutil.copytree(id_set(storage), tmp_path / f"damaged-{storage}.fl")
        for record in records:
            flip_payload_byte(out, record)
        return out

    return make


def corrupt_png_body(data: bytes) -> bytes:
    """The same PNG with one byte of its compressed pixel data flipped: the header still reads
    (so the default pack check keeps it), the decode fails."""
    damaged = bytearray(data)
    damaged[damaged.find(b"IDAT") + 20] ^= 0xFF
    return bytes(damaged)


@pytest.fixture
def undecodable(tmp_path: Path) -> Callable[..., Path]:
    """``undecodable(*records, storage="lmdb")`` → a fresh pack of the id pictures in which each of
    ``records`` (PNGs: record numbers 4, 9, 14, ...) has intact bytes that do not decode."""
    from fastload.converters import pack

    def make(*records: int, storage: str = "lmdb") -> Path:
        listing = write_id_list(tmp_path / "pictures", RECORDS)
        for record in records:
            assert record % 5 == 4, "only every fifth picture is a PNG"
            path = listing.parent / f"img{record:04d}.png"
            path.write_bytes(corrupt_png_body(path.read_bytes()))
        out = tmp_path / f"undecodable-{storage}.fl"
        pack(listing, out, format=storage, shard_size="48KB", workers=2, progress=False)
        return out

    return make


def shard_of(dataset: Path, record: int) -> str:
    """The full path of the shard holding ``record``, as error messages name it."""
    from fastload.format import RecordIndex, read_manifest

    manifest = read_manifest(dataset)
    return str(dataset / manifest.shards[int(RecordIndex(dataset, manifest).shard[record])].file)


def _call_and_send(fn: Callable, args: tuple, queue) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # handed back, the test decides
        queue.put(("raised", f"{type(exc).__name__}: {exc}"))


def in_child(fn: Callable, *args: object, timeout: float = 120) -> object:
    """``fn(*args)`` in a forked child, for reads that may crash the process that does them (a damaged
    memory-mapped file); returns its result. A crash, hang or exception in the child fails the test."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_call_and_send, args=(fn, args, queue))
    child.start()
    outcome = None
    deadline = time.monotonic() + timeout
    while outcome is None and time.monotonic() < deadline:  # read before join: a big result
        try:                                                 # keeps the child until it is read
            outcome = queue.get(timeout=0.5)
        except queue_module.Empty:
            if not child.is_alive():  # died without a word: one last look, then report the crash
                try:
                    outcome = queue.get(timeout=1)
                except queue_module.Empty:
                    break
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        child.join()
    assert outcome is not None, f"the child process crashed or hung (exit {child.exitcode})"
    assert outcome[0] == "ok", f"the child raised {outcome[1]}"
    return outcome[1]
