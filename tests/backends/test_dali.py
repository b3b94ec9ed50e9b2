"""backend="dali": the same batches as backend="torch" (order, shapes, crops, epochs, resume,
ranks), pixels within a stated tolerance, and clear errors. Real DALI pipelines on real packed
datasets: CPU operators everywhere, the GPU (``device="cuda"``) variants on a lent GPU."""

from __future__ import annotations

import importlib.util
import inspect
import json
import shutil
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload.decode.crops import decode_crop
from fastload.sampling.epoch_sampler import EpochSampler
from fastload.errors import CorruptRecordError, MissingDependencyError
from fastload.loading.transfer import Normalizer
from tests.conftest import REPO
from tests.loading.helpers import (
    ID_RECORDS, Numbers, UnevenBatches, encode, picture, write_id_list,
)

SIZE = 32
BATCH = 5  # 37 records (ID_RECORDS): 7 full batches and one of 2
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# Pixel tolerance against the torch backend. Both resample the same box with an antialiased
# bilinear filter, but the torch backend lets libjpeg decode at 1/2, 1/4 or 1/8 scale (draft)
# where the crop allows, and DALI decodes at full scale. Measured on this data (32 px crops):
# mean |diff| 0.25 (train) and 0.32 (eval) levels, 99th percentile 2-3, 99.9th 7-8, max 16-20,
# the large ones on sharp edges, where the reduced-scale decode itself differs that much.
TORCH_TOLERANCE = (1.0, 16, 48)  # mean, 99.9th percentile, max |diff| in levels
# Against the torch backend decoding the same crop at full scale (decode_crop(draft=False)),
# DALI's CPU operators are within rounding: measured mean 0.13-0.14, 99.9th percentile 1-2,
# max 1 inside the image and up to 11 on the crop's border rows, where the resamplers treat
# the edge differently (train crops are cut out first, so their edges are the crop's own).
PILLOW_TOLERANCE = (0.3, 2, 16)


def _dali_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no nvidia namespace at all
        return False


needs_dali = pytest.mark.skipif(not _dali_installed(), reason="needs nvidia-dali-cuda120 "
                                "(pip install -e '.[dali]' in fastload's clone, part of the dev extra)")
