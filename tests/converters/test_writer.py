"""The Python writer (issue 27): samples written from code read back bit-exact, the same records as
the same samples packed from files; bad samples named or skipped and counted; a writer that raises
or is killed leaves no dataset, and an overwritten one stays until the new one is whole."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from fastload.converters import pack
from PIL import Image

import fastload
from fastload.errors import DatasetNotFoundError, FastloadError, PackError, SourceError
from tests.conftest import REPO, make_jpeg, make_png

COUNT = 8


def _mask_array(width: int, height: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 7, (height, width), dtype=np.uint8)


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "PNG")
    return out.getvalue()


def _samples(tmp_path) -> list[dict]:
    """Images as JPEG bytes, paths, PIL images and arrays; masks as arrays; typed fields."""
    out = []
    for i in range(COUNT):
        width, height = 40 + i, 30 + i % 4
        jpeg = make_jpeg(width, height, seed=i)
        image: object = jpeg
        if i % 4 == 1:
            image = tmp_path / f"given-{i}.jpg"
            image.write_bytes(jpeg)
        elif i % 4 == 2:
            image = Image.open(io.BytesIO(make_png(width, height, seed=i))).convert("RGB")
        elif i % 4 == 3:
            image = np.random.default_rng(i).integers(0, 256, (height, width, 3), dtype=np.uint8)
        out.append({"image": image, "label": i % 3, "caption": f"a photo, number {i}", "score": i / 4,
                    "n": i * 7, "mask": _mask_array(width, height, seed=i)})
    return out


def _stored_image(image: object) -> bytes:
    """What the writer stores for an image: bytes and files as given, pixels as lossless PNG."""
    if isinstance(image, bytes):
        return image
    if isinstance(image, os.PathLike):
        return open(image, "rb").read()
    array = np.asarray(image)
    return _png(array)


def _write(out, samples, **options):
    with fastload.Writer(out, **options) as w:
        for s in samples:
            w.write(s)
    return w.report


def test_written_samples_read_back_as_the_same_samples_packed_from_files(tmp_path):
    samples = _samples(tmp_path)
    report = _write(tmp_path / "w.fl", samples, shard_size="4KB", format="hdf5")
    assert report.num_records == COUNT and report.num_shards > 1 and report.skipped == 0
    files = tmp_path / "files"
    files.mkdir()
    with open(files / "list.csv", "w", newline="") as f:  # the same samples, as files and a list
        rows = csv.writer(f)
        rows.writerow(["path", "label", "caption", "score", "n", "mask"])
        for i, s in enumerate(samples):
            name = f"{i}.jpg" if _stored_image(s["image"]).startswith(b"\xff\xd8") else f"{i}.png"
            (files / name).write_bytes(_stored_image(s["image"]))
            (files / f"{i}-mask.png").write_bytes(_png(s["mask"]))
            rows.writerow([name, s["label"], s["caption"], s["score"], s["n"], f"{i}-mask.png"])
    pack(files / "list.csv", tmp_path / "f.fl", file_columns=["mask"], progress=False, format="hdf5")
    w, f = fastload.PackedDataset(tmp_path / "w.fl"), fastload.PackedDataset(tmp_path / "f.fl")
    assert w.manifest.fields == f.manifest.fields == {"caption": "str", "score": "float64", "n": "int64",
                                                      "mask": "mask-rows"}
    assert w.manifest.packed["layout"] == "writer" and w.manifest.kind == "images"
    assert w.manifest.packed["encoded"] == {"format": "PNG", "lossless": True, "images": COUNT // 2}
    for i, s in enumerate(samples):
        a, b = w.record(i), f.record(i)
        assert a["data"] == b["data"] == _stored_image(s["image"])
        assert a["mask"] == b["mask"] == _png(s["mask"])
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(a["mask"]))), s["mask"])  # class ids exact
        for name in ("label", "caption", "score", "n", "width", "height"):
            assert a[name] == b[name]
        assert a["path"] == f"{i:08d}"
    assert fastload.verify(tmp_path / "w.fl", decode=True).ok


def test_array_fields_npy_files_16_bit_masks_keys_and_class_names(tmp_path):
    depth = np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000
    embedding = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
    with fastload.Writer(tmp_path / "a.fl", classes=["cat", "dog"], fields={
            "boxes": "float64[*,4]", "depth": "mask", "emb": "npy", "raw": "file", "ok": "bool"}) as w:
        for k in range(3):
            w.write({"__key__": f"img-{k}", "image": make_png(4, 3, seed=k), "label": ["cat", "dog"][k % 2],
                     "boxes": [[0, 0, 2, 2]] * k, "depth": depth, "emb": embedding, "raw": b"\x00\x01" * k,
                     "ok": k > 0})
    ds = fastload.PackedDataset(tmp_path / "a.fl")
    assert ds.classes == ["cat", "dog"] and ds.record(1)["label"] == 1 and ds.record(2)["path"] == "img-2"
    r = ds.record(2)
    assert r["boxes"].shape == (2, 4) and r["raw"] == b"\x00\x01\x00\x01" and r["ok"] is True
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(r["depth"]))), depth)
    assert np.array_equal(np.load(io.BytesIO(r["emb"])), embedding)


def test_fields_named_with_number_labels_and_no_classes_keep_the_labels(tmp_path):
    # fields= types the fields; the first sample still says whether samples carry a label
    with fastload.Writer(tmp_path / "a.fl", fields={"n": "int64"}) as w:
        for k in range(3):
            w.write({"image": make_png(4, 3, seed=k), "label": 7 - k, "n": k})
    ds = fastload.PackedDataset(tmp_path / "a.fl")
    assert not ds.classes and [ds.record(i)["label"] for i in range(3)] == [7, 6, 5]


def test_jpeg_quality_is_used_and_recorded(tmp_path):
    array = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    with fastload.Writer(tmp_path / "j.fl", quality=80) as w:
        w.write({"image": array})
    ds = fastload.PackedDataset(tmp_path / "j.fl")
    assert ds.record(0)["data"][:2] == b"\xff\xd8" and ds.record(0)["label"] == -1
    assert ds.manifest.packed["encoded"] == {"format": "JPEG", "quality": 80, "images": 1}


@pytest.mark.parametrize("bad, message", [
    ({"image": b"jpeg?", "label": 1, "caption": "x"}, r"sample 2 \(key '00000002'\): its image: not a readable image"),
    ({"image": make_jpeg(8, 8), "label": 1}, r"sample 2 \(key '00000002'\): field 'caption' is missing"),
    ({"image": make_jpeg(8, 8), "label": 1, "caption": "x", "extra": 3}, r"sample 2 .*field 'extra' is new"),
    ({"image": make_jpeg(8, 8), "label": 1, "caption": 7}, r"sample 2 .*field 'caption' is int 7, the field holds str"),
    ({"image": make_jpeg(8, 8), "label": "dog", "caption": "x"}, r"sample 2 .*label is the text 'dog'; pass classes"),
    ({"__key__": "00000000", "image": make_jpeg(8, 8), "label": 1, "caption": "x"}, r"sample 2 .*was given to an earlier"),
])
def test_bad_samples_are_named_or_skipped_and_counted(tmp_path, bad, message):
    good = [{"image": make_jpeg(8, 8, seed=k), "label": k, "caption": f"c{k}"} for k in range(4)]
    with pytest.raises(SourceError, match=message):
        _write(tmp_path / "a.fl", [*good[:2], bad, *good[2:]])
    assert not (tmp_path / "a.fl").exists()  # given up: the new folder is gone again
    report = _write(tmp_path / "b.fl", [*good[:2], bad, *good[2:]], on_error="skip")
    assert report.num_records == 4 and report.skipped == 1 and report.skipped_files[0].rel == bad.get("__key__", "00000002")
    ds = fastload.PackedDataset(tmp_path / "b.fl")
    assert [ds.record(i)["caption"] for i in range(4)] == ["c0", "c1", "c2", "c3"]
    assert ds.manifest.packed["skipped"] == 1 and (tmp_path / "b.fl" / "skipped.jsonl").exists()


def test_bad_field_names_and_an_empty_writer_are_refused(tmp_path):
    with pytest.raises(SourceError, match=r"field name 'path' is taken"):
        _write(tmp_path / "a.fl", [{"image": make_jpeg(8, 8), "path": "x"}])
    with pytest.raises(PackError, match=r"no sample was written, 0 skipped"):
        _write(tmp_path / "b.fl", [])
    with pytest.raises(ValueError, match=r"fields\['x'\] = 'float32'"):
        fastload.Writer(tmp_path / "c.fl", fields={"x": "float32"})
    assert not any(p.exists() for p in (tmp_path / "a.fl", tmp_path / "b.fl", tmp_path / "c.fl"))


def test_an_exception_in_the_with_block_leaves_no_dataset_and_keeps_an_overwritten_one(tmp_path):
    out = tmp_path / "d.fl"
    _write(out, [{"image": make_jpeg(8, 8, seed=k), "label": k} for k in range(3)])
    with pytest.raises(PackError, match="already holds a finished dataset; pass overwrite=True"):
        fastload.Writer(out)
    with pytest.raises(RuntimeError, match="boom"), fastload.Writer(out, overwrite=True, shard_size="1KB") as w:
        for k in range(20):
            w.write({"image": make_jpeg(16, 16, seed=100 + k), "label": 0})
        raise RuntimeError("boom")
    ds = fastload.PackedDataset(out)
    assert len(ds) == 3 and ds.record(2)["data"] == make_jpeg(8, 8, seed=2)
    assert sorted(os.listdir(tmp_path)) == ["d.fl"]  # no staging folder left behind
    with pytest.raises(RuntimeError), fastload.Writer(tmp_path / "new.fl") as w:
        w.write({"image": make_jpeg(8, 8)})
        raise RuntimeError("boom")
    assert not (tmp_path / "new.fl").exists()
    _write(out, [{"image": make_jpeg(9, 9, seed=k), "label": 1} for k in range(5)], overwrite=True)
    assert len(fastload.PackedDataset(out)) == 5 and sorted(os.listdir(tmp_path)) == ["d.fl"]


_KILLED_WRITER = """
import sys, time
import fastload
from tests.conftest import make_jpeg
with fastload.Writer(sys.argv[1], shard_size="2KB", overwrite=True) as w:
    for k in range(100000):
        w.write({"image": make_jpeg(24, 24, seed=k % 50), "label": k % 3})
        time.sleep(0.001)
