"""nvImageCodec, loaded quietly: JPEG regions → decoded ``H×W×3`` uint8 pixels (GPU, or its CPU codecs).

nvImageCodec is NVIDIA's codec library, the one DALI decodes with: batched JPEG decode on the
GPU's hardware JPEG engines where it has them (A100, H100, H200), in CUDA otherwise, and on the
CPU (libjpeg-turbo) without a GPU. Its extensions print to the process's own stdout/stderr when a
codec library is missing (nvJPEG 2000 and nvTIFF, which fastload does not use); that output is
kept, and shown only if the decoder cannot be made. One decoder per engine
(:mod:`fastload.backends.decode_engines` chooses which takes each record).
"""

from __future__ import annotations

import io
import os
import tempfile
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import torch

from fastload.backends.decode_engines import Engine
from fastload.errors import MissingDependencyError
from fastload.optional import extra_hint

PURPOSE = "DataLoader(backend='nvimgcodec')"
JPEG_MAGIC = b"\xff\xd8\xff"

_loaded: tuple[ModuleType, str] | None = None
_has_engines: dict[int, bool] = {}  # GPU index → whether a probe found hardware JPEG engines there


class DecodedImage(NamedTuple):
    """One decoded image: its ``H×W×3`` uint8 pixels as a flat (1-D) tensor on the decoder's
    device, rows ``row_bytes`` apart (a row may be padded: only its first ``width × 3`` are pixels).
    The tensor keeps nvImageCodec's image alive."""

    pixels: torch.Tensor
    height: int
    width: int
    row_bytes: int


class Region(NamedTuple):
    """The rectangle of an image to decode, in whole pixels: ``[x0, x1) × [y0, y1)``."""

    x0: int
    y0: int
    x1: int
    y1: int


def package_for_torch() -> str:
    """The nvImageCodec wheel that matches the installed torch's CUDA (13.x or else 12.x)."""
    cuda = torch.version.cuda or ""
    return "nvidia-nvimgcodec-cu13[nvjpeg]" if cuda.startswith("13") else "nvidia-nvimgcodec-cu12[nvjpeg]"


def load() -> tuple[ModuleType, str]:
    """``nvidia.nvimgcodec`` and what its extensions printed while loading (once a process)."""
    global _loaded
    if _loaded is None:
        with tempfile.TemporaryFile() as said:
            try:
                with _native_output_to(said):
                    from nvidia import nvimgcodec
            except ImportError as exc:
                extra = "gpu-cu13" if "cu13" in package_for_torch() else "gpu"
                raise MissingDependencyError(
                    f"{PURPOSE} needs nvImageCodec, which is not importable here ({exc}); install "
                    f"it: pip install '{package_for_torch()}' (or {extra_hint(extra)}), or load with "
                    "backend='torch'") from exc
            said.seek(0)
            _loaded = nvimgcodec, said.read().decode(errors="replace")
    return _loaded


