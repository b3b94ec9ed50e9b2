"""Datasets of files that are not images: .npy arrays, text and WAV audio pack bit-exact and load
decoded (``PackedDataset(decode=...)``) through the same loader; a record that does not decode is
named, or skipped and counted."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

import fastload
from fastload.converters import pack
from fastload.errors import CorruptRecordError


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def wav(samples: np.ndarray, width: int, rate: int = 8000) -> bytes:
    """``samples``: frames × channels integers of ``width`` bytes each."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 3:
            raw = samples.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
        else:
            raw = samples.astype({1: np.uint8, 2: "<i2", 4: "<i4"}[width]).tobytes()
        w.writeframes(raw)
    return out.getvalue()


RNG = np.random.default_rng(0)
ARRAYS = {"a/f32.npy": RNG.standard_normal((3, 5)).astype(np.float32),
          "a/i64.npy": np.arange(7, dtype=np.int64),
          "a/u8.npy": RNG.integers(0, 256, (2, 2, 3), dtype=np.uint8),
          "a/fortran.npy": np.asfortranarray(RNG.standard_normal((4, 3)))}
TEXTS = {"b/plain.txt": "a caption", "b/bom.txt": "with a byte-order mark", "b/x.json": '{"k": "é✓"}'}
SOUNDS = {"c/mono8.wav": (RNG.integers(0, 256, (50, 1)), 1), "c/stereo16.wav": (RNG.integers(-2**15, 2**15, (40, 2)), 2),
          "c/mono24.wav": (RNG.integers(-2**23, 2**23, (30, 1)), 3), "c/quad32.wav": (RNG.integers(-2**31, 2**31, (9, 4)), 4)}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    src = tmp_path_factory.mktemp("files") / "src"
    files: dict[str, bytes] = {}
    files.update({name: npy(a) for name, a in ARRAYS.items()})
    files.update({name: text.encode("utf-8-sig" if "bom" in name else "utf-8") for name, text in TEXTS.items()})
    files.update({name: wav(s, width) for name, (s, width) in SOUNDS.items()})
    files["d/objects.npy"] = npy(np.array([{"a": 1}], dtype=object))  # pickled: must never be loaded
    files["d/latin1.txt"] = "caf\xe9".encode("latin-1")
    files["d/cut.wav"] = wav(np.zeros((100, 1), dtype=np.int64), 2)[:-50]
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    out = src.parent / "files.fl"
    pack(src, out, extensions=[".npy", ".txt", ".json", ".wav"], progress=False)
    return out, files


def by_path(ds: fastload.PackedDataset) -> dict[str, int]:
    return {str(ds.index.path[i]): i for i in range(len(ds))}


def test_bytes_by_default_and_bit_exact(packed):
    out, files = packed
    ds = fastload.PackedDataset(out)
    assert ds.manifest.kind == "files"
    assert {path: ds[i][0] for path, i in by_path(ds).items()} == files


def test_auto_decodes_arrays_text_and_sound_by_extension(packed):
    ds = fastload.PackedDataset(packed[0], decode="auto")
    where = by_path(ds)
    for name, array in ARRAYS.items():
        got = ds[where[name]][0]
        assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), array) and got.shape == array.shape
    for name, text in TEXTS.items():
        assert ds[where[name]][0] == text  # the byte-order mark utf-8-sig wrote is dropped
    for name, (samples, width) in SOUNDS.items():
        got = ds[where[name]][0]
        assert got.shape == (samples.shape[1], samples.shape[0])
        assert got.dtype == {1: torch.uint8, 2: torch.int16, 3: torch.int32, 4: torch.int32}[width]
        assert np.array_equal(got.numpy().T, samples)


def test_what_does_not_decode_is_named_or_skipped_and_counted(packed):
    ds = fastload.PackedDataset(packed[0], decode="auto")
    where = by_path(ds)
    for name, message in [("d/objects.npy", "never unpickles"), ("d/latin1.txt", "not UTF-8 text"),
                          ("d/cut.wav", "cut short")]:
        with pytest.raises(CorruptRecordError, match=rf"record {where[name]} \({name}\): .*{message}"):
            ds[where[name]]
    skipping = fastload.PackedDataset(packed[0], decode="auto", on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=len(skipping), collate_fn=list, num_workers=0)
    with pytest.warns(fastload.errors.SkippedRecordWarning):
        (batch,) = list(loader)
    assert len(batch) == len(skipping) - 3 and loader.stats()["skipped"] == 3


def test_same_shape_arrays_batch_through_the_loader(tmp_path):
    src = tmp_path / "vectors"
    src.mkdir()
    rows = RNG.standard_normal((10, 6)).astype(np.float32)
    for i, row in enumerate(rows):
        (src / f"{i:02d}.npy").write_bytes(npy(row))
    pack(src, tmp_path / "v.fl", extensions=[".npy"], progress=False)
    ds = fastload.PackedDataset(tmp_path / "v.fl", decode="npy")
    batches = list(fastload.DataLoader(ds, batch_size=4, num_workers=2))
    assert torch.equal(torch.cat([x for x, _ in batches]), torch.from_numpy(rows))


def test_decode_arguments_are_checked(packed, tmp_path):
    with pytest.raises(ValueError, match="decode='mp3': must be"):
        fastload.PackedDataset(packed[0], decode="mp3")
    from tests.conftest import make_jpeg

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(make_jpeg())
    pack(tmp_path / "img", tmp_path / "img.fl", progress=False)
    with pytest.raises(ValueError, match="decode='npy' is for datasets of other files"):
        fastload.PackedDataset(tmp_path / "img.fl", decode="npy")