"""


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_killed_writer_leaves_no_readable_dataset_and_a_rerun_works(tmp_path, overwrite):
    out = tmp_path / "k.fl"
    old = [{"image": make_jpeg(8, 8, seed=k), "label": k} for k in range(2)]
    if overwrite:
        _write(out, old)
    watched = tmp_path / ".k.fl.fastload-new" if overwrite else out
    _run_and_kill(out, watched)
    if overwrite:  # the old dataset is whole; the killed replacement's shards sit in its staging folder
        ds = fastload.PackedDataset(out)
        assert len(ds) == 2 and ds.record(1)["data"] == old[1]["image"]
    else:
        with pytest.raises((DatasetNotFoundError, FastloadError), match="unfinished pack"):
            fastload.PackedDataset(out)
    report = _write(out, [{"image": make_jpeg(8, 8, seed=k), "label": 0} for k in range(4)], overwrite=overwrite)
    assert report.num_records == 4 and len(fastload.PackedDataset(out)) == 4
    assert sorted(os.listdir(tmp_path)) == ["k.fl"]
    assert not list(out.glob(".pack*"))


def _run_and_kill(out, watched) -> None:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED_WRITER), str(out)],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    deadline = time.monotonic() + 240  # a guard against a hang, not a speed
    while not list(watched.glob("shard-*")):
        assert proc.poll() is None, "the writer ended before it was killed"
        assert time.monotonic() < deadline, "the writer wrote no shard"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.parametrize("values, message", [
    ([0.5, 2**53 + 1], (r"field 'x' is 9007199254740993, which float64 .* cannot hold exactly \(it would be "
                        r"9007199254740992\)")),
    ([0.5, float("nan")], r"field 'x' is nan, not a finite number"),
    ([[0.5], [1.0, 2**53 + 1]], r"field 'x' holds 9007199254740993, which float64"),
    ([[0.5], np.array([np.inf])], r"field 'x' holds inf, not a finite number"),
], ids=["scalar", "nan", "list", "array"])
def test_a_number_float64_cannot_hold_is_refused_as_a_file_list_refuses_it(tmp_path, values, message):
    """Issue 37, item 3: the Writer keeps a number as given or refuses it, by the list pack's rule."""
    samples = [{"image": make_jpeg(8, 8, seed=k), "x": v} for k, v in enumerate(values)]
    with pytest.raises(SourceError, match=rf"sample 1 \(key '00000001'\): {message}"):
        _write(tmp_path / "a.fl", samples)
    report = _write(tmp_path / "b.fl", samples, on_error="skip")
    assert report.num_records == 1 and report.skipped == 1
    assert fastload.PackedDataset(tmp_path / "b.fl").record(0)["x"] == pytest.approx(values[0])


