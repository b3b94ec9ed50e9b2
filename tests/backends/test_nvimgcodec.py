"""backend="nvimgcodec": the same batches as backend="torch" (order, labels, crops, epochs, resume,
ranks, skips), pixels within rounding of the torch backend's full-scale decode, records the GPU
decoder does not take decoded by the CPU path, and clear errors. Real nvImageCodec on real packed
datasets: its CPU codecs everywhere (the same code path, decode on the CPU), ``device="cuda"`` on a
lent GPU (``-m gpu``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import fastload
from fastload.backends.decode_split import DecodeSplit, next_share
from fastload.decode.crops import decode_crop
from fastload.errors import CorruptRecordError, MissingDependencyError
from fastload.loading.transfer import Normalizer
from fastload.sampling.epoch_sampler import EpochSampler
from tests.backends.test_dali import (  # the DALI contract's data and helpers; its fixtures too
    BATCH,
    MEAN,
    SIZE,
    STD,
    TORCH_TOLERANCE,
    assert_close,
    make,
    packed,
    diff_stats,
    run,
    undecodable,
)
from tests.conftest import REPO
from tests.loading.helpers import ID_RECORDS

__all__ = ["packed", "undecodable"]  # fixtures, imported for pytest


def _nvimgcodec_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:  # no nvidia namespace at all
        return False


pytestmark = pytest.mark.skipif(not _nvimgcodec_installed(), reason="needs nvidia-nvimgcodec-cu12 "
                                "(pip install -e '.[gpu]' in fastload's clone, part of the dev extra)")
GPU = pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)"),
])
DEVICES = ["cpu", GPU]

# Against the torch backend decoding each sample's own plan at full scale (decode_crop(draft=False)),
# nvImageCodec's CPU codecs (libjpeg-turbo, as Pillow) plus the batched resampler are within
# rounding: measured mean 0.11-0.12 levels, max 1 (one rounding instead of Pillow's two, one per
# axis). On the GPU nvJPEG's IDCT and colour conversion differ from libjpeg's by a level or two more.
FULL_SCALE_TOLERANCE = {"cpu": (0.3, 1, 1), "cuda": (2.0, 12, 48)}


def same_crops(a: torch.Tensor, b: torch.Tensor, device: str) -> bool:
    """The same samples decoded twice: equal on the CPU. On the GPU nvImageCodec shares JPEGs
    between the hardware engines and CUDA by load, and their IDCTs round differently (a lent
    H200 showed two runs of one epoch unequal): within a level on average there, where another
    crop or flip would be tens of levels off."""
    if a.shape != b.shape:
        return False
    if device == "cpu":
        return torch.equal(a, b)
    mean, _, biggest = diff_stats(a, b)
    return mean < 1.0 and biggest <= 64


def pixels_of_plans(loader, ids: list[int], epoch: int, seed: int) -> torch.Tensor:
    """The torch backend's CPU decode of each sample's own plan, at full scale."""
    ds = loader.dataset
    out = []
    for i in ids:
        plan = ds.pipeline.plan(i, epoch, seed, int(ds.index.width[i]), int(ds.index.height[i]))
        out.append(torch.from_numpy(np.array(decode_crop(ds.reader.read(i), plan, draft=False))).permute(2, 0, 1))
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_same_labels_order_shapes_and_dtypes_as_torch(packed, storage, device):
    torch_loader = make(packed[storage], "torch")
    loader = make(packed[storage], "nvimgcodec", device=device)
    assert loader.backend == "nvimgcodec" and len(loader) == len(torch_loader) == 8
    for _ in range(2):  # two epochs: each a new permutation, the same on both backends
        expected, _, _ = run(torch_loader)
        batches = list(loader)
        assert [len(y) for _, y in batches] == [BATCH] * 7 + [2]
        for x, y in batches:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, SIZE, SIZE) and x.is_contiguous()
            assert y.dtype == torch.int64 and y.shape == (len(x),)
            assert x.device.type == y.device.type == device
        assert [i for _, y in batches for i in y.tolist()] == expected
    assert sorted(expected) == list(range(ID_RECORDS))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_same_crops_and_flips_as_the_torch_backend(packed, train, device):
    """Each sample's own plan decoded by the CPU path at full scale is what the backend delivers,
    within rounding: a box off by a pixel or a missed flip would be far outside these bounds."""
    loader = make(packed["lmdb"], "nvimgcodec", train=train, seed=5, device=device)
    flips = Counter()
    for epoch in range(2):
        ids, got, _ = run(loader)
        ds = loader.dataset
        flips.update(ds.pipeline.plan(i, epoch, 5, int(ds.index.width[i]), int(ds.index.height[i])).flip
                     for i in ids)
        assert_close(got, pixels_of_plans(loader, ids, epoch, 5), FULL_SCALE_TOLERANCE[device])
        torch_loader = make(packed["lmdb"], "torch", train=train, seed=5)
        torch_loader.set_epoch(epoch)
        torch_ids, torch_pixels, _ = run(torch_loader)
        assert torch_ids == ids
        assert_close(got, torch_pixels, TORCH_TOLERANCE)  # the torch backend decodes at reduced scale
    if train:
        assert flips[True] > 10 and flips[False] > 10  # both kinds of sample were checked


def test_records_the_gpu_decoder_does_not_take_are_the_torch_backends_own_pixels(packed):
    """Every 5th record (4, 9, ...) is a PNG: decoded by the CPU path (reduced-scale draft and all), so its
    pixels equal the torch backend's to the bit, inside batches that mix both."""
    ids, got, _ = run(make(packed["lmdb"], "nvimgcodec", shuffle=False))
    torch_ids, expected, _ = run(make(packed["lmdb"], "torch", shuffle=False))
    assert ids == torch_ids
    pngs = [k for k, i in enumerate(ids) if i % 5 == 4]
    assert pngs and all(torch.equal(got[k], expected[k]) for k in pngs)


