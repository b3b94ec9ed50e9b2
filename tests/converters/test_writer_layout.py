"""The Writer's image arrays have one layout rule (issue 44, item 6): channels (1, 3 or 4) at the
one end of the shape that can hold them; where both ends can (3×50×3, 1×50×3, 3×50×4, 3×3×3) the
writer's ``layout=`` says which, and without it the sample is refused, never guessed. Tensors NumPy
cannot hold (bfloat16, sparse, meta) and broadcast views too large to store are refused naming the
sample and field, from their dtype, layout and shape, before a value is copied."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import torch
from fastload.converters import pack
from PIL import Image

import fastload
from fastload.errors import SourceError
from tests.conftest import make_jpeg

AMBIGUOUS = [(3, 50, 3), (1, 50, 3), (3, 50, 4), (3, 3, 3)]  # the shapes: both ends 1, 3 or 4


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(44)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for shape in AMBIGUOUS]


def _pixels(dataset: fastload.PackedDataset, i: int) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(dataset.record(i)["data"])))


def _write(out, samples, **options):
    with fastload.Writer(out, **options) as writer:
        for sample in samples:
            writer.write(sample)
    return writer.report


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_each_ambiguous_shape_reads_back_as_written_in_the_layout_given(tmp_path, layout):
    arrays = _arrays()
    # as NumPy arrays and as torch tensors, one sample each
    samples = [{"image": image if i % 2 else torch.from_numpy(image), "label": i}
               for i, image in enumerate(arrays + arrays)]
    _write(tmp_path / "w.fl", samples, layout=layout)
    dataset = fastload.PackedDataset(tmp_path / "w.fl")
    for i, image in enumerate(arrays + arrays):
        hwc = image.transpose(1, 2, 0) if layout == "CHW" else image
        expected = hwc[:, :, 0] if hwc.shape[2] == 1 else hwc  # one channel: stored as a gray image
        record = dataset.record(i)
        assert (record["width"], record["height"]) == (hwc.shape[1], hwc.shape[0])
        assert np.array_equal(_pixels(dataset, i), expected), (image.shape, layout)


def test_without_layout_each_ambiguous_shape_is_refused_naming_the_sample_and_field_and_layout(tmp_path):
    arrays = _arrays()
    with pytest.raises(SourceError, match=r"^sample 1 \(key 'b'\): field 'image' is a uint8 array of shape "
                                          r"\(3, 50, 3\): CHW \(3x50 pixels, 3 channels\) or HWC \(50x3 pixels, "
                                          r"3 channels\), the shape cannot tell; pass the Writer layout='CHW' or "
                                          r"layout='HWC'"):
        _write(tmp_path / "a.fl", [{"image": make_jpeg(8, 8), "__key__": "a"}, {"image": arrays[0], "__key__": "b"}])
    assert not (tmp_path / "a.fl" / "manifest.json").exists()
    report = _write(tmp_path / "b.fl", [{"image": make_jpeg(8, 8)}, *({"image": a} for a in arrays)],
                    on_error="skip")
    assert report.num_records == 1 and report.skipped == len(AMBIGUOUS)
    assert [s.reason.split(": CHW")[0] for s in report.skipped_files] == [
        f"field 'image' is a uint8 array of shape {shape}" for shape in AMBIGUOUS]
    assert "CHW (3x50 pixels, 1 channel) or HWC (50x1 pixels, 3 channels)" in report.skipped_files[1].reason


def test_a_shape_only_one_layout_reads_needs_no_layout_and_a_wrong_layout_is_refused(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    _write(tmp_path / "w.fl", [{"image": rgb}, {"image": rgb.transpose(2, 0, 1)},
                               {"image": torch.from_numpy(rgb).permute(2, 0, 1)}])
    dataset = fastload.PackedDataset(tmp_path / "w.fl")
    assert all(np.array_equal(_pixels(dataset, i), rgb) for i in range(3))
    with pytest.raises(SourceError, match=r"sample 0 .*field 'image' is a uint8 array of shape \(20, 30, 3\), not "
                                          r"CHW: its first dimension, 20, is not 1, 3 or 4 channels \(layout='CHW'\)"):
        _write(tmp_path / "a.fl", [{"image": rgb}], layout="CHW")
    with pytest.raises(SourceError, match=r"field 'image' is a uint8 array of shape \(3, 20, 30\), not HWC: its "
                                          r"last dimension, 30, is not 1, 3 or 4 channels"):
        _write(tmp_path / "b.fl", [{"image": rgb.transpose(2, 0, 1)}], layout="HWC")
    with pytest.raises(ValueError, match=r"layout='chw': choose 'CHW' \(channels first.*or 'HWC'"):
        fastload.Writer(tmp_path / "c.fl", layout="chw")  # type: ignore[arg-type]
    assert not (tmp_path / "c.fl").exists()


def test_a_dataset_pack_refuses_an_ambiguous_array_naming_its_item(tmp_path):
    with pytest.raises(SourceError, match=r"dataset item 1: field 'image' is a uint8 array of shape \(3, 3, 3\): CHW .* "
                                          r"the shape cannot tell"):
        pack([(make_jpeg(8, 8), 0), (_arrays()[3], 1)], tmp_path / "p.fl", progress=False, workers=1)


@pytest.mark.parametrize("tensor, problem", [
    (torch.zeros(4, 4, dtype=torch.bfloat16), (r"a torch.bfloat16 tensor of shape \(4, 4\), a dtype NumPy cannot "
                                              r"hold; convert it first \(tensor.float\(\)")),
    (torch.zeros(4, 4).to_sparse(), (r"a torch.float32 tensor of shape \(4, 4\) in torch.sparse_coo layout; give a "
                                    r"dense one \(tensor.to_dense\(\)\)")),
    (torch.zeros(4, 4, device="meta"), (r"a torch.float32 tensor of shape \(4, 4\) on the meta device: it has a "
                                       r"shape but no values")),
    (torch.zeros((), dtype=torch.float32).expand(30_000, 30_000),
     r"a float32 array of shape \(30000, 30000\) \(3600000000 bytes\), over the 1000000000 limit \(max_file_size\)"),
], ids=["bfloat16", "sparse", "meta", "broadcast"])
def test_a_tensor_numpy_cannot_hold_or_too_big_to_store_is_refused_naming_sample_and_field(tmp_path, tensor, problem):
    good = {"image": make_jpeg(8, 8), "__key__": "first", "depth": torch.zeros(2, 2)}
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match=rf"^sample 1 \(key 'second'\): field 'depth' is {problem}"):
            _write(tmp_path / "a.fl", [good, {"image": make_jpeg(8, 8), "__key__": "second", "depth": tensor}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20  # refused by its shape: a 3.6 GB broadcast view is never copied


def test_a_broadcast_image_tensor_is_refused_by_its_shape_and_a_small_one_stored(tmp_path):
    huge = torch.zeros((), dtype=torch.uint8).expand(30_000, 30_000, 3)
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match=r"sample 0 .*field 'image' is 30000x30000, 900000000 pixels, over the "
                                              r"178956970 limit \(max_pixels; not encoded\)"):
            _write(tmp_path / "a.fl", [{"image": huge}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    small = torch.tensor([7, 8, 9], dtype=torch.uint8)[:, None, None].expand(3, 20, 30)  # CHW, zero strides
    _write(tmp_path / "b.fl", [{"image": small, "score": torch.tensor(0.5, dtype=torch.bfloat16)}])
    dataset = fastload.PackedDataset(tmp_path / "b.fl")
    assert np.array_equal(_pixels(dataset, 0), np.broadcast_to(np.array([7, 8, 9], np.uint8), (20, 30, 3)))
    assert dataset.record(0)["score"] == 0.5  # a 0-d tensor is its number, whatever its dtype
