"""Packing a map-style dataset (issue 27): a torch Dataset or a list of samples, read in worker
processes, reads back bit-exact as the Writer writes the same samples; the same index whatever the
workers or the item form; an item that raises named or skipped and counted; a pack killed with
kill -9 resumes to the index an uninterrupted one has, and a changed dataset is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data
from fastload.converters.sources.torch_dataset import is_sequence_source

import fastload
from fastload.errors import PackError, SourceError
from tests.conftest import REPO, make_jpeg

COUNT = 40
SHARD = "3KB"  # about four records a shard: many shards, many journal entries


class Photos(torch.utils.data.Dataset):
    """Generated JPEGs, a label and two fields; ``fail_at`` raises, ``delay`` slows each item,
    ``shift`` changes every image (a dataset that changed)."""

    def __init__(self, count: int = COUNT, form: str = "tuple", fail_at: int | None = None, delay: float = 0.0,
                 shift: int = 0) -> None:
        self.count, self.form, self.fail_at, self.delay, self.shift = count, form, fail_at, delay, shift

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> object:
        if i == self.fail_at:
            raise ValueError(f"cannot read photo {i}")
        time.sleep(self.delay)
        image, fields = make_jpeg(24 + i % 5, 20 + i % 3, seed=i + self.shift), {"caption": f"photo {i}", "n": i * 7}
        fields["mask"] = np.arange((20 + i % 3) * (24 + i % 5), dtype=np.uint8).reshape(20 + i % 3, 24 + i % 5) % 5
        if self.form == "tuple":
            return image, i % 3, fields
        return {"image": image, "label": i % 3, **fields}


def _pack(dataset: object, out: Path, **options: object) -> fastload.PackReport:
    return fastload.pack(dataset, out, shard_size=SHARD, progress=False, **options)


def _index(out: Path) -> dict[str, bytes]:
    """The index columns' files and each shard's bytes: equal for equal packs."""
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted((out / "index").rglob("*")) if p.is_file()}
    manifest = fastload.PackedDataset(out).manifest
    files["shards"] = repr([(s.file, s.num_records, s.records_digest) for s in manifest.shards]).encode()
    return files


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted pack of Photos() with two workers."""
    out = tmp_path_factory.mktemp("ref") / "ref.fl"
    report = _pack(Photos(), out, workers=2)
    assert report.num_records == COUNT and report.num_shards > 5 and report.skipped == 0
    return out


def test_a_torch_dataset_reads_back_as_the_writer_writes_its_samples(reference, tmp_path):
    with fastload.Writer(tmp_path / "w.fl") as w:
        for i in range(COUNT):
            image, label, fields = Photos()[i]
            w.write({"image": image, "label": label, **fields})
    packed, written = fastload.PackedDataset(reference), fastload.PackedDataset(tmp_path / "w.fl")
    assert packed.manifest.fields == written.manifest.fields == {"caption": "str", "n": "int64", "mask": "mask-rows"}
    assert packed.manifest.packed["layout"] == "dataset" and packed.manifest.kind == "images"
    for i in range(COUNT):
        a, b = packed.record(i), written.record(i)
        assert a["data"] == b["data"] == Photos()[i][0]
        for name in ("label", "caption", "n", "width", "height", "path", "mask"):
            assert a[name] == b[name]
    assert fastload.verify(reference, decode=True).ok


def test_tuples_dicts_a_list_and_one_or_two_workers_give_the_same_index(reference, tmp_path):
    want = _index(reference)
    _pack(Photos(form="dict"), tmp_path / "dicts.fl", workers=2)
    _pack(Photos(), tmp_path / "one.fl", workers=1)
    _pack([Photos(form="dict")[i] for i in range(COUNT)], tmp_path / "list.fl", workers=3)
    for name in ("dicts", "one", "list"):
        assert _index(tmp_path / f"{name}.fl") == want, name


