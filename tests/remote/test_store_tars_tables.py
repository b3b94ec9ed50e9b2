"""WebDataset tars and tables (Parquet, Arrow/Feather, save_to_disk folders) in an object store as
pack sources (issue 27): packed from their s3:// URLs (a brace list, a prefix, one object) to the
records the same files pack to from disk; a Parquet file read by ranged GETs (never whole); a
missing or damaged object named by its URL."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from fastload.converters import pack
from fastload.converters.sources.store_files import StoreFile

import fastload
from fastload.errors import SourceError, SourceNotFoundError
from fastload.storage.remote import RemoteStore
from tests.converters.test_tables import _samples as table_samples
from tests.converters.test_tables import _table
from tests.converters.test_webdataset import COUNT, PER_TAR, write_tars
from tests.converters.test_webdataset import _samples as tar_samples

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def made(s3_server, tmp_path_factory):
    """The same tars and Parquet tables on disk and in a bucket (beside a README the prefix ignores)."""
    root = tmp_path_factory.mktemp("store-sources")
    bucket = s3_server.make_bucket(f"fastload-{uuid.uuid4().hex[:20]}")
    client = s3_server.client()
    tars = write_tars(root / "shards", tar_samples())
    (root / "tables").mkdir()
    table = _table(table_samples())
    pq.write_table(table, root / "table.parquet", row_group_size=5)
    pq.write_table(table.slice(0, 7), root / "tables" / "a.parquet", row_group_size=3)
    pq.write_table(table.slice(7), root / "tables" / "b.parquet")
    for path in [*tars, root / "table.parquet", *sorted((root / "tables").iterdir())]:
        client.put_object(Bucket=bucket, Key=path.relative_to(root).as_posix(), Body=path.read_bytes())
    client.put_object(Bucket=bucket, Key="shards/README.txt", Body=b"made by the tests")
    return root, f"s3://{bucket}", s3_server.storage_options()


def _same(a: fastload.PackedDataset, b: fastload.PackedDataset) -> None:
    assert len(a) == len(b) and a.manifest.fields == b.manifest.fields and a.classes == b.classes
    for i in range(len(a)):
        x, y = a.record(i), b.record(i)
        assert x.keys() == y.keys()
        for key in x:
            assert np.array_equal(x[key], y[key]) if isinstance(x[key], np.ndarray) else x[key] == y[key], key


def test_tars_pack_from_a_brace_list_and_a_prefix_as_from_disk(made, tmp_path):
    root, url, opts = made
    local = pack(f"{root}/shards/data-{{000000..000002}}.tar", tmp_path / "local.fl", progress=False,
                 sidecar_names={"png": "mask"})
    braces = pack(f"{url}/shards/data-{{000000..000002}}.tar", tmp_path / "braces.fl", progress=False,
                  storage_options=opts, sidecar_names={"png": "mask"})
    prefix = pack(f"{url}/shards/", tmp_path / "prefix.fl", progress=False, storage_options=opts,
                  sidecar_names={"png": "mask"})
    assert local.num_records == braces.num_records == prefix.num_records == COUNT
    assert prefix.ignored == {".txt": 1} and braces.skipped == prefix.skipped == 0
    expected = fastload.PackedDataset(tmp_path / "local.fl")
    assert expected.record(PER_TAR)["path"] == "data-000001.tar/000005.jpg" and "mask" in expected.manifest.fields
    for name in ("braces.fl", "prefix.fl"):
        _same(fastload.PackedDataset(tmp_path / name), expected)
    assert fastload.verify(tmp_path / "prefix.fl", decode=True).ok


def test_parquet_packs_from_an_object_and_a_prefix_as_from_disk(made, tmp_path):
    root, url, opts = made
    for src, name in ((f"{root}/table.parquet", "one"), (f"{root}/tables", "parts")):
        pack(src, tmp_path / f"{name}-local.fl", progress=False)
    pack(f"{url}/table.parquet", tmp_path / "one.fl", progress=False, storage_options=opts)
    pack(f"{url}/tables/", tmp_path / "parts.fl", progress=False, storage_options=opts)
    for name in ("one", "parts"):
        _same(fastload.PackedDataset(tmp_path / f"{name}.fl"), fastload.PackedDataset(tmp_path / f"{name}-local.fl"))
    assert fastload.PackedDataset(tmp_path / "parts.fl").record(8)["path"] == "b.parquet/000001"


def test_a_parquet_object_is_read_by_ranges_never_whole(made, tmp_path):
    _, url, opts = made
    from fastload.converters.sources.table_files import ParquetTable

    blobs = [np.random.default_rng(i).bytes(50_000) for i in range(20)]  # 1 MB in row groups of 100 KB
    pq.write_table(pa.table({"jpg": blobs, "n": list(range(20))}), tmp_path / "big.parquet", row_group_size=2)
    store = RemoteStore(url, opts)
    store.put_file(tmp_path / "big.parquet", "big.parquet")
    fetched: list[int] = []
    read_ranges = store.read_ranges
    store.read_ranges = lambda ranges: fetched.extend(r[2] for r in ranges) or read_ranges(ranges)  # type: ignore[method-assign]
    size = (tmp_path / "big.parquet").stat().st_size
    table = ParquetTable(f"{url}/big.parquet", "big.parquet", StoreFile(store, "big.parquet", size), 7)  # type: ignore[arg-type]
    assert table.num_rows == 20 and table.mtime_ns == 7 and sum(fetched) <= 64 * 1024  # the footer
    assert table.read(3, ["jpg"]).column(0).to_pylist() == blobs[6:8]
    assert sum(fetched) < size // 4  # the footer, then one row group's image column chunk


def test_a_missing_object_of_a_brace_list_is_named(made, tmp_path):
    _, url, opts = made
    with pytest.raises(SourceNotFoundError, match=rf"{url}/shards/data-000003.tar: no such object \(2 of the 5"):
        pack(f"{url}/shards/data-{{000000..000004}}.tar", tmp_path / "x.fl", progress=False, storage_options=opts)
    assert not (tmp_path / "x.fl").exists()


def test_a_damaged_tar_in_the_store_is_named_by_its_url(made, s3_server, tmp_path):
    root, url, opts = made
    data = (root / "shards" / "data-000000.tar").read_bytes()
    bucket = url.removeprefix("s3://")
    s3_server.client().put_object(Bucket=bucket, Key="damaged/data-000000.tar", Body=data[:len(data) // 2])
    with pytest.raises(SourceError, match=rf"^{url}/damaged/data-000000.tar: member 0000\d\d\.\w+ is truncated"):
        pack(f"{url}/damaged/data-000000.tar", tmp_path / "d.fl", progress=False, storage_options=opts)
    report = pack(f"{url}/damaged/data-000000.tar", tmp_path / "d.fl", progress=False, storage_options=opts,
                  on_error="skip")
    assert 0 < report.num_records < PER_TAR and report.skipped >= 1


def test_feather_arrow_streams_and_a_saved_dataset_pack_from_the_store_as_from_disk(made, tmp_path):
    """Arrow IPC files (Feather v2) and streams, and a save_to_disk folder (its data files in its
    state.json's order, not the listing's), each packed from the store to the records of the same
    files on disk; a DatasetDict prefix is refused with the split to name."""
    datasets = pytest.importorskip("datasets")
    feather = pytest.importorskip("pyarrow.feather")
    ipc = pytest.importorskip("pyarrow.ipc")
    root, url, opts = made
    table = _table(table_samples())
    local = tmp_path / "local"
    local.mkdir()
    feather.write_feather(table, local / "t.feather", chunksize=4)
    with ipc.new_stream(local / "s.arrow", table.schema) as stream:
        for batch in table.to_batches(max_chunksize=5):
            stream.write_batch(batch)
    saved = datasets.Dataset.from_list(table_samples())
    saved.save_to_disk(str(tmp_path / "saved"), max_shard_size="2KB")
    assert len(list((tmp_path / "saved").glob("*.arrow"))) > 1  # several data files, in state.json's order
    store = RemoteStore(f"{url}/ipc", opts)
    for path in [local / "t.feather", local / "s.arrow", *sorted((tmp_path / "saved").iterdir())]:
        store.put_file(path, path.relative_to(tmp_path).as_posix() if path.parent.name == "saved" else path.name)
    for name in ("t.feather", "s.arrow"):
        pack(local / name, tmp_path / f"{name}-local.fl", progress=False)
        pack(f"{url}/ipc/{name}", tmp_path / f"{name}.fl", progress=False, storage_options=opts)
        _same(fastload.PackedDataset(tmp_path / f"{name}.fl"), fastload.PackedDataset(tmp_path / f"{name}-local.fl"))
    pack(tmp_path / "saved", tmp_path / "saved-local.fl", progress=False, image_column="jpg")
    pack(f"{url}/ipc/saved/", tmp_path / "saved.fl", progress=False, storage_options=opts, image_column="jpg")
    _same(fastload.PackedDataset(tmp_path / "saved.fl"), fastload.PackedDataset(tmp_path / "saved-local.fl"))
    assert len(fastload.PackedDataset(tmp_path / "saved.fl")) == len(table)

    datasets.DatasetDict({"train": saved}).save_to_disk(str(tmp_path / "dict"))
    store.put_file(tmp_path / "dict" / "dataset_dict.json", "dict/dataset_dict.json")
    with pytest.raises(SourceError, match=r"/ipc/dict: a Hugging Face DatasetDict; pack one split at a time"):
        pack(f"{url}/ipc/dict/", tmp_path / "dict.fl", progress=False, storage_options=opts)
