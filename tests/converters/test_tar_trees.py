"""An ImageFolder tree inside a tar (issue 44, item 5): ``class/img.jpg`` members are labelled by
their class folder as a folder pack labels them, with the class names in the manifest, whether told
by ``--layout auto`` or asked for with ``--layout imagefolder``; a tree that is neither is refused
naming the ways, and samples packed without labels though their images lie in folders say so."""

from __future__ import annotations

import io
import tarfile
import warnings

import pytest
from fastload.converters import pack

import fastload
from fastload.errors import SourceError
from tests.conftest import imagefolder_files, make_jpeg, write_tree

CLASSES = {"cat": 3, "dog": 2, "emu": 2}


def _tar(path, members: dict[str, bytes], folders: tuple[str, ...] = ()) -> None:
    mode = "w:gz" if path.name.endswith(".gz") else "w"
    with tarfile.open(path, mode) as archive:
        for name in folders:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            archive.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """An ImageFolder tree's files, and the labels and classes a folder pack gives them."""
    root = tmp_path_factory.mktemp("tree")
    files = imagefolder_files(CLASSES, size=(24, 16))
    write_tree(root / "images", files)
    pack(root / "images", root / "folder.fl", progress=False)
    ds = fastload.PackedDataset(root / "folder.fl")
    labels = {ds.record(i)["path"]: ds.record(i)["label"] for i in range(len(ds))}
    return root, files, labels, ds.manifest.classes


def _records(out):
    ds = fastload.PackedDataset(out)
    return ds, {ds.record(i)["path"]: ds.record(i) for i in range(len(ds))}


@pytest.mark.parametrize("name, top", [("t.tar", ""), ("t.tar.gz", "train/"), ("t.tar.gz", "./")])
def test_a_tar_of_a_class_tree_is_labelled_by_its_folders_as_a_folder_pack(tree, tmp_path, name, top):
    """Before: read as WebDataset, every label -1, no word."""
    _, files, labels, classes = tree
    path = tmp_path / name
    _tar(path, {top + rel: data for rel, data in files.items()},
         folders=tuple(top + c for c in CLASSES) + ((top.rstrip("/"),) if top == "train/" else ()))
    report = pack(path, tmp_path / "out.fl", progress=False)
    assert report.num_records == len(files) and report.skipped == 0
    ds, records = _records(tmp_path / "out.fl")
    assert ds.manifest.classes == classes == sorted(CLASSES) and ds.manifest.packed["layout"] == "imagefolder"
    assert {p.removeprefix(f"{name}/{top}"): r["label"] for p, r in records.items()} == labels
    assert all(r["data"] == files[p.removeprefix(f"{name}/{top}")] for p, r in records.items())
    assert fastload.verify(tmp_path / "out.fl").ok


def test_layout_imagefolder_reads_a_tar_and_a_folder_of_tars(tree, tmp_path, cli):
    """Before: ``--layout imagefolder`` on a tar was refused ("not a kind of file fastload packs")."""
    _, files, labels, _ = tree
    src = tmp_path / "shards"
    src.mkdir()
    names = sorted(files)
    _tar(src / "part-0.tar", {rel: files[rel] for rel in names[:4]})  # cat's images alone
    _tar(src / "part-1.tar", {rel: files[rel] for rel in names[4:]})
    done = cli("pack", src / "part-0.tar", "-o", tmp_path / "one.fl", "--layout", "imagefolder")
    assert done.rc == 0, done.err
    assert fastload.PackedDataset(tmp_path / "one.fl").manifest.classes == ["cat", "dog"]  # dog/000.jpg is in it
    done = cli("pack", src, "-o", tmp_path / "all.fl", "--layout", "imagefolder")
    assert done.rc == 0, done.err
    ds, records = _records(tmp_path / "all.fl")
    assert ds.manifest.classes == sorted(CLASSES)
    assert {p.split("/", 1)[1]: r["label"] for p, r in records.items()} == labels


def test_images_both_in_class_folders_and_at_the_top_are_refused_naming_the_ways(tmp_path):
    jpeg = make_jpeg(16, 12)
    path = tmp_path / "mixed.tar"
    _tar(path, {"cat/a.jpg": jpeg, "dog/b.jpg": jpeg, "loose.jpg": jpeg})
    with pytest.raises(SourceError, match=r"mixed\.tar: holds both images in class folders \(cat/a\.jpg, \.\.\.\) "
                                          r"and images outside them \(loose\.jpg, \.\.\.\); pass --layout "
                                          r"imagefolder .* or --layout webdataset"):
        pack(path, tmp_path / "a.fl", progress=False)
    report = pack(path, tmp_path / "b.fl", layout="imagefolder", progress=False)
    assert report.num_records == 2 and fastload.PackedDataset(tmp_path / "b.fl").manifest.classes == ["cat", "dog"]
    with pytest.warns(UserWarning, match=r"mixed\.tar: its images lie in 2 folders .* with label -1"):
        report = pack(path, tmp_path / "c.fl", layout="webdataset", progress=False)
    assert report.num_records == 3


def test_a_tarred_folder_of_images_is_that_folder_not_one_class(tmp_path):
    """``tar cf images.tar images/`` of a flat folder: its images, unlabelled, without a word."""
    path = tmp_path / "flat.tar"
    _tar(path, {f"images/{k}.jpg": make_jpeg(16, 12, seed=k) for k in range(3)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = pack(path, tmp_path / "a.fl", progress=False)
    ds, records = _records(tmp_path / "a.fl")
    assert report.num_records == 3 and ds.manifest.classes is None and {r["label"] for r in records.values()} == {-1}


def test_samples_in_folders_without_labels_say_so_when_packed_unlabelled(tmp_path):
    jpeg = make_jpeg(16, 12)
    path = tmp_path / "captioned.tar"
    _tar(path, {"cat/a.jpg": jpeg, "cat/a.txt": b"a cat", "dog/b.jpg": jpeg, "dog/b.txt": b"a dog"})
    with pytest.warns(UserWarning, match=r"captioned\.tar: its images lie in 2 folders \(cat/a\.jpg, \.\.\.\) and no "
                                         r"sample has a \.cls label, so it is packed as WebDataset samples with "
                                         r"label -1; pass --layout imagefolder"):
        pack(path, tmp_path / "a.fl", progress=False)
    ds = fastload.PackedDataset(tmp_path / "a.fl")
    assert ds.manifest.classes is None and ds.record(0)["txt"] == "a cat"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pack(path, tmp_path / "b.fl", layout="imagefolder", progress=False)
    _, records = _records(tmp_path / "b.fl")
    assert {p: r["label"] for p, r in records.items()} == {"captioned.tar/cat/a.jpg": 0, "captioned.tar/dog/b.jpg": 1}
