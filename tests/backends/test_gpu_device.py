"""backend="nvimgcodec" on a real GPU (``-m gpu``; skipped without CUDA, run by bench/gpu_check.sh on
a lent machine): decoding really runs there (device buffers, the hardware engines where the GPU has
them), the steady state never synchronises the host, payload slots are released after the decode's
CUDA event, the resample's pixels on the GPU, and a loader on cuda:1 opens no context on GPU 0."""

from __future__ import annotations

import io
from itertools import islice

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.backends.crop_resample import resample_into, value_dtype
from fastload.backends.nvimgcodec_decoder import EngineDecoders
from fastload.backends.resample_plan import Crop, plan_chunks
from tests.backends.contract import in_a_fresh_process, make, needs_nvimgcodec, run, same_crops
from tests.backends.test_payload_slots import pooled, wait_until

pytestmark = [
    needs_nvimgcodec,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)"),
]
ENGINE_GPUS = ("A100", "A30", "H100", "H200", "H800", "GH200", "B200")
"""GPUs with hardware JPEG engines (nvJPG)."""


def photo_jpeg(width: int = 160, height: int = 120) -> bytes:
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def test_decoding_runs_on_the_gpu_in_device_buffers():
    """Each engine of the GPU decodes into device memory (nvImageCodec's STRIDED_DEVICE buffers),
    the pixels those of its CPU codecs within a level or two; the hardware engines are found on
    the GPUs that have them."""
    device = torch.device("cuda", 0)
    decoders = EngineDecoders(device, 4)
    assert "cuda" in decoders.engines
    if any(name in torch.cuda.get_device_name(device) for name in ENGINE_GPUS):
        assert decoders.engines[0] == "hardware"
    payload = photo_jpeg()
    cpu = EngineDecoders(torch.device("cpu"), 1)
    reference = cpu.by_engine["cpu_codecs"].decode([cpu.parse(payload)], [None], None)[0].pixels
    stream = torch.cuda.Stream(device)
    for engine, decoder in decoders.by_engine.items():
        raw = decoder.decoder.decode([decoder.parse(payload)], params=decoder.params, cuda_stream=stream.cuda_stream)[0]
        assert raw.buffer_kind == decoder.codec.ImageBufferKind.STRIDED_DEVICE, engine
        image = decoder.decode([decoder.parse(payload)], [None], stream)[0]
        stream.synchronize()
        assert image.pixels.is_cuda and image.pixels.device == device, engine
        rows = [image.pixels[r * image.row_bytes:r * image.row_bytes + image.width * 3] for r in range(image.height)]
        diff = (torch.cat(rows).cpu().to(torch.int16) - reference.to(torch.int16)).abs()
        assert float(diff.float().mean()) < 2.0, engine


def test_without_device_a_loader_says_once_that_it_decodes_on_the_cpu(packed):
    """Issue 46.4, on a machine with CUDA: said once a process, naming the way to the GPU."""
    import warnings

    from fastload.backends import nvimgcodec

    nvimgcodec._said_where.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(2):
            loader = make(packed["lmdb"], "nvimgcodec", device=None)
    assert [str(w.message).count("device='cuda'") for w in said if "CPU codecs" in str(w.message)] == [1]
    assert run(loader, limit=1)[1].device.type == "cpu"


def test_a_loaders_counts_show_the_gpu_engines_took_the_jpegs(packed):
    loader = make(packed["lmdb"], "nvimgcodec", device="cuda")
    ids, _, _ = run(loader)
    counts = loader.stats()
    pngs = sum(1 for i in ids if i % 5 == 4)
    assert counts["decoded_cpu"] == pngs
    assert counts.get("decoded_hardware", 0) + counts.get("decoded_cuda", 0) == len(ids) - pngs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_steady_state_never_synchronises_the_host(packed, num_workers):
    """torch's sync debug mode made strict after two batches and until the last (a pass's end
    waits for its events): any synchronising CUDA call of the pipeline (a pageable copy, a stream
    synchronize, .item()) would raise in its stage."""
    loader = make(packed["lmdb"], "nvimgcodec", device="cuda", batch_size=2, num_workers=num_workers,
                  mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    batches = 0
    it = iter(loader)
    try:
        for _ in range(2):
            next(it)
        torch.cuda.set_sync_debug_mode("error")
        for images, _ in islice(it, len(loader) - 3):
            images.add_(1)  # the loop's own work on its stream
            batches += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert batches == len(loader) - 3 and len(list(it)) == 1


def test_payload_slots_are_released_after_the_decodes_cuda_event(packed, monkeypatch):
    """One slot, reused part after part: each part's payloads read by the GPU before the next part
    is written into the slot (a reuse too early would be another record's bytes, or a generation
    error); the batches as without workers."""
    alone = make(packed["hdf5"], "nvimgcodec", seed=5, device="cuda")
    expected = run(alone)
    loader, pool = pooled(monkeypatch, make(packed["hdf5"], "nvimgcodec", seed=5, device="cuda", num_workers=2),
                          slots=1)
    ids, images, sizes = run(loader)
    assert (ids, sizes) == expected[::2] and same_crops(images, expected[1], "cuda")
    assert wait_until(lambda: pool().free() == 1) and pool().counts["pooled"] >= 3


def test_the_resample_on_the_gpu_is_the_cpus_within_a_level():
    rng = np.random.default_rng(4)
    shapes = [(int(rng.integers(40, 400)), int(rng.integers(40, 400))) for _ in range(64)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    crops = [Crop(top=1.5, left=2.0, height=h - 4.0, width=w - 3.0, flip=bool(k % 2)) for k, (h, w) in enumerate(shapes)]
    outs = {}
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        out = torch.zeros((64, 3, 96, 80), dtype=torch.uint8, device=device)
        chunks = plan_chunks([(h, w, w * 3) for h, w in shapes], crops, list(range(64)), (96, 80),
                             value_dtype(device), pinned=device.type == "cuda")
        resample_into(out, [torch.from_numpy(p.reshape(-1)).to(device) for p in images], chunks)
        outs[device.type] = out.cpu().to(torch.int16)
    assert int((outs["cuda"] - outs["cpu"]).abs().max()) <= 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_loader_on_cuda_1_opens_no_context_on_gpu_0(packed):
    """A process training on cuda:1 without set_device: the pipeline's threads, torch's pin-memory
    thread and nvImageCodec work on GPU 1 only (issue 46.5)."""
    code = (
        "import json, torch, fastload\n"
        f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=32)\n"
        "loader = fastload.DataLoader(ds, batch_size=4, backend='nvimgcodec', device='cuda:1', num_workers=2)\n"
        "for x, y in loader:\n"
        "    assert x.device == torch.device('cuda', 1)\n"
        "print(json.dumps([torch._C._cuda_hasPrimaryContext(0), torch._C._cuda_hasPrimaryContext(1)]))\n"
    )
    assert in_a_fresh_process(code, timeout=300) == [False, True]
