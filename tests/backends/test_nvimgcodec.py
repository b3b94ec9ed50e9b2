"""backend="nvimgcodec": what is GPU decode's own beyond the contract every decoding backend meets
(tests/backends/test_contract.py): records the GPU decoder does not take decoded by the CPU path,
skips counted, whole-image decode, worker processes decoding a share of each batch, and clear
errors. Real nvImageCodec: its CPU codecs everywhere, ``device="cuda"`` on a lent GPU (``-m gpu``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import fastload
from fastload.backends.decode_split import DecodeSplit, next_share
from fastload.decode.crops import decode_crop
from fastload.errors import CorruptRecordError, MissingDependencyError
from tests.backends.contract import (
    BATCH,
    DEVICES,
    FULL_SCALE_TOLERANCE,
    SIZE,
    TORCH_TOLERANCE,
    assert_close,
    in_a_fresh_process,
    make,
    needs_nvimgcodec,
    run,
)
from tests.conftest import REPO, flip_payload_byte
from tests.loading.helpers import ID_RECORDS

pytestmark = needs_nvimgcodec


def pixels_of_plans(loader, ids: list[int], epoch: int, seed: int) -> torch.Tensor:
    """The torch backend's CPU decode of each sample's own plan, at full scale."""
    ds = loader.dataset
    out = []
    for i in ids:
        plan = ds.pipeline.plan(i, epoch, seed, int(ds.index.width[i]), int(ds.index.height[i]))
        out.append(torch.from_numpy(np.array(decode_crop(ds.reader.read(i), plan, draft=False))).permute(2, 0, 1))
    return torch.stack(out)


def test_records_the_gpu_decoder_does_not_take_are_the_torch_backends_own_pixels(packed):
    """Every 5th record (4, 9, ...) is a PNG: decoded by the CPU path (reduced-scale draft and all), so its
    pixels equal the torch backend's to the bit, inside batches that mix both."""
    ids, got, _ = run(make(packed["lmdb"], "nvimgcodec", shuffle=False))
    torch_ids, expected, _ = run(make(packed["lmdb"], "torch", shuffle=False))
    assert ids == torch_ids
    pngs = [k for k, i in enumerate(ids) if i % 5 == 4]
    assert pngs and all(torch.equal(got[k], expected[k]) for k in pngs)


# --- damaged records: raised in their turn, or skipped and counted ---------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_a_record_no_decoder_takes_fails_the_loop_naming_it(undecodable, device):
    """A broken Huffman table: an error naming the record in its turn, on the GPU too (where a
    hardware engine might "decode" damaged data), as the torch backend raises it."""
    path, bad = undecodable
    loader = make(path, "nvimgcodec", batch_size=3, shuffle=False, train=False, device=device)
    delivered = []
    with pytest.raises(CorruptRecordError, match=rf"record {bad} \(img{bad:04d}.jpg\)"):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == [0, 1, 2, 3, 4, 5]  # every batch before the bad one
    loader.set_epoch(0)
    assert run(loader, limit=2)[0] == [0, 1, 2, 3, 4, 5]  # the next iteration starts afresh


@pytest.mark.parametrize("device", DEVICES)
def test_a_jpeg_cut_short_decodes_as_the_torch_backend_decodes_it(cut_short, device):
    """A scan cut short, its end marker put back (pack takes it): libjpeg decodes what is there
    and so does the torch backend; nvImageCodec gives the same, on its CPU codecs and on the GPU,
    where a hardware engine might give grey or garbage instead."""
    path, bad = cut_short
    ids, expected, _ = run(make(path, "torch", batch_size=3, shuffle=False, train=False))
    got_ids, got, _ = run(make(path, "nvimgcodec", batch_size=3, shuffle=False, train=False, device=device))
    assert got_ids == ids == list(range(12))
    assert_close(got[bad:bad + 1], expected[bad:bad + 1], TORCH_TOLERANCE)


def test_skip_leaves_out_undecodable_and_damaged_records_and_counts_them(undecodable, tmp_path):
    path, bad = undecodable
    dataset = shutil.copytree(path, tmp_path / "bad.fl")
    damaged = 2  # bytes that fail their checksum, besides ``bad`` whose bytes do not decode
    flip_payload_byte(dataset, damaged)
    skipping = fastload.PackedDataset(dataset, image_size=SIZE, train=False, on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=3, shuffle=False, backend="nvimgcodec")
    with pytest.warns(UserWarning, match="skipped"):
        ids, _, sizes = run(loader)
    assert ids == [i for i in range(12) if i not in (damaged, bad)]
    assert sizes == [2, 3, 2, 3] and loader.stats()["skipped"] == 2