def test_a_path_that_cannot_be_read_is_named_and_skippable(tmp_path):
    """Issue 37: a field naming /proc/self/environ (or any unreadable path), in the first sample
    (whose values type the fields) or a later one, is a bad sample naming it, skipped under 'skip'."""
    from pathlib import Path

    environ, missing = Path("/proc/self/environ"), tmp_path / "gone.png"
    samples = [{"image": make_jpeg(8, 8, seed=0), "mask": environ},
               {"image": make_jpeg(8, 8, seed=1), "mask": make_png(8, 8)},
               {"image": make_jpeg(8, 8, seed=2), "mask": missing}]
    with pytest.raises(SourceError, match=r"^sample 0 \(key '00000000'\): field 'mask': /proc/self/environ "
                                          r"cannot be read \(.*\); fix the sample, or pass on_error='skip'"):
        _write(tmp_path / "a.fl", samples)
    report = _write(tmp_path / "b.fl", samples, on_error="skip")
    assert report.num_records == 1 and report.skipped == 2
    assert [(s.rel, s.reason.split(":")[0]) for s in report.skipped_files] == [("00000000", "field 'mask'"),
                                                                               ("00000002", "field 'mask'")]
    assert str(missing) in report.skipped_files[1].reason


def test_torch_tensors_and_chw_arrays_are_images_as_the_loader_yields_them(tmp_path):
    """Issue 39, item 6: the Writer takes torch tensors, and it and ``pack`` take CHW uint8 images
    (1 or 3 channels first, the loader's own layout) as well as HWC ones: the same pixels back."""
    import torch

    rgb = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    gray = rgb[:, :, 0].copy()
    with fastload.Writer(tmp_path / "w.fl") as writer:
        writer.write({"image": torch.from_numpy(rgb).permute(2, 0, 1), "label": torch.tensor(1),
                      "score": torch.tensor(0.5), "boxes": torch.tensor([[1.0, 2.0, 3.0, 4.0]])})
        writer.write({"image": rgb, "label": 2, "score": 1.5, "boxes": np.zeros((0, 4))})
        writer.write({"image": torch.from_numpy(gray)[None], "label": 3, "score": 2.5,
                      "boxes": torch.zeros((2, 4))})
    ds = fastload.PackedDataset(tmp_path / "w.fl")
    assert ds.manifest.fields == {"score": "float64", "boxes": "npy"}
    for i, (pixels, label) in enumerate([(rgb, 1), (rgb, 2), (gray, 3)]):
        record = ds.record(i)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(record["data"]))), pixels)
        assert (record["label"], record["width"], record["height"]) == (label, 40, 30)
    # the loader's own batches packed back: CHW uint8 tensors, and CHW arrays in tuples
    images = fastload.PackedDataset(tmp_path / "w.fl", image_size=16, train=False)
    pack([images[i] for i in range(3)], tmp_path / "again.fl", progress=False)
    pack([(rgb.transpose(2, 0, 1), 0)], tmp_path / "chw.fl", progress=False)
    again = fastload.PackedDataset(tmp_path / "again.fl")
    assert all(np.array_equal(np.asarray(Image.open(io.BytesIO(again.record(i)["data"]))),
                              images[i][0].permute(1, 2, 0).numpy()) for i in range(3))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(fastload.PackedDataset(tmp_path / "chw.fl")
                                                           .record(0)["data"]))), rgb)
    with pytest.raises(SourceError, match=r"field 'image' is a float32 array of shape \(3, 30, 40\); an image "
                                          r"array is uint8, .* or 1, 3 or 4 channels last \(HWC\) or first \(CHW\)"):
        _write(tmp_path / "f.fl", [{"image": torch.from_numpy(rgb).permute(2, 0, 1).float() / 255}])