def test_an_item_that_raises_is_named_or_skipped_and_counted(tmp_path):
    with pytest.raises(SourceError, match=r"dataset item 13: raised ValueError: cannot read photo 13; .*"
                                          r"on_error='skip'") as caught:
        _pack(Photos(fail_at=13), tmp_path / "a.fl", workers=2)
    # from a worker, the dataset's traceback comes as a note (an exception object may not cross processes)
    assert "in __getitem__" in "".join(getattr(caught.value, "__notes__", []))
    with pytest.raises(SourceError, match=r"dataset item 13: raised ValueError") as caught:
        _pack(Photos(fail_at=13), tmp_path / "c.fl", workers=1)
    assert isinstance(caught.value.__cause__, ValueError)  # read in this process: the dataset's own, chained
    report = _pack(Photos(fail_at=13), tmp_path / "b.fl", workers=2, on_error="skip")
    assert report.num_records == COUNT - 1 and report.skipped == 1
    assert report.skipped_files[0].rel == "00000013" and "item 13: raised ValueError" in report.skipped_files[0].reason
    ds = fastload.PackedDataset(tmp_path / "b.fl")
    assert ds.record(13)["caption"] == "photo 14" and ds.manifest.packed["skipped"] == 1


def _keyed(repeat: int, at: int) -> list[dict[str, object]]:
    """Photos as dicts with keys of their own; item ``at`` repeats item ``repeat``'s key."""
    items = [{**Photos(form="dict")[i], "__key__": f"photo-{i}"} for i in range(COUNT)]
    items[at]["__key__"] = f"photo-{repeat}"
    return items


def test_a_key_an_earlier_shard_has_is_named_or_skipped_as_in_one_process(tmp_path):
    # the workers write whole shards, each knowing only its own keys: the repeat is found in the
    # packing process, across shards (item 30 repeats item 2's key), and within one (9 repeats 8)
    for repeat, at in ((2, 30), (8, 9)):
        with pytest.raises(SourceError, match=rf"dataset item {at}: __key__ 'photo-{repeat}' was given to an "
                                              "earlier item; keys name one item each; fix the dataset"):
            _pack(_keyed(repeat, at), tmp_path / f"fail-{at}.fl", workers=2)
        assert not list((tmp_path / f"fail-{at}.fl").glob(".pack/*.tmp"))  # the workers' shards, removed
        one = _pack(_keyed(repeat, at), tmp_path / f"one-{at}.fl", workers=1, on_error="skip")
        two = _pack(_keyed(repeat, at), tmp_path / f"two-{at}.fl", workers=2, on_error="skip")
        assert one.num_records == two.num_records == COUNT - 1 and two.skipped == 1
        assert _index(tmp_path / f"two-{at}.fl") == _index(tmp_path / f"one-{at}.fl")
        assert f"item {at}: __key__ 'photo-{repeat}' was given" in two.skipped_files[0].reason


def test_fewer_shards_than_workers_are_written_here_from_the_workers_reads(tmp_path):
    # two shards, three workers: the items come back from the workers, this process writes them
    report = fastload.pack(Photos(), tmp_path / "three.fl", shard_size="40KB", workers=3, progress=False)
    assert report.num_shards == 2
    fastload.pack(Photos(), tmp_path / "one.fl", shard_size="40KB", workers=1, progress=False)
    assert _index(tmp_path / "three.fl") == _index(tmp_path / "one.fl")


def test_bad_items_and_sources_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(SourceError, match=r"dataset item 0: is a int; an item is a dict"):
        _pack([1, 2], tmp_path / "a.fl")
    with pytest.raises(SourceError, match=r"dataset item 1: field 'caption' is missing"):
        _pack([Photos()[0], (make_jpeg(8, 8), 1, {})], tmp_path / "b.fl", workers=1)
    with pytest.raises(SourceError, match=r"a generator is not a source fastload packs"):
        fastload.pack((x for x in []), tmp_path / "c.fl")
    with pytest.raises(ValueError, match=r"max_side= and restart_markers= are for packs of image files"):
        _pack(Photos(), tmp_path / "d.fl", max_side=64)
    with pytest.raises(PackError, match="none of the dataset's 2 items could be packed"):
        _pack([{"image": b"no"}, {"image": b"no"}], tmp_path / "e.fl", on_error="skip")


