"""Bytes → values for datasets of files that are not images: NumPy arrays, text, WAV audio.

``PackedDataset(path, decode=...)`` picks one for a dataset whose manifest says ``kind: files``:

- ``"bytes"`` (the default): the file's bytes, as packed;
- ``"npy"``: a ``.npy`` file as a tensor of its dtype and shape (``allow_pickle=False``: an object
  array is refused, never unpickled);
- ``"text"``: UTF-8 text as a ``str``;
- ``"wav"``: PCM WAV (Python's ``wave``) as a ``channels × frames`` tensor of its sample type
  (``uint8`` for 8-bit, ``int16``, ``int32`` for 24- and 32-bit, widened with the sign kept);
- ``"auto"``: each record by its source file's extension (``.npy``, ``.txt``/``.json``/``.csv``
  as text, ``.wav``), bytes for any other.

A record that does not decode raises CorruptRecordError naming it (``on_error="skip"`` skips it).
"""

from __future__ import annotations

import io
import math
import os
import wave
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from fastload.errors import CorruptRecordError

if TYPE_CHECKING:
    import torch

FileDecode = Literal["bytes", "npy", "text", "wav", "auto"]
TEXT_EXTENSIONS = (".txt", ".json", ".csv", ".jsonl", ".md")


def npy_layout(data: bytes) -> tuple[tuple[int, ...], np.dtype]:
    """A ``.npy`` file's shape and dtype from its header alone, checked against the bytes after the
    header (a header may claim any shape in a few bytes): ValueError saying what is wrong."""
    if data[:4] == b"PK\x03\x04":
        raise ValueError("is an .npz archive, not a .npy array; pack its arrays as .npy files")
    stream = io.BytesIO(data)  # only the header is read
    try:
        version = np.lib.format.read_magic(stream)
        # 3.0 differs from 2.0 only in its header's text encoding (UTF-8 field names): sizes read alike
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                       np.lib.format.read_array_header_2_0 if version in ((2, 0), (3, 0)) else None)
        if read_header is None:
            raise ValueError(f"format version {version[0]}.{version[1]}, which numpy does not write")
        shape, _, dtype = read_header(stream)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"is not a readable .npy file ({exc or 'cut short'})") from None
    if dtype.hasobject:
        raise ValueError("holds Python objects (refused: fastload never unpickles)")
    if any(n < 0 for n in shape):
        raise ValueError(f"its header claims a negative dimension (shape {tuple(shape)}); the file is damaged")
    needed, present = math.prod(shape) * dtype.itemsize, len(data) - stream.tell()
    if needed > present:
        raise ValueError(f"its header claims an array of shape {tuple(shape)} and dtype {dtype} ({needed} "
                         f"bytes), but {present} bytes follow the header; the file is cut short or damaged")
    return tuple(shape), dtype


def decode_npy(data: bytes, where: str) -> torch.Tensor:
    """A ``.npy`` file's array as a tensor (its dtype and shape), its size checked before any
    allocation."""
    try:
        npy_layout(data)
        # read_array, not np.load: np.load would also open a zip or a pickle behind the bytes
        array = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        raise CorruptRecordError(f"{where}: {exc}") from None
    except (OSError, EOFError) as exc:
        raise CorruptRecordError(f"{where}: is not a readable .npy file ({exc or 'cut short'})") from None
    if not array.dtype.isnative:  # saved on a big-endian machine (">f4"): torch takes native order only
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        import torch  # here, not at the top: packing reads npy_layout and must not load torch

        return torch.from_numpy(np.ascontiguousarray(array))
    except TypeError as exc:  # a dtype torch has no tensor for (strings, unsigned 32-bit, ...)
        raise CorruptRecordError(f"{where}: array of dtype {array.dtype} has no torch tensor type ({exc}); "
                                 "use decode='bytes' and np.load it yourself") from None


def decode_text(data: bytes, where: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"{where}: is not UTF-8 text (byte {exc.start}: {exc.reason}); "
                                 "use decode='bytes' for other encodings") from None


def decode_wav(data: bytes, where: str) -> torch.Tensor:
    """PCM WAV samples as a ``channels × frames`` tensor."""
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, frames = wav.getnchannels(), wav.getsampwidth(), wav.getnframes()
            raw = wav.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise CorruptRecordError(f"{where}: is not a PCM WAV file ({exc or 'cut short'})") from None
    if len(raw) != frames * channels * width:
        raise CorruptRecordError(f"{where}: WAV data is cut short ({len(raw)} of {frames * channels * width} "
                                 "bytes)")
    if width == 3:  # 24-bit: widen to 32 with the sign kept
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        samples = (b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8
    else:
        samples = np.frombuffer(raw, dtype={1: np.uint8, 2: "<i2", 4: "<i4"}[width]).astype(
            {1: np.uint8, 2: np.int16, 4: np.int32}[width])
    import torch

    return torch.from_numpy(np.ascontiguousarray(samples.reshape(-1, channels).T))


DECODERS: dict[str, Callable[[bytes, str], Any]] = {"npy": decode_npy, "text": decode_text, "wav": decode_wav}


def decoder_for(decode: FileDecode, path: str) -> Callable[[bytes, str], Any] | None:
    """The decoder for a record packed from ``path`` (None: its bytes as they are)."""
    if decode == "auto":
        extension = os.path.splitext(path)[1].lower()
        decode = ("npy" if extension == ".npy" else "text" if extension in TEXT_EXTENSIONS else
                  "wav" if extension == ".wav" else "bytes")
    return DECODERS.get(decode)


def check_decode(decode: str) -> None:
    allowed = get_args(FileDecode)
    if decode not in allowed:
        raise ValueError(f"decode={decode!r}: must be {', '.join(map(repr, allowed[:-1]))} or {allowed[-1]!r}")