GPU = pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (run on a lent GPU)"),
])
DEVICES = ["cpu", GPU]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """The id datasets (label = record number, 48-159 px, every 5th a PNG) in both storages."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("dali-data")
    listing = write_id_list(base / "pictures", ID_RECORDS)
    out = {}
    for storage in ("lmdb", "hdf5"):
        out[storage] = base / f"ids-{storage}.fl"
        pack(listing, out[storage], format=storage, shard_size="64KB", workers=1, progress=False)
    return out


def make(path: Path, backend: str, *, train: bool = True, device: str = "cpu", **kwargs):
    ds = fastload.PackedDataset(path, image_size=SIZE, train=train)
    kwargs.setdefault("batch_size", BATCH)
    kwargs.setdefault("shuffle", True)
    kwargs.setdefault("seed", 0)  # the same order for every loader made here (None: drawn from torch's RNG)
    return fastload.DataLoader(ds, backend=backend, device=device, **kwargs)


def run(loader, limit: int | None = None) -> tuple[list[int], torch.Tensor, list[int]]:
    """One epoch (or its first ``limit`` batches): ids, images on the CPU, batch sizes."""
    ids, images, sizes = [], [], []
    for x, y in islice(loader, limit):  # never asks for a batch past the limit
        ids += y.tolist()
        images.append(x.cpu())
        sizes.append(len(y))
    return ids, torch.cat(images) if images else torch.empty(0), sizes


def same_pixels(a: torch.Tensor, b: torch.Tensor, device: str) -> bool:
    """Equal on the CPU. On the GPU DALI shares JPEGs between the hardware decoder and CUDA by
    load, and the two may round differently: equal within 2 levels there."""
    if a.shape != b.shape:
        return False
    if device == "cpu":
        return torch.equal(a, b)
    return int((a.to(torch.int16) - b.to(torch.int16)).abs().max()) <= 2


def diff_stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, int]:
    """Mean, 99.9th percentile and max of the absolute pixel difference, in levels."""
    d = (a.to(torch.int16) - b.to(torch.int16)).abs().float()
    return float(d.mean()), float(torch.quantile(d.flatten()[: 2**24], 0.999)), int(d.max())


def assert_close(got: torch.Tensor, expected: torch.Tensor,
                 tolerance: tuple[float, float, int]) -> None:
    mean, p999, biggest = diff_stats(got, expected)
    assert mean < tolerance[0] and p999 <= tolerance[1] and biggest <= tolerance[2], \
        f"mean {mean:.3f}, 99.9th percentile {p999}, max {biggest}; tolerance {tolerance}"


# --- same batches as the torch backend -----------------------------------------------------------

@needs_dali
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_same_labels_order_shapes_and_dtypes_as_torch(packed, storage, device):
    torch_loader = make(packed[storage], "torch")
    dali = make(packed[storage], "dali", device=device)
    assert dali.backend == "dali" and len(dali) == len(torch_loader) == 8
    for _ in range(2):  # two epochs: each a new permutation, the same on both backends
        expected, _, _ = run(torch_loader)
        batches = list(dali)
        assert [len(y) for _, y in batches] == [BATCH] * 7 + [2]
        for x, y in batches:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, SIZE, SIZE) and x.is_contiguous()
            assert y.dtype == torch.int64 and y.shape == (len(x),)
            assert x.device.type == y.device.type == device
        assert [i for _, y in batches for i in y.tolist()] == expected
    assert sorted(expected) == list(range(ID_RECORDS))


@needs_dali
@pytest.mark.parametrize("device", DEVICES)
def test_eval_pixels_close_to_the_torch_backend(packed, device):
    ids, expected, _ = run(make(packed["lmdb"], "torch", train=False, shuffle=False))
    dali_ids, got, _ = run(make(packed["lmdb"], "dali", train=False, shuffle=False, device=device))
    assert dali_ids == ids == list(range(ID_RECORDS))
    assert_close(got, expected, TORCH_TOLERANCE)
    assert not torch.equal(got, expected)  # two decoders: equal would mean torch's ran twice


@needs_dali
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_same_crop_boxes_and_flips_as_the_torch_backend(packed, train):
    """Against Pillow decoding each sample's own plan at full scale, DALI is within rounding: a
    box off by one pixel or a missed flip would be far outside these bounds."""
    path = packed["lmdb"]
    loader = make(path, "dali", train=train, seed=5)
    ds = loader.dataset
    flips = Counter()
    for epoch in range(2):
        ids, got, _ = run(loader)
        reference = []
        for i in ids:
            plan = ds.pipeline.plan(i, epoch, 5, int(ds.index.width[i]), int(ds.index.height[i]))
            flips[plan.flip] += 1
            pixels = decode_crop(ds.reader.read(i), plan, draft=False)
            reference.append(torch.from_numpy(np.array(pixels)).permute(2, 0, 1))
        assert_close(got, torch.stack(reference), PILLOW_TOLERANCE)
        # ... and within the stated tolerance of the torch backend itself.
        torch_ids, torch_pixels, _ = run(_torch_epoch(path, train, epoch))
        assert torch_ids == ids
        assert_close(got, torch_pixels, TORCH_TOLERANCE)
    if train:
        assert flips[True] > 10 and flips[False] > 10  # both kinds of sample were checked


def _torch_epoch(path: Path, train: bool, epoch: int):
    loader = make(path, "torch", train=train, seed=5)
    loader.set_epoch(epoch)
    return loader


@needs_dali
@pytest.mark.parametrize("device", DEVICES)
def test_dtype_and_channels_last_come_as_asked_from_dali_too(packed, device):
    floats = make(packed["hdf5"], "dali", device=device, seed=2, mean=MEAN, std=STD)
    halves = make(packed["hdf5"], "dali", device=device, seed=2, mean=MEAN, std=STD, dtype=torch.bfloat16,
                  memory_format=torch.channels_last)
    for (x, y), (h, z) in zip(floats, halves, strict=True):
        assert h.dtype == torch.bfloat16 and h.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(h, x.to(torch.bfloat16)) and torch.equal(y, z)


@needs_dali
@pytest.mark.parametrize("device", DEVICES)
def test_mean_std_gives_float32_normalised_like_the_torch_backend(packed, device):
    uint8 = make(packed["hdf5"], "dali", device=device, seed=2)
    floats = make(packed["hdf5"], "dali", device=device, seed=2, mean=MEAN, std=STD)
    torch_floats = make(packed["hdf5"], "torch", seed=2, mean=MEAN, std=STD)
    ids, pixels, _ = run(uint8)
    batches = list(floats)
    assert all(x.dtype == torch.float32 and x.shape[1:] == (3, SIZE, SIZE) for x, _ in batches)
    assert [i for _, y in batches for i in y.tolist()] == ids
    got = torch.cat([x.cpu() for x, _ in batches])
    # DALI normalised its own pixels exactly as fastload's Normalizer would ...
    torch.testing.assert_close(got, Normalizer(MEAN, STD)((pixels,))[0], atol=1e-5, rtol=0)
    # ... and they are within the pixel tolerance of the torch backend's (1 level = 1/(255 std)).
    expected = torch.cat([x for x, _ in torch_floats])
    scale = torch.tensor([255 * s for s in STD]).view(1, 3, 1, 1)
    assert float(((got - expected).abs() * scale).mean()) < TORCH_TOLERANCE[0]


# --- epochs, partial batches, resume, ranks -------------------------------------------------------

@needs_dali
def test_epochs_and_set_epoch_follow_the_sampler(packed):
    path = packed["lmdb"]
    torch_loader, dali = make(path, "torch"), make(path, "dali")
    epochs = [run(torch_loader)[0] for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert [run(dali)[0] for _ in range(3)] == epochs  # each new iteration is the next epoch
    dali.set_epoch(1)
    assert run(dali)[0] == epochs[1]
    assert run(dali)[0] == epochs[2]
    dali.set_epoch(9)
    torch_loader.set_epoch(9)
    assert run(dali)[0] == run(torch_loader)[0]


@needs_dali
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [5, 37, 40])
def test_last_partial_batch_kept_or_dropped(packed, drop_last, batch_size):
    torch_loader = make(packed["lmdb"], "torch", batch_size=batch_size, drop_last=drop_last)
    dali = make(packed["lmdb"], "dali", batch_size=batch_size, drop_last=drop_last)
    expected_ids, _, expected_sizes = run(torch_loader)
    ids, _, sizes = run(dali)
    assert (ids, sizes) == (expected_ids, expected_sizes)
    full, rest = divmod(ID_RECORDS, batch_size)
    assert sizes == [batch_size] * full + ([rest] if rest and not drop_last else [])
    assert len(dali) == len(sizes)


@needs_dali
def test_a_batch_sampler_of_growing_batches(packed):
    """Batches of 1, 2, 3, … plain indices: the pipeline is rebuilt wider as they grow."""
    def loader(backend: str):
        ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=False)
        return fastload.DataLoader(ds, batch_sampler=UnevenBatches(ID_RECORDS), backend=backend)

    expected_ids, expected, expected_sizes = run(loader("torch"))
    ids, got, sizes = run(loader("dali"))
    assert (ids, sizes) == (expected_ids, expected_sizes) and sizes[:4] == [1, 2, 3, 4]
    assert_close(got, expected, TORCH_TOLERANCE)


@needs_dali
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("consumed", [0, 3, 7, 8], ids=["start", "mid", "last-batch", "end"])
def test_resume_mid_epoch_yields_exactly_the_rest(packed, consumed, device):
    path = packed["lmdb"]
    reference = make(path, "dali", device=device)
    first, second = run(reference), run(reference)

    saver = make(path, "dali", device=device)
    it = iter(saver)
    for _ in range(consumed):
        next(it)  # DALI holds up to 2 more batches in flight: they must not count
    state = json.loads(json.dumps(saver.state_dict()))
    del it

    resumed = make(path, "dali", device=device)
    resumed.load_state_dict(state)
    ids, pixels, _ = run(resumed)
    if consumed < 8:
        assert (state["epoch"], state["position"]) == (0, consumed * BATCH)
        assert ids == first[0][consumed * BATCH:]
        assert same_pixels(pixels, first[1][consumed * BATCH:], device)  # same crops
        following = second
    else:  # the saved epoch was complete: resume at the next one
        assert ids == second[0] and same_pixels(pixels, second[1], device)
        following = run(reference)
    assert run(resumed)[0] == following[0]
    # A state saved by one backend resumes the other at the same sample.
    other = make(path, "torch")
    other.load_state_dict(state)
    assert run(other)[0] == (ids if consumed < 8 else second[0])


@needs_dali
@pytest.mark.parametrize("drop_last", [True, False])
def test_two_rank_shares_are_disjoint_and_complete(packed, drop_last):
    """Two ranks' loaders (the EpochSampler each rank would build) split every epoch exactly."""
    def rank_loader(rank: int, backend: str):
        ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True)
        sampler = EpochSampler(len(ds), shuffle=True, seed=4, rank=rank, world_size=2,
                               drop_last=drop_last, keyed=True)
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler, backend=backend, seed=4)

    dali = [rank_loader(r, "dali") for r in range(2)]
    reference = [rank_loader(r, "torch") for r in range(2)]
    for _ in range(2):
        shares = [run(loader) for loader in dali]
        assert [s[0] for s in shares] == [run(loader)[0] for loader in reference]
        assert len(shares[0][2]) == len(shares[1][2])  # the same number of batches on both ranks
        ids = Counter(shares[0][0] + shares[1][0])
        if drop_last:  # 36 of 37 samples, each exactly once
            assert len(ids) == ID_RECORDS - 1 and set(ids.values()) == {1}
        else:  # all 37, one of them twice (the DistributedSampler padding policy)
            assert set(ids) == set(range(ID_RECORDS)) and sum(ids.values()) == ID_RECORDS + 1