# --- clear errors -----------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_asked_for_without_cuda_names_the_backend_and_the_way_back(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True)
    with pytest.raises(ValueError, match=r"backend='nvimgcodec' with device='cuda': CUDA is not available.*"
                                         r"backend='torch'.*device='cpu'"):
        fastload.DataLoader(ds, batch_size=4, backend="nvimgcodec", device="cuda")


def test_without_nvimgcodec_the_error_names_the_package(packed):
    """A real failed import: ``nvidia.nvimgcodec`` blocked in a fresh interpreter."""
    code = (
        "import sys, json\n"
        "sys.modules['nvidia.nvimgcodec'] = None\n"
        "import fastload\n"
        f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=16, train=True)\n"
        "try:\n"
        "    next(iter(fastload.DataLoader(ds, batch_size=4, backend='nvimgcodec')))\n"
        "except Exception as exc:\n"
        "    print(json.dumps([type(exc).__name__, isinstance(exc, ImportError), str(exc)]))\n"
    )
    name, is_import_error, message = in_a_fresh_process(code)
    assert (name, is_import_error) == (MissingDependencyError.__name__, True)
    assert "pip install 'nvidia-nvimgcodec-cu1" in message and "pip install -e '.[gpu" in message
    assert "backend='nvimgcodec'" in message and "backend='torch'" in message


def test_unsupported_datasets_and_arguments_are_refused(packed):
    path = packed["lmdb"]
    for dataset in (fastload.PackedDataset(path, transform=lambda img: img), fastload.PackedDataset(path)):
        with pytest.raises(ValueError, match=r"backend='nvimgcodec'.*PackedDataset\(path, image_size=\.\.\., train=\.\.\.\)"):
            fastload.DataLoader(dataset, batch_size=4, backend="nvimgcodec")
    ds = fastload.PackedDataset(path, image_size=SIZE, train=True)
    with pytest.raises(ValueError, match="backend='nvimgcodec': batch_size=None"):
        fastload.DataLoader(ds, batch_size=None, backend="nvimgcodec")
    with pytest.raises(ValueError, match="backend='nvimgcodec': collate_fn"):
        fastload.DataLoader(ds, batch_size=4, backend="nvimgcodec", collate_fn=lambda b: b)
    fields = fastload.PackedDataset(path, image_size=SIZE, train=True, fields=("image", "label"))
    with pytest.raises(ValueError, match="backend='nvimgcodec' delivers .*fields="):
        fastload.DataLoader(fields, batch_size=4, backend="nvimgcodec")


def test_nothing_is_printed_by_the_codec_library(packed):
    """nvImageCodec's extensions print to the process's stdout when a codec is missing: kept quiet."""
    code = ("import fastload\n"
            f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=16, train=True)\n"
            "x, y = next(iter(fastload.DataLoader(ds, batch_size=4, backend='nvimgcodec')))\n"
            "print('shape', tuple(x.shape))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)
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
    assert_close(got, pixels_of_plans(loader, ids, 0, 3), FULL_SCALE_TOLERANCE[("nvimgcodec", "cpu")])


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
    joined = []
    for b in range(len(batches)):
        cut = split.cut(b)
        assert split.cut(b) == cut  # the other side, asking for the same batch, finds the same cut
        joined.append(cut.cpu + cut.gpu)
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


def test_a_batch_whose_every_record_is_skipped_is_delivered_empty_and_counted(undecodable):
    path, bad = undecodable
    skipping = fastload.PackedDataset(path, image_size=SIZE, train=False, on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=1, shuffle=False, backend="nvimgcodec")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids, _, sizes = run(loader)
    assert ids == [i for i in range(12) if i != bad] and sizes[bad] == 0
    assert loader.stats()["skipped"] == 1


def test_the_gpu_and_dev_extras_both_bring_nvjpeg():
    """nvImageCodec without its nvjpeg extra has no GPU JPEG decoder: every extra that installs it
    must ask for nvJPEG too (the dev extra did not)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    extras = config["options.extras_require"]
    for name in ("gpu", "gpu-cu13", "dev"):
        wanted = [line.strip() for line in extras[name].splitlines() if "nvimgcodec" in line]
        assert wanted and all("[nvjpeg]" in line for line in wanted), (name, wanted)
