"""Shard writers against their plan: payloads that fit, overflow it, or leave much of it unused."""

from __future__ import annotations

import os
import threading

import h5py
import numpy as np
import pytest

from fastload.converters import pack
from fastload.converters.writers import WRITERS
from fastload.converters.writers.behind import WriteBehind, WriteFailed
from fastload.converters.writers.hdf5 import _SLACK_BYTES
from fastload import PackedDataset
from fastload.format import HDF5_DATA, HDF5_OFFSETS
from fastload.verifier import verify
from tests.conftest import make_jpeg, make_png, write_tree


def _payloads(count: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes() for _ in range(count)]


def _hdf5_contents(path) -> tuple[list[bytes], int]:
    with h5py.File(path, "r") as f:
        data, offsets = f[HDF5_DATA], f[HDF5_OFFSETS][()]
        capacity = data.shape[0]
        offset = data.id.get_offset()
    with open(path, "rb") as raw:
        blob = raw.read()
    return [blob[offset + a:offset + b] for a, b in zip(offsets[:-1], offsets[1:])], capacity


@pytest.mark.parametrize("planned", ["exact", "too small", "much too large"])
def test_hdf5_writer_holds_every_payload_whatever_the_plan(tmp_path, planned):
    payloads = _payloads(50)
    total = sum(map(len, payloads))
    planned_bytes = {"exact": total, "too small": total // 3, "much too large": total + 2 * _SLACK_BYTES}[planned]
    writer = WRITERS["hdf5"](tmp_path / "s.h5", planned_bytes)
    offsets = [writer.append(p) for p in payloads]
    file_bytes, data_offset = writer.finish()
    stored, capacity = _hdf5_contents(tmp_path / "s.h5")
    assert stored == payloads
    assert offsets == list(np.cumsum([0] + [len(p) for p in payloads])[:-1])
    assert capacity == total  # overflow and large slack both end in an exact-size dataset
    assert file_bytes == os.path.getsize(tmp_path / "s.h5") and not (tmp_path / "s.h5.exact").exists()


def test_hdf5_writer_abort_leaves_no_side_file(tmp_path):
    writer = WRITERS["hdf5"](tmp_path / "s.h5", 10)
    for p in _payloads(5):
        writer.append(p)  # past the plan: held for the exact rewrite
    writer.abort()
    assert [p.name for p in tmp_path.iterdir()] == ["s.h5"]  # the pack deletes its .tmp shard itself


@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_reencode_that_grows_files_packs_every_record(tmp_path, storage):
    # Quality 100 re-encodes of quality-20 JPEGs (and PNGs) outgrow the shard plan, made from source sizes.
    files = {f"c{i % 2}/img{i}.jpg": make_jpeg(120, 90, seed=i, quality=20) for i in range(12)}
    files["c0/flat.png"] = make_png(80, 60, seed=99)
    write_tree(tmp_path / "src", files)
    report = pack(tmp_path / "src", tmp_path / "out", format=storage, quality=100, progress=False)
    ds = PackedDataset(tmp_path / "out")
    assert report.num_records == len(ds) == len(files)
    assert int(ds.index.size.sum()) > sum(len(b) for b in files.values())
    assert verify(tmp_path / "out", decode=True).ok


def test_skipped_files_leave_no_holes_that_verify_minds(tmp_path):
    files = {f"c/ok{i}.jpg": make_jpeg(64, 48, seed=i) for i in range(6)}
    files.update({f"c/bad{i}.jpg": b"not an image" * 400 for i in range(6)})
    write_tree(tmp_path / "src", files)
    report = pack(tmp_path / "src", tmp_path / "out", format="hdf5", on_error="skip", progress=False)
    assert (report.num_records, report.skipped) == (6, 6)
    ds = PackedDataset(tmp_path / "out")
    assert sorted(ds.record(i)["data"] for i in range(6)) == sorted(files[f"c/ok{i}.jpg"] for i in range(6))
    assert verify(tmp_path / "out").ok


# --- write-behind: the writer thread ----------------------------------------------------------------

class _FailingWriter:
    """A real HDF5 writer whose disk 'fills' at the third payload."""

    def __init__(self, path, planned):
        self.inner = WRITERS["hdf5"](path, planned)
        self.count = 0

    def append(self, payload):
        self.count += 1
        if self.count == 3:
            raise OSError(28, "No space left on device")
        return self.inner.append(payload)

    def finish(self):
        return self.inner.finish()

    def abort(self):
        self.inner.abort()


def _shard(behind, tmp_path, name, payloads, make=None, finished=None):
    path = tmp_path / (name + ".tmp")
    done = (lambda size, offset: finished.append((name, size))) if finished is not None else (lambda *a: None)
    behind.start_shard(name, make or (lambda: WRITERS["hdf5"](path, sum(map(len, payloads)))), done,
                       lambda: path.unlink(missing_ok=True))
    for p in payloads:
        behind.append(p)
    return path


def test_write_behind_reports_a_writer_error_with_its_shard(tmp_path):
    behind = WriteBehind()
    path = tmp_path / "bad.tmp"
    behind.start_shard("bad", lambda: _FailingWriter(path, 10_000), lambda *a: None,
                       lambda: path.unlink(missing_ok=True))
    with pytest.raises(WriteFailed) as failed:
        for p in _payloads(200):
            behind.append(p)
        behind.end_shard()
        behind.close()
    assert failed.value.shard == "bad" and failed.value.cause.errno == 28
    behind.cancel()
    assert not path.exists()  # the partial shard is removed


def test_cancel_finishes_ended_shards_and_removes_the_open_one(tmp_path):
    behind, finished = WriteBehind(), []
    whole = _payloads(30, seed=1)
    first = _shard(behind, tmp_path, "first", whole, finished=finished)
    behind.end_shard()
    second = _shard(behind, tmp_path, "second", _payloads(30, seed=2), finished=finished)
    behind.cancel()  # the packing thread failed while reading the second shard's files
    assert finished == [("first", os.path.getsize(first))]
    assert _hdf5_contents(first)[0] == whole
    assert not second.exists()


def test_cancel_drops_queued_shards_instead_of_writing_them_first(tmp_path):
    # Ctrl-C should stop a pack soon, not after the 64 MB of queued payloads are written.
    behind, finished, gate = WriteBehind(), [], threading.Event()
    path = tmp_path / "first.tmp"

    def slow_make():
        gate.wait(60)
        return WRITERS["hdf5"](path, 10_000)

    behind.start_shard("first", slow_make, lambda *a: finished.append("first"),
                       lambda: path.unlink(missing_ok=True))
    for p in _payloads(30, seed=1):
        behind.append(p)
    behind.end_shard()
    queued = [_shard(behind, tmp_path, f"queued{k}", _payloads(10, seed=k), finished=finished)
              for k in range(3)]
    behind.end_shard()
    threading.Timer(0.2, gate.set).start()  # the writer is still opening "first" when cancel comes
    behind.cancel(finish_queued=False)
    assert finished == [] and not path.exists() and not any(q.exists() for q in queued)


def test_hdf5_exact_rewrite_works_where_copy_file_range_does_not(tmp_path, monkeypatch):
    # Some network and FUSE file systems refuse copy_file_range (ENOSYS, EXDEV, EOPNOTSUPP).
    import errno

    def refuse(*args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    payloads = _payloads(40, seed=3)
    writer = WRITERS["hdf5"](tmp_path / "s.h5", sum(map(len, payloads)) // 2)  # overflows: rewrite
    for p in payloads:
        writer.append(p)
    writer.finish()
    stored, capacity = _hdf5_contents(tmp_path / "s.h5")
    assert stored == payloads and capacity == sum(map(len, payloads))


def test_close_calls_while_waiting_until_the_writer_is_done_and_lets_its_exception_through(tmp_path):
    # The packer checks for Ctrl-C there: an interrupt must not wait for every queued shard.
    behind, gate, calls = WriteBehind(), threading.Event(), []
    path = tmp_path / "slow.tmp"

    def slow_make():
        gate.wait(60)
        return WRITERS["hdf5"](path, 10_000)

    behind.start_shard("slow", slow_make, lambda *a: None, lambda: path.unlink(missing_ok=True))
    behind.end_shard()

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        behind.close(while_waiting=interrupted)  # the writer is held at the gate the whole time
    gate.set()
    behind.cancel(finish_queued=False)
    assert len(calls) == 3 and not path.exists()