@needs_dali
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("taken", [1, 2, 6])
def test_no_stale_batch_after_breaking_out_early(packed, taken, device):
    path = packed["lmdb"]
    reference = make(path, "dali", device=device)
    epochs = [run(reference) for _ in range(2)]
    loader = make(path, "dali", device=device)
    ids, pixels, _ = run(loader, limit=taken)  # broken off with batches still in flight
    assert ids == epochs[0][0][:taken * BATCH]
    ids, pixels, sizes = run(loader)
    assert ids == epochs[1][0] and same_pixels(pixels, epochs[1][1], device)
    assert loader.state_dict()["epoch"] == 1


@needs_dali
def test_an_older_iterator_is_refused_after_a_new_one_starts(packed):
    loader = make(packed["lmdb"], "dali")
    expected = run(make(packed["lmdb"], "torch"))[0]
    old = iter(loader)
    assert next(old)[1].tolist() == expected[:BATCH]
    new_ids, _, _ = run(loader)
    assert len(new_ids) == ID_RECORDS
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


@needs_dali
def test_stats_count_what_was_delivered(packed):
    loader = make(packed["hdf5"], "dali")
    run(loader)
    stats = loader.stats()
    assert stats["samples"] == ID_RECORDS and stats["batches"] == 8
    assert stats["mb_per_s"] > 0 and 0 <= stats["wait_fraction"] <= 1


