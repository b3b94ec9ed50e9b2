"""A damaged dataset directory: every file of it (manifest, each index column, shards) missing,
emptied, cut in half, overwritten with other bytes or with one byte flipped. Each case is a clear
FastloadError when the dataset is opened, or, for shard bytes changed in place (same size, which
only reading them can tell), a CorruptRecordError/ManifestError on read, never a crash or wrong data.

(Format versions, hostile paths and crafted index columns: tests/format/test_manifest.py.)
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import fastload
from fastload.errors import CorruptRecordError, DatasetNotFoundError, ManifestError
from fastload.format import read_manifest

from .conftest import in_child

STORAGES = ["lmdb", "hdf5"]


def _missing(path: Path) -> None:
    path.unlink()


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _longer(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 100)


def _garbled(path: Path) -> None:
    path.write_bytes(random.Random(path.name).randbytes(path.stat().st_size))


def _flipped(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x20
    path.write_bytes(bytes(data))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "missing": _missing, "empty": _empty, "half": _half, "longer": _longer, "garbled": _garbled,
    "flipped": _flipped,
}


def files_of(dataset: Path) -> list[str]:
    """Every file a reader uses: the manifest, each index column, the first and the last shard."""
    manifest = read_manifest(dataset)
    return (["manifest.json"] + sorted(entry.file for entry in manifest.index.values())
            + [manifest.shards[0].file, manifest.shards[-1].file])


def test_the_cases_cover_every_index_column(id_set):
    assert len(files_of(id_set("lmdb"))) == 1 + 10 + 2  # 8 numeric columns, path offsets + blob


def read_everything(ds: fastload.PackedDataset | Path, expected: list[bytes]) -> tuple[list[str], list[int]]:
    """Read every record (in a child: a damaged memory-mapped file may kill the process that reads
    it): the documented errors met, and the records that came back different."""
    ds = ds if isinstance(ds, fastload.PackedDataset) else fastload.PackedDataset(ds)
    errors, wrong = set(), []
    for i in range(len(ds)):
        try:
            if ds.record(i)["data"] != expected[i]:
                wrong.append(i)
        except (CorruptRecordError, ManifestError) as exc:
            errors.add(type(exc).__name__)
    return sorted(errors), wrong


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_a_clear_error(id_set, tmp_path, storage, damage):
    original = id_set(storage)
    reference = fastload.PackedDataset(original)
    expected = [reference.record(i)["data"] for i in range(len(reference))]
    failures = []
    for name in files_of(original):
        dataset = shutil.copytree(original, tmp_path / name.replace("/", "_"))
        DAMAGE[damage](dataset / name)
        try:
            fastload.PackedDataset(dataset)
        except (ManifestError, DatasetNotFoundError) as exc:
            message = str(exc)
            if not message.startswith(str(dataset)) or ("re-pack" not in message
                                                        and "fastload pack" not in message):
                failures.append(f"{name}: unclear message: {message}")
            continue
        except Exception as exc:  # noqa: BLE001 - any other error is the failure this test looks for
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if name.startswith("shard-") and damage in ("garbled", "flipped"):
            # Same size: opening cannot tell; every read must (in a child that may crash).
            errors, wrong = in_child(read_everything, dataset, expected)
            # A flipped byte may sit in a shard's free space and change nothing; garbage may not.
            if wrong or (damage == "garbled" and not errors):
                failures.append(f"{name}: read errors {errors}, records read wrong: {wrong}")
        elif name == "manifest.json" and damage == "flipped":
            continue  # judged by the fuzz test (test_fuzz.py): a flip in a free-text field is not damage
        else:
            failures.append(f"{name}: opened without an error")
    assert not failures, "\n".join(failures)


def test_a_directory_where_a_file_should_be(id_set, tmp_path):
    for name in ("manifest.json", "index/label.npy", read_manifest(id_set()).shards[0].file):
        dataset = shutil.copytree(id_set(), tmp_path / name.replace("/", "_"))
        (dataset / name).unlink()
        (dataset / name).mkdir()
        with pytest.raises(ManifestError, match=str(dataset / name)):
            fastload.PackedDataset(dataset)


def test_a_missing_index_folder_or_an_empty_directory(id_set, tmp_path):
    dataset = shutil.copytree(id_set(), tmp_path / "no-index")
    shutil.rmtree(dataset / "index")
    with pytest.raises(ManifestError, match=r"index column 'label' cannot be read \(No such file"):
        fastload.PackedDataset(dataset)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="is empty, not a packed dataset"):
        fastload.PackedDataset(tmp_path / "empty")


def test_a_shard_damaged_after_open_is_found_by_its_first_read(id_set, tmp_path):
    """Opening checks sizes once; a shard cut short later (another process, a full disk) is an
    error on read, not a crash (were a shard memory-mapped, reading past its end would be SIGBUS)."""
    for storage in STORAGES:
        dataset = shutil.copytree(id_set(storage), tmp_path / storage)
        ds = fastload.PackedDataset(dataset)
        expected = [ds.record(i)["data"] for i in range(len(ds))]
        ds = fastload.PackedDataset(dataset)
        for info in ds.manifest.shards:
            _half(dataset / info.file)
        errors, wrong = in_child(read_everything, ds, expected)
        assert errors and not wrong, (storage, errors, wrong)


def test_a_damaged_lmdb_page_pointer_is_an_error_not_a_crash(id_set, tmp_path):
    """Found by test_fuzz.py: the high byte of the first node offset of a leaf page changed."""
    dataset = shutil.copytree(id_set("lmdb"), tmp_path / "ds")
    reference = fastload.PackedDataset(id_set("lmdb"))
    expected = [reference.record(i)["data"] for i in range(len(reference))]
    path = dataset / read_manifest(dataset).shards[0].file
    data = bytearray(path.read_bytes())
    page = 4096
    leaves = [start for start in range(2 * page, len(data), page)  # after the two meta pages
              if int.from_bytes(data[start + 10:start + 12], "little") == 0x02]  # mp_flags == P_LEAF
    start = leaves[-1]
    assert start + 0xC000 > len(data)  # where the changed pointer will point: past the end
    data[start + 17] ^= 0xC0  # mp_ptrs[0], high byte
    path.write_bytes(bytes(data))
    errors, wrong = in_child(read_everything, dataset, expected)
    assert errors and not wrong


def test_every_changed_byte_of_lmdb_page_headers_is_refused_or_harmless(id_set, tmp_path):
    """Each byte of the header and node pointers of every branch and leaf page, inverted in turn:
    the page walk refuses the shard when it opens, or reading it in a child neither crashes nor
    returns wrong bytes."""
    from fastload.readers.lmdb_pages import DamagedShard, locate_records

    source = id_set("lmdb")
    reference = fastload.PackedDataset(source)
    expected = [reference.record(i)["data"] for i in range(len(reference))]
    name, count = read_manifest(source).shards[0].file, read_manifest(source).shards[0].num_records
    pristine = (source / name).read_bytes()
    page = 4096
    tree_pages = [start for start in range(2 * page, len(pristine), page)
                  if int.from_bytes(pristine[start + 10:start + 12], "little") in (0x01, 0x02)]
    assert tree_pages
    refused, harmless = 0, []
    for start in tree_pages:
        for at in range(start, start + 32):
            data = bytearray(pristine)
            data[at] ^= 0xFF
            probe = tmp_path / "probe.lmdb"
            probe.write_bytes(bytes(data))
            fd = os.open(probe, os.O_RDONLY)
            try:
                locate_records(lambda offset, size: os.pread(fd, size, offset), len(data), count)
                harmless.append(at)
            except DamagedShard:
                refused += 1
            finally:
                os.close(fd)
    assert refused >= 2 * len(tree_pages)  # each page's bounds and first pointer at least
    for at in harmless[::max(1, len(harmless) // 16)]:  # let through: page number, padding, ...
        dataset = shutil.copytree(source, tmp_path / f"ds{at}")
        data = bytearray(pristine)
        data[at] ^= 0xFF
        (dataset / name).write_bytes(bytes(data))
        errors, wrong = in_child(read_everything, dataset, expected)
        assert not wrong, (at, errors, wrong)