def test_a_hugging_face_dataset_still_goes_to_the_table_source():
    datasets = pytest.importorskip("datasets")
    assert not is_sequence_source(datasets.Dataset.from_dict({"x": [1]}))
    assert is_sequence_source(Photos()) and is_sequence_source([]) and not is_sequence_source("a/path")


_KILLED = """
import sys
import fastload
from tests.converters.test_pack_dataset import Photos, SHARD
fastload.pack(Photos(delay=float(sys.argv[2])), sys.argv[1], shard_size=SHARD, workers=2, progress=False)
"""


def _pack_in_a_process(out: Path, delay: float, kill_after: int | None) -> subprocess.Popen:
    """Pack Photos() in a new process; with ``kill_after``, kill -9 it once that many shards are journaled."""
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(out), str(delay)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE)
    if kill_after is not None:
        deadline = time.monotonic() + 240  # a guard against a hang, not a speed
        while len(list(out.glob(".pack/shard-*.json"))) < kill_after:
            assert proc.poll() is None, f"the pack ended before it was killed: {proc.stderr.read()!r}"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    return proc


def test_a_pack_killed_mid_way_resumes_to_the_index_of_an_uninterrupted_one(reference, tmp_path):
    out = tmp_path / "k.fl"
    assert _pack_in_a_process(out, 0.02, kill_after=3).returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()
    journaled = len(list(out.glob(".pack/shard-*.json")))
    report = _pack(Photos(), out, workers=2)
    assert report.resumed_shards >= journaled >= 3 and report.num_records == COUNT
    assert _index(out) == _index(reference)


def test_a_changed_dataset_is_refused_on_resume_and_overwrite_starts_over(reference, tmp_path):
    out = tmp_path / "c.fl"
    with pytest.raises(SourceError, match="dataset item 35"):  # an interrupted pack: shards 0..7 journaled
        _pack(Photos(fail_at=35), out, workers=2)
    assert list(out.glob(".pack/shard-*.json")) and not list(out.glob(".pack/*.tmp"))  # later shards removed
    with pytest.raises(SourceError, match=r"c.fl: item \d+ differs from what the interrupted pack wrote \(its image\); "
                                          r"the dataset is not deterministic, or changed: pass overwrite=True"):
        _pack(Photos(shift=1000), out, workers=2)
    with pytest.raises(SourceError, match=r"the dataset has 41 items, the interrupted pack 40: it changed"):
        _pack(Photos(COUNT + 1), out)
    report = _pack(Photos(), out, workers=1)  # the same dataset: resumed, finished
    assert report.resumed_shards > 0 and _index(out) == _index(reference)
    report = _pack(Photos(shift=1000), out, overwrite=True)
    assert report.resumed_shards == 0 and fastload.PackedDataset(out).record(0)["data"] == make_jpeg(24, 20, seed=1000)


def test_the_docs_example_packs_the_records_a_folder_pack_makes(tmp_path, monkeypatch):
    page = (REPO / "docs" / "python-api.md").read_text()
    example = page.split("### Packing a map-style dataset", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    for k in range(6):
        (tmp_path / "images" / f"class-{k % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / f"class-{k % 2}" / f"{k}.jpg").write_bytes(make_jpeg(20 + k, 16, seed=k))
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/python-api.md", "exec"), {"__name__": "docs_example"})  # noqa: S102 - the page's own example
    fastload.pack(tmp_path / "images", tmp_path / "folder.fl", progress=False)
    packed, folder = fastload.PackedDataset(tmp_path / "photos.fl"), fastload.PackedDataset(tmp_path / "folder.fl")
    assert len(packed) == len(folder) == 6 and packed.classes == folder.classes == ["class-0", "class-1"]
    for i in range(6):
        a, b = packed.record(i), folder.record(i)
        assert a["data"] == b["data"] and a["label"] == b["label"] and a["name"] == b["path"].split("/")[1]