@needs_dali
def test_a_rebuilt_loader_keeps_the_backend(packed):
    """Lightning re-creates the loader from its attributes named like __init__'s parameters."""
    loader = make(packed["lmdb"], "dali")
    names = [n for n in inspect.signature(fastload.DataLoader.__init__).parameters
             if n not in ("self", "dataset")]
    rebuilt = fastload.DataLoader(loader.dataset, **{n: getattr(loader, n) for n in names})
    assert rebuilt.backend == "dali"
    loader.set_epoch(0)
    expected = run(loader)[0]
    rebuilt.set_epoch(0)
    assert run(rebuilt)[0] == expected


@needs_dali
def test_target_transform_applies_to_the_labels(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, target_transform=lambda y: 100 + y)
    ids, _, _ = run(fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, backend="dali"))
    assert ids == [100 + i for i in range(ID_RECORDS)]


# --- errors ---------------------------------------------------------------------------------------

def test_without_dali_the_error_names_the_package(packed):
    """A real failed import: ``nvidia.dali`` blocked in a fresh interpreter."""
    code = (
        "import sys, json\n"
        "sys.modules['nvidia.dali'] = None\n"
        "import fastload\n"
        f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=16)\n"
        "try:\n"
        "    fastload.DataLoader(ds, batch_size=4, backend='dali')\n"
        "except Exception as exc:\n"
        "    print(json.dumps([type(exc).__name__, isinstance(exc, ImportError), str(exc)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    name, is_import_error, message = json.loads(done.stdout.strip().splitlines()[-1])
    assert (name, is_import_error) == (MissingDependencyError.__name__, True)
    assert "nvidia-dali-cuda120" in message and "pip install -e '.[dali]'" in message
    assert "backend='dali'" in message


