"""Which decoder takes each record (fastload/backends/decode_engines.py): the hardware JPEG engines
first, CUDA for the JPEGs they cannot take, the CPU for the rest; chosen from each record's frame
marker and nvImageCodec's own parse of its header (real JPEGs made with Pillow; the choice is
the same logic on a GPU, which only adds the engines)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.backends.decode_engines import BASELINE, PROGRESSIVE, frame_marker, next_engine, route
from fastload.backends.nvimgcodec import where_it_runs
from fastload.backends.nvimgcodec_decoder import EngineDecoders
from tests.backends.contract import make, needs_nvimgcodec, run

GPU = ("hardware", "cuda")  # a GPU with hardware JPEG engines (A100, H100, H200)
NO_ENGINES = ("cuda",)  # a GPU without them
CPU = ("cpu_codecs",)


def encoded(mode: str = "RGB", fmt: str = "JPEG", **options) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


SAMPLES = {
    "baseline 4:2:0": encoded(),
    "baseline 4:4:4": encoded(subsampling=0),
    "baseline grey": encoded("L"),
    "progressive": encoded(progressive=True),
    "cmyk": encoded("CMYK"),
    "png": encoded(fmt="PNG"),
    "exif first": encoded(exif=Image.Exif().tobytes()),
    "cut short": encoded()[:-300],
}
# Where each goes: a GPU with engines, one without, the CPU codecs.
EXPECTED = {
    "baseline 4:2:0": ("hardware", "cuda", "cpu_codecs"),
    "baseline 4:4:4": ("hardware", "cuda", "cpu_codecs"),
    "baseline grey": ("hardware", "cuda", "cpu_codecs"),
    "progressive": ("cuda", "cuda", "cpu_codecs"),
    "cmyk": ("cpu", "cpu", "cpu"),
    "png": ("cpu", "cpu", "cpu"),
    "exif first": ("hardware", "cuda", "cpu_codecs"),
    "cut short": ("cpu", "cpu", "cpu"),  # an error on the CPU path, never grey from an engine
}


@pytest.fixture(scope="module")
def decoders() -> EngineDecoders:
    pytest.importorskip("nvidia.nvimgcodec")
    return EngineDecoders(torch.device("cpu"), 1)


def test_the_frame_marker_is_read_from_the_segments():
    assert frame_marker(SAMPLES["baseline 4:2:0"]) == BASELINE
    assert frame_marker(SAMPLES["progressive"]) == PROGRESSIVE
    assert frame_marker(SAMPLES["exif first"]) == BASELINE  # found past an APP1 segment
    assert frame_marker(SAMPLES["png"]) is None
    assert frame_marker(SAMPLES["baseline 4:2:0"][:20]) is None  # cut before its frame


@needs_nvimgcodec
@pytest.mark.parametrize("name", list(SAMPLES))
def test_each_record_goes_to_the_first_engine_that_takes_it(decoders, name):
    from fastload.backends.decode_engines import facts_of

    payload = SAMPLES[name]
    stream = decoders.parse(payload)
    facts = facts_of(payload, stream) if stream is not None else None
    got = tuple(route(facts, engines) for engines in (GPU, NO_ENGINES, CPU))
    assert got == EXPECTED[name]


def test_a_jpeg_an_engine_fails_on_goes_to_the_next():
    assert next_engine("hardware", GPU) == "cuda"
    assert next_engine("cuda", GPU) == "cpu" and next_engine("cpu_codecs", CPU) == "cpu"


@needs_nvimgcodec
def test_without_a_gpu_the_cpu_codecs_decode_and_the_counts_say_so(packed):
    """Every 5th record is a PNG (the CPU path); the rest go through nvImageCodec's CPU codecs."""
    loader = make(packed["lmdb"], "nvimgcodec")
    ids, _, _ = run(loader)
    assert loader._tail.engines == ("cpu_codecs",)
    counts = loader.stats()
    pngs = sum(1 for i in ids if i % 5 == 4)
    assert (counts["decoded_cpu"], counts["decoded_cpu_codecs"]) == (pngs, len(ids) - pngs)
    assert loader.stats(reset=True)["decoded_cpu"] == pngs and loader.stats()["decoded_cpu"] == 0


def test_without_device_on_a_machine_with_cuda_the_loader_says_where_it_decodes():
    """Issue 46.4: backend='nvimgcodec' without device= would decode on the CPU codecs in silence."""
    said = where_it_runs(None, cuda_available=True)
    assert "device='cuda'" in said and "CPU codecs" in said and "backend='torch'" in said
    assert where_it_runs(torch.device("cpu"), cuda_available=True) is None  # the user's own choice
    assert where_it_runs(None, cuda_available=False) is None  # nothing else to choose here
    assert where_it_runs(torch.device("cuda", 1), cuda_available=True) is None