def test_on_error_is_spelled_raise_as_the_loader_spells_it_and_fail_still_works(tmp_path):
    """Issue 39, item 6: one spelling of on_error everywhere (PackedDataset's 'raise'); 'fail', the
    pack's and Writer's old spelling, still works with a DeprecationWarning; anything else is refused."""
    bad = [{"image": make_jpeg(8, 8), "label": 0}, {"image": b"jpeg?", "label": 1}]
    with pytest.raises(SourceError, match=r"sample 1 .*its image: not a readable image"):
        _write(tmp_path / "a.fl", bad, on_error="raise")
    with pytest.warns(DeprecationWarning, match=r"on_error='fail' is spelled on_error='raise' now"), \
            pytest.raises(SourceError, match=r"sample 1 .*its image: not a readable image"):
        _write(tmp_path / "b.fl", bad, on_error="fail")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(make_jpeg(8, 8))
    (tmp_path / "src" / "b.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SourceError, match=r"b\.jpg: .*or pass --on-error skip"):
        pack(tmp_path / "src", tmp_path / "c.fl", on_error="raise", progress=False)
    with pytest.warns(DeprecationWarning), pytest.raises(SourceError, match=r"b\.jpg"):
        pack(tmp_path / "src", tmp_path / "c.fl", on_error="fail", progress=False)
    for call in (lambda: fastload.Writer(tmp_path / "d.fl", on_error="stop"),
                 lambda: pack(tmp_path / "src", tmp_path / "d.fl", on_error="stop", progress=False)):
        with pytest.raises(ValueError, match=r"on_error='stop': choose 'raise' \(stop at the first bad one\) or 'skip'"):
            call()
    assert fastload.PackedDataset(pack(tmp_path / "src", tmp_path / "e.fl", on_error="skip", progress=False).out,
                                  on_error="raise").on_error == "raise"