@pytest.mark.parametrize("device", DEVICES)
def test_mean_std_dtype_and_channels_last_as_asked(packed, device):
    uint8 = make(packed["hdf5"], "nvimgcodec", device=device, seed=2)
    floats = make(packed["hdf5"], "nvimgcodec", device=device, seed=2, mean=MEAN, std=STD)
    halves = make(packed["hdf5"], "nvimgcodec", device=device, seed=2, mean=MEAN, std=STD,
                  dtype=torch.bfloat16, memory_format=torch.channels_last)
    _, pixels, _ = run(uint8)
    got = []
    for (x, y), (h, z) in zip(floats, halves, strict=True):
        assert x.dtype == torch.float32 and x.device.type == device
        assert h.dtype == torch.bfloat16 and h.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(h, x.to(torch.bfloat16)) and torch.equal(y, z)
        got.append(x.cpu())
    torch.testing.assert_close(torch.cat(got), Normalizer(MEAN, STD)((pixels,))[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("consumed", [0, 3, 8], ids=["start", "mid", "end"])
def test_resume_mid_epoch_yields_exactly_the_rest(packed, consumed, device):
    path = packed["lmdb"]
    reference = make(path, "nvimgcodec", device=device)
    first, second = run(reference), run(reference)
    saver = make(path, "nvimgcodec", device=device)
    it = iter(saver)
    for _ in range(consumed):
        next(it)  # batches decoded ahead must not count
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    resumed = make(path, "nvimgcodec", device=device)
    resumed.load_state_dict(state)
    ids, pixels, _ = run(resumed)
    if consumed < 8:
        assert ids == first[0][consumed * BATCH:] and same_crops(pixels, first[1][consumed * BATCH:], device)
    else:  # the saved epoch was complete: resume at the next one
        assert ids == second[0] and same_crops(pixels, second[1], device)
    other = make(path, "torch")  # a state saved by one backend resumes the other at the same sample
    other.load_state_dict(state)
    assert run(other)[0] == ids


@pytest.mark.parametrize("drop_last", [True, False])
def test_two_rank_shares_are_disjoint_and_complete(packed, drop_last):
    def rank_loader(rank: int, backend: str):
        ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True)
        sampler = EpochSampler(len(ds), shuffle=True, seed=4, rank=rank, world_size=2,
                               drop_last=drop_last, keyed=True)
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler, backend=backend, seed=4)

    shares = [run(rank_loader(r, "nvimgcodec")) for r in range(2)]
    assert [s[0] for s in shares] == [run(rank_loader(r, "torch"))[0] for r in range(2)]
    assert len(shares[0][2]) == len(shares[1][2])  # the same number of batches on both ranks
    ids = Counter(shares[0][0] + shares[1][0])
    if drop_last:
        assert len(ids) == ID_RECORDS - 1 and set(ids.values()) == {1}
    else:
        assert set(ids) == set(range(ID_RECORDS)) and sum(ids.values()) == ID_RECORDS + 1


@pytest.mark.parametrize("batch_size,drop_last", [(5, False), (5, True), (40, False)])
def test_last_partial_batch_kept_or_dropped(packed, batch_size, drop_last):
    expected = run(make(packed["lmdb"], "torch", batch_size=batch_size, drop_last=drop_last))
    got = run(make(packed["lmdb"], "nvimgcodec", batch_size=batch_size, drop_last=drop_last))
    assert (got[0], got[2]) == (expected[0], expected[2])