class _native_output_to:
    """Point file descriptors 1 and 2 at ``file`` (C libraries write there, not to sys.stdout)."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.saved: list[int] = []

    def __enter__(self) -> None:
        for fd in (1, 2):
            self.saved.append(os.dup(fd))
            os.dup2(self.file.fileno(), fd)

    def __exit__(self, *exc: object) -> None:
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)


class RegionDecoder:
    """Decodes batches of JPEG regions with nvImageCodec, on ``device`` (a CUDA device) or its CPU codecs.

    Args:
        device: a CUDA device (decode there: hardware engines or CUDA), or CPU (libjpeg-turbo
            inside nvImageCodec; the tests' and a GPU-less machine's path, not a fast one).
        threads: CPU threads nvImageCodec may use (Huffman decode of the hybrid path, CPU codecs).
        options: nvImageCodec decoder options (``":fancy_upsampling=0"``; see its docs).
        backends: on the GPU, the names of nvImageCodec's backends allowed, in its words
            (``HW_GPU_ONLY``, ``GPU_ONLY``, ``HYBRID_CPU_GPU``, ``CPU_ONLY``); None allows all.
    """

    def __init__(self, device: torch.device, threads: int, *, options: str = "",
                 backends: Sequence[str] | None = None) -> None:
        codec, said = load()
        self.device = device
        self.gpu = device.type == "cuda"
        with tempfile.TemporaryFile() as said_now:
            try:
                with _native_output_to(said_now):  # its notes on threads and codecs, kept for errors
                    if self.gpu:
                        allowed = None if backends is None else [codec.Backend(getattr(codec, b)) for b in backends]
                        self.decoder = codec.Decoder(device_id=device.index if device.index is not None else
                                                     torch.cuda.current_device(), max_num_cpu_threads=threads,
                                                     backends=allowed, options=options)
                    else:
                        self.decoder = codec.Decoder(device_id=codec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                                     max_num_cpu_threads=threads, options=options,
                                                     backends=[codec.Backend(codec.CPU_ONLY)])
            except RuntimeError as exc:
                said_now.seek(0)
                said = (said + said_now.read().decode(errors="replace")).strip()
                shown = f"; while loading it said: {said[:800]}" if said else ""
                raise RuntimeError(f"{PURPOSE}: nvImageCodec could not make a decoder on {device} ({exc})"
                                   f"{shown}; load with backend='torch'") from exc
        # EXIF orientation is ignored, as Pillow in the torch backend: crops were planned on the
        # stored width and height. Every image comes out as 3 interleaved RGB channels.
        self.params = codec.DecodeParams(apply_exif_orientation=False, color_spec=codec.SRGB,
                                         sample_format=codec.I_RGB)
        self.codec = codec

    def parse(self, payload: bytes | memoryview) -> Any:
        """``payload``'s code stream when this decoder should decode it: a JPEG, not CMYK/YCCK
        (which the torch backend converts with Pillow's rules); None sends it to the CPU path."""
        if payload[:3] != JPEG_MAGIC:
            return None
        try:
            stream = self.codec.CodeStream(payload)
        except Exception:  # noqa: BLE001 - a header it cannot parse: the CPU path names the error
            return None
        return stream if stream.num_channels in (1, 3) else None

    def decode(self, streams: Sequence[Any], regions: Sequence[Region | None],
               stream: torch.cuda.Stream | None) -> list[DecodedImage | None]:
        """Each parsed code stream's region (None: the whole image), decoded on this decoder's
        device, or None where nvImageCodec could not decode it. On the GPU the pixels are ready
        on ``stream``."""
        codec = self.codec
        parts = [s if r is None else s.get_sub_code_stream(region=codec.Region(r.y0, r.x0, r.y1, r.x1))
                 for s, r in zip(streams, regions)]
        images = self.decoder.decode(parts, params=self.params,
                                     cuda_stream=stream.cuda_stream if stream is not None else 0)
        return [None if im is None else self._flat(im) for im in images]

    def _flat(self, image: Any) -> DecodedImage:
        height, width = int(image.shape[0]), int(image.shape[1])
        row_bytes = int(image.strides[0]) if image.strides else width * 3
        length = (height - 1) * row_bytes + width * 3
        if self.gpu:
            return DecodedImage(torch.as_tensor(_Flat(image, length, "__cuda_array_interface__"), device=self.device),
                                height, width, row_bytes)
        return DecodedImage(torch.from_numpy(np.asarray(_Flat(image, length, "__array_interface__"))), height, width,
                            row_bytes)


class _Flat:
    """A decoded image's bytes as a 1-D array of ``length`` (its rows, their padding between them),
    through the array interface: no copy, no torch operation; the image lives as long as its views."""

    def __init__(self, image: Any, length: int, interface: str) -> None:
        described = dict(getattr(image, interface))
        described.update(shape=(length,), strides=None, typestr="|u1")
        self.image = image
        setattr(self, interface, described)


class EngineDecoders:
    """A decoder for each engine the device has (:mod:`fastload.backends.decode_engines`): on a GPU,
    its hardware JPEG engines (where a probe decode shows them) and nvJPEG's CUDA decoder; without
    one, nvImageCodec's CPU codecs.

    Args:
        device: the loader's device.
        threads: CPU threads each decoder may use.
    """

    def __init__(self, device: torch.device, threads: int) -> None:
        self.device = device
        self.lock = threading.Lock()
        """One batch at a time through these decoders (a pass given up may still be decoding when
        the next starts; an nvImageCodec decoder called from two threads at once can hang)."""
        self.by_engine: dict[Engine, RegionDecoder] = {}
        if device.type != "cuda":
            self.by_engine["cpu_codecs"] = RegionDecoder(device, threads)
            return
        if _has_engines.get(device.index, True):
            try:
                hardware = RegionDecoder(device, threads, backends=["HW_GPU_ONLY"])
                if _takes_a_jpeg(hardware):
                    self.by_engine["hardware"] = hardware
            except RuntimeError:  # no hardware engines on this GPU
                pass
            _has_engines[device.index] = "hardware" in self.by_engine
        self.by_engine["cuda"] = RegionDecoder(device, threads, backends=["GPU_ONLY", "HYBRID_CPU_GPU"])

    @property
    def engines(self) -> tuple[Engine, ...]:
        """The engines this device decodes with, the first choice first."""
        return tuple(self.by_engine)

    def parse(self, payload: bytes | memoryview) -> Any:
        """``payload``'s code stream (any of the decoders parses it), or None."""
        return next(iter(self.by_engine.values())).parse(payload)


def _takes_a_jpeg(decoder: RegionDecoder) -> bool:
    """Whether ``decoder`` decodes a small baseline JPEG (a GPU without hardware engines gives None)."""
    from PIL import Image

    encoded = io.BytesIO()
    Image.new("RGB", (64, 48), (90, 140, 200)).save(encoded, "JPEG", quality=90)
    stream = torch.cuda.Stream(decoder.device)
    try:
        image = decoder.decode([decoder.parse(encoded.getvalue())], [None], stream)[0]
        stream.synchronize()
    except RuntimeError:
        return False
    return image is not None
