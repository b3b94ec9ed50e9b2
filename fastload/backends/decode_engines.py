"""Which decoder takes each record of a batch: the GPU's hardware JPEG engines first, CUDA for the
JPEGs they cannot take, the CPU for the rest, chosen per batch from each record's header.

The hardware engines (A100, H100, H200: about 20,000 photos a second against CUDA's 15,000 on
an H200) decode baseline 8-bit JPEGs of the usual chroma layouts only; nvJPEG's CUDA decoder
also takes extended and progressive Huffman JPEGs. What nvImageCodec cannot take at all (PNGs,
CMYK and YCCK JPEGs, lossless or arithmetic-coded ones, a header it cannot parse) is decoded by
the torch backend's CPU code, per record. Without a GPU, nvImageCodec's CPU codecs stand in for
both GPU engines. A JPEG an engine fails on goes to the next: hardware → CUDA → CPU. A JPEG that
does not end with its end-of-image marker goes to the CPU at once: cut short, it is an error
there (as in the torch backend), where a hardware engine may "succeed" and fill the rest with grey.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal, NamedTuple

Engine = Literal["hardware", "cuda", "cpu_codecs", "cpu"]
"""``hardware``: the GPU's JPEG engines; ``cuda``: nvJPEG's CUDA decoder; ``cpu_codecs``:
nvImageCodec's CPU codecs (no GPU); ``cpu``: the torch backend's own CPU decode, per record."""
ORDER: tuple[Engine, ...] = ("hardware", "cuda", "cpu_codecs", "cpu")

BASELINE, EXTENDED, PROGRESSIVE = 0xC0, 0xC1, 0xC2
"""The start-of-frame markers of the Huffman-coded JPEG processes nvJPEG decodes."""
HARDWARE_LAYOUTS = frozenset({"CSS_444", "CSS_422", "CSS_420", "CSS_440", "CSS_411", "CSS_410", "CSS_GRAY"})
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF0-SOF15, less DHT, JPG and DAC


class JpegFacts(NamedTuple):
    """What the choice needs of one JPEG: its frame marker (``0xC0`` baseline, ...), whether it
    ends with its end-of-image marker, and what nvImageCodec's parse reports: sample precision,
    channels, chroma subsampling."""

    frame: int
    whole: bool
    precision: int
    channels: int
    layout: str


def frame_marker(payload: bytes | memoryview, limit: int = 1 << 16) -> int | None:
    """The JPEG's start-of-frame marker byte (``0xC0``-``0xCF``), read from its segment headers,
    or None when none comes before the scan (or within ``limit`` bytes)."""
    data = bytes(payload[:limit])
    at = 2  # after SOI
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _FRAMES:
            return marker
        if marker == 0xDA:  # start of scan: no frame header before it
            return None
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return None


def facts_of(payload: bytes | memoryview, stream: Any) -> JpegFacts | None:
    """``payload``'s facts from its bytes and nvImageCodec's parse of them (``stream``), or None
    when it has no frame header."""
    frame = frame_marker(payload)
    if frame is None:
        return None
    layout = getattr(stream.chroma_subsampling, "name", str(stream.chroma_subsampling))
    whole = bytes(payload[-2:]) == b"\xff\xd9"
    return JpegFacts(frame, whole, int(stream.precision or 8), int(stream.num_channels), layout)


def route(facts: JpegFacts | None, engines: Collection[Engine]) -> Engine:
    """The first of ``engines`` (those this loader's device has) that takes a JPEG with ``facts``;
    ``cpu`` when none does."""
    if facts is None or not facts.whole or facts.channels not in (1, 3) or facts.precision != 8:
        return "cpu"
    huffman = facts.frame in (BASELINE, EXTENDED, PROGRESSIVE)
    if "hardware" in engines and facts.frame == BASELINE and facts.layout in HARDWARE_LAYOUTS:
        return "hardware"
    if "cuda" in engines and huffman:
        return "cuda"
    if "cpu_codecs" in engines and huffman:
        return "cpu_codecs"
    return "cpu"


def next_engine(engine: Engine, engines: Collection[Engine]) -> Engine:
    """Where a JPEG ``engine`` failed on goes next: from the hardware engines to CUDA, else the CPU."""
    return "cuda" if engine == "hardware" and "cuda" in engines else "cpu"