# --- damaged records: raised in their turn, or skipped and counted ---------------------------------

def test_a_record_no_decoder_takes_fails_the_loop_naming_it(undecodable):
    path, bad = undecodable
    loader = make(path, "nvimgcodec", batch_size=3, shuffle=False, train=False)
    delivered = []
    with pytest.raises(CorruptRecordError, match=rf"record {bad} \(img{bad:04d}.jpg\)"):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == [0, 1, 2, 3, 4, 5]  # every batch before the bad one
    loader.set_epoch(0)
    assert run(loader, limit=2)[0] == [0, 1, 2, 3, 4, 5]  # the next iteration starts afresh


def test_skip_leaves_out_undecodable_and_damaged_records_and_counts_them(undecodable, tmp_path):
    path, bad = undecodable
    dataset = shutil.copytree(path, tmp_path / "bad.fl")
    ds = fastload.PackedDataset(dataset)
    damaged = 2  # bytes that fail their checksum, besides ``bad`` whose bytes do not decode
    payload, shard = ds.record(damaged)["data"], ds.manifest.shards[int(ds.index.shard[damaged])].file
    blob = bytearray((dataset / shard).read_bytes())
    blob[blob.find(payload) + len(payload) // 2] ^= 0x5A
    (dataset / shard).write_bytes(bytes(blob))
    skipping = fastload.PackedDataset(dataset, image_size=SIZE, train=False, on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=3, shuffle=False, backend="nvimgcodec")
    with pytest.warns(UserWarning, match="skipped"):
        ids, _, sizes = run(loader)
    assert ids == [i for i in range(12) if i not in (damaged, bad)]
    assert sizes == [2, 3, 2, 3] and loader.stats()["skipped"] == 2


def test_max_pixels_is_enforced_before_decoding(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=False, max_pixels=64 * 64)
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, backend="nvimgcodec")
    big = next(i for i in range(ID_RECORDS) if ds.index.width[i] * ds.index.height[i] > 64 * 64)
    delivered = []
    with pytest.raises(CorruptRecordError, match=rf"record {big} .*possible decompression bomb"):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == list(range(big // BATCH * BATCH))


# --- clear errors -----------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_asked_for_without_cuda_names_the_backend_and_the_way_back(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE)
    with pytest.raises(ValueError, match=r"backend='nvimgcodec' with device='cuda': CUDA is not available.*"
                                         r"backend='torch'.*device='cpu'"):
        fastload.DataLoader(ds, batch_size=4, backend="nvimgcodec", device="cuda")


def test_without_nvimgcodec_the_error_names_the_package(packed):
    """A real failed import: ``nvidia.nvimgcodec`` blocked in a fresh interpreter."""
    code = (
        "import sys, json\n"
        "sys.modules['nvidia.nvimgcodec'] = None\n"
        "import fastload\n"
        f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=16)\n"
        "try:\n"
        "    next(iter(fastload.DataLoader(ds, batch_size=4, backend='nvimgcodec')))\n"
        "except Exception as exc:\n"
        "    print(json.dumps([type(exc).__name__, isinstance(exc, ImportError), str(exc)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    name, is_import_error, message = json.loads(done.stdout.strip().splitlines()[-1])
    assert (name, is_import_error) == (MissingDependencyError.__name__, True)
    assert "pip install 'nvidia-nvimgcodec-cu1" in message and "pip install -e '.[gpu" in message
    assert "backend='nvimgcodec'" in message and "backend='torch'" in message


def test_unsupported_datasets_and_arguments_are_refused(packed):
    path = packed["lmdb"]
    for dataset in (fastload.PackedDataset(path, transform=lambda img: img), fastload.PackedDataset(path)):
        with pytest.raises(ValueError, match=r"backend='nvimgcodec'.*PackedDataset\(path, image_size=\.\.\.\)"):
            fastload.DataLoader(dataset, batch_size=4, backend="nvimgcodec")
    ds = fastload.PackedDataset(path, image_size=SIZE)
    with pytest.raises(ValueError, match="backend='nvimgcodec': batch_size=None"):
        fastload.DataLoader(ds, batch_size=None, backend="nvimgcodec")
    with pytest.raises(ValueError, match="backend='nvimgcodec': collate_fn"):
        fastload.DataLoader(ds, batch_size=4, backend="nvimgcodec", collate_fn=lambda b: b)
    fields = fastload.PackedDataset(path, image_size=SIZE, fields=("image", "label"))
    with pytest.raises(ValueError, match="backend='nvimgcodec' delivers .*fields="):
        fastload.DataLoader(fields, batch_size=4, backend="nvimgcodec")


def test_nothing_is_printed_by_the_codec_library(packed):
    """nvImageCodec's extensions print to the process's stdout when a codec is missing: kept quiet."""
    code = ("import fastload\n"
            f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=16)\n"
            "x, y = next(iter(fastload.DataLoader(ds, batch_size=4, backend='nvimgcodec')))\n"
            "print('shape', tuple(x.shape))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "shape (4, 3, 16, 16)" and done.stderr.strip() == ""


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_whole_image_decode_crops_as_region_decode_does(packed, train):
    """The GPU decodes whole images (its hardware engines take no regions) and crops in the
    resampler: run here on the CPU codecs, the same crops within rounding, train crops' edges
    filtered with the box's own pixels alone."""
    loader = make(packed["lmdb"], "nvimgcodec", train=train, seed=3)
    loader._tail.whole_images = True
    ids, got, _ = run(loader)
    assert_close(got, pixels_of_plans(loader, ids, 0, 3), FULL_SCALE_TOLERANCE["cpu"])


# --- both processors at once: worker processes decode a share of each batch --------------------------

def test_the_share_moves_away_from_the_side_the_loop_waited_for():
    assert next_share(0.5, waited_cpu=0.010, waited_gpu=0.0) == pytest.approx(0.48)
    assert next_share(0.5, waited_cpu=0.0, waited_gpu=0.010) == pytest.approx(0.52)
    assert next_share(0.5, waited_cpu=0.0001, waited_gpu=0.0) == 0.5  # noise, not a side behind
    assert next_share(0.0, waited_cpu=1.0, waited_gpu=0.0) == 0.0
    assert next_share(0.9, waited_cpu=0.0, waited_gpu=1.0) == 0.9  # the GPU always keeps a part


def test_each_cut_gives_both_sides_their_parts_of_every_batch_in_order():
    batches = [[(i, 0, 0) for i in range(b * 10, b * 10 + n)] for b, n in enumerate([10, 10, 7, 10, 3])]
    split = DecodeSplit(batches, share=0.3)
    gpu = split.parts("gpu")
    cpu = split.parts("cpu")
    joined = []
    for b in range(len(batches)):
        cut = split.cut(b)
        parts = (next(cpu) if cut.cpu else []) + (next(gpu) if cut.gpu else [])
        joined.append(parts)
        split.adapt(waited_cpu=0.0, waited_gpu=1.0 if b < 2 else 0.0)  # the CPU gets more, then stays
        split.release(b)
    assert joined == batches and split.cut(len(batches)) is None
    assert [len(split._cuts)] == [0]  # every cut released
    assert split.share == pytest.approx(0.34)


@pytest.mark.parametrize("device", DEVICES)
def test_worker_processes_decode_a_share_in_the_sampler_order(packed, device):
    """num_workers=2: each batch's first samples decoded by the CPU path (the torch backend's
    own pixels, to the bit), the rest by nvImageCodec, joined in the sampler's order; every sample
    once per epoch, two epochs on the same persistent workers."""
    reference = make(packed["hdf5"], "torch", seed=7)
    loader = make(packed["hdf5"], "nvimgcodec", seed=7, device=device, num_workers=2)
    for epoch in range(2):
        ids, expected, sizes = run(reference)
        got_ids, got, got_sizes = run(loader)
        assert (got_ids, got_sizes) == (ids, sizes) and sorted(ids) == list(range(ID_RECORDS))
        assert_close(got, expected, TORCH_TOLERANCE)
        assert_close(got, pixels_of_plans(loader, got_ids, epoch, 7), TORCH_TOLERANCE)
        assert 0.0 <= loader._tail.cpu_share <= 0.9
        # JPEGs the CPU path decoded (at reduced scale) equal the torch backend's; the GPU's do not.
        from_cpu = [i for k, i in enumerate(ids) if i % 5 != 4 and torch.equal(got[k], expected[k])]
        assert len(from_cpu) >= 5


def test_a_resume_with_the_share_yields_exactly_the_rest(packed):
    path = packed["lmdb"]
    first = run(make(path, "torch"))[0]
    saver = make(path, "nvimgcodec", num_workers=2)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    resumed = make(path, "nvimgcodec", num_workers=2)
    resumed.load_state_dict(state)
    assert run(resumed)[0] == first[3 * BATCH:]


def test_skips_on_either_side_are_counted_once(undecodable, tmp_path):
    path, bad = undecodable
    skipping = fastload.PackedDataset(path, image_size=SIZE, train=False, on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=6, shuffle=False, backend="nvimgcodec", num_workers=2)
    ids = []
    for _ in range(2):  # the share moves between epochs: the bad record may fall on either side
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ids.append(run(loader)[0])
    assert ids == [[i for i in range(12) if i != bad]] * 2
    assert loader.stats()["skipped"] == 2