def test_unsupported_datasets_point_to_the_built_in_pipeline(packed):
    path = packed["lmdb"]
    with_transform = fastload.PackedDataset(path, transform=lambda img: img)
    cases = [with_transform, fastload.PackedDataset(path), Numbers(10)]
    for dataset in cases:
        with pytest.raises(ValueError, match=r"PackedDataset\(path, image_size=\.\.\.\)"):
            fastload.DataLoader(dataset, batch_size=4, backend="dali")
    skipping = fastload.PackedDataset(path, image_size=SIZE, on_error="skip")
    with pytest.raises(ValueError, match="on_error='skip'.*open it with on_error='raise'"):
        fastload.DataLoader(skipping, batch_size=4, backend="dali")
    ds = fastload.PackedDataset(path, image_size=SIZE)
    with pytest.raises(ValueError, match="batch_size"):
        fastload.DataLoader(ds, batch_size=None, backend="dali")
    with pytest.raises(ValueError, match="collate_fn"):
        fastload.DataLoader(ds, batch_size=4, backend="dali", collate_fn=lambda b: b)
    unknown = r"backend='jax' is not a fastload backend; choose one of 'torch', 'dali'"
    with pytest.raises(ValueError, match=unknown):
        fastload.DataLoader(ds, batch_size=4, backend="jax")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def undecodable(tmp_path_factory) -> tuple[Path, int]:
    """A dataset whose record 7 passes pack's header check but has a broken Huffman table."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("dali-bad")
    listing = write_id_list(base / "pictures", 12, sizes=[(64, 48)], png_every=0)
    bad = 7
    good = encode(picture(64, 48, seed=bad))
    table = good.find(b"\xff\xc4")
    broken = bytearray(good)
    broken[table + 5:table + 21] = bytes(16)  # the table's code counts
    (base / "pictures" / f"img{bad:04d}.jpg").write_bytes(bytes(broken))
    out = base / "bad.fl"
    pack(listing, out, format="lmdb", workers=1, progress=False)
    return out, bad


@needs_dali
def test_a_record_dali_cannot_decode_fails_the_loop_naming_it(undecodable):
    path, bad = undecodable
    loader = make(path, "dali", batch_size=3, shuffle=False, train=False)
    delivered = []
    with pytest.raises(CorruptRecordError) as info:
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == [0, 1, 2, 3, 4, 5]  # every batch before the bad one
    message = str(info.value)
    assert f"record {bad} (img{bad:04d}.jpg)" in message and "DALI could not decode it" in message
    assert "fastload verify --decode" in message
    # The pipeline died with the error; the next iteration builds a new one.
    loader.set_epoch(0)
    assert run(loader, limit=2)[0] == [0, 1, 2, 3, 4, 5]
    # The torch backend refuses the same record too.
    with pytest.raises(CorruptRecordError):
        run(make(path, "torch", batch_size=3, shuffle=False, train=False))


@needs_dali
def test_max_pixels_is_enforced_before_dali_decodes(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=False, max_pixels=64 * 64)
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, backend="dali")
    big = next(i for i in range(ID_RECORDS) if ds.index.width[i] * ds.index.height[i] > 64 * 64)
    delivered = []
    with pytest.raises(CorruptRecordError, match=rf"record {big} .*possible decompression bomb"):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == list(range(big // BATCH * BATCH))  # the batches before its own


@needs_dali
def test_a_damaged_record_fails_after_the_batches_before_it(packed, tmp_path):
    """A checksum failure while reading ahead waits for its turn, as in the torch backend."""
    dataset = shutil.copytree(packed["lmdb"], tmp_path / "ids.fl")
    ds = fastload.PackedDataset(dataset)
    bad = 16
    payload, shard = ds.record(bad)["data"], ds.manifest.shards[int(ds.index.shard[bad])].file
    blob = bytearray((dataset / shard).read_bytes())
    at = blob.find(payload)
    blob[at + len(payload) // 2] ^= 0x5A
    (dataset / shard).write_bytes(bytes(blob))
    loader = make(dataset, "dali", shuffle=False)
    delivered = []
    with pytest.raises(CorruptRecordError, match=f"record {bad} "):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == list(range(15))
