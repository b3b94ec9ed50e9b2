"""Tables as a source, Parquet read in place: where each row's image lies in the file, found by
walking the page headers of an uncompressed image column chunk, so that packing reads each image
as a folder's file is read (one ``pread``, no decoding, no Arrow buffer in between).

Read through pyarrow, an image is copied three times before the shard writer has it (the file into
an Arrow buffer, the dictionary or PLAIN values into a dense array, that array into Python bytes);
read in place, once. A chunk handles values PLAIN-encoded or dictionary-encoded (the dictionary a
PLAIN page: pyarrow's writer puts every image of a row group there when they are all distinct), in
data pages v1 or v2. Anything else (a compressed chunk, another encoding, a page this walk does not
know) raises Unsupported and the row group is read through pyarrow, as before.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

# Parquet's enums (parquet.thrift)
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
_HEADER_READ = 1 << 12  # a page header's first read; one with large statistics is read again, longer
_HEADER_MAX = 1 << 24


class Unsupported(Exception):
    """This chunk is not read in place (the reason is the message); pyarrow reads it."""


class _Short(Exception):
    """The page header runs past the bytes read so far."""


def image_spans(fd: int, chunk: Any, max_def: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of the chunk's ``rows`` rows: where its value starts in the file and its length in
    bytes (int64 arrays; start -1 where the row is null). ``chunk`` is pyarrow's
    ColumnChunkMetaData of a top-level (or struct field) BYTE_ARRAY column; ``max_def`` its
    maximum definition level: a row holds a value only at that level."""
    if chunk.compression != "UNCOMPRESSED":
        raise Unsupported(f"compressed ({chunk.compression})")
    first = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
        first = min(first, chunk.dictionary_page_offset)
    pos, end = first, first + chunk.total_compressed_size
    starts, lengths = np.full(rows, -1, np.int64), np.zeros(rows, np.int64)
    dictionary: tuple[np.ndarray, np.ndarray] | None = None
    row = 0
    while row < rows:
        if pos >= end:
            raise Unsupported(f"its pages hold {row} rows, its metadata {rows}")
        header, body = _page_header(fd, pos)
        size = header.get(3, -1)
        if size < 0 or body + size > end:
            raise Unsupported(f"a page at byte {pos} runs past its column chunk")
        kind = header.get(1)
        if kind == _DICTIONARY_PAGE:
            page = header.get(7, {})
            if page.get(2, _PLAIN) not in (_PLAIN, _PLAIN_DICTIONARY):
                raise Unsupported(f"a dictionary encoded {page.get(2)}")
            dictionary = _plain_values(fd, body, body + size, page.get(1, -1))
        elif kind in (_DATA_PAGE, _DATA_PAGE_V2):
            row += _data_page(fd, header, body, body + size, max_def, dictionary, starts[row:], lengths[row:])
        elif kind != _INDEX_PAGE:
            raise Unsupported(f"page type {kind} at byte {pos}")
        pos = body + size
    return starts, lengths


def _data_page(fd: int, header: dict[int, Any], body: int, end: int, max_def: int,
               dictionary: tuple[np.ndarray, np.ndarray] | None, starts: np.ndarray, lengths: np.ndarray) -> int:
    """Fill ``starts``/``lengths`` with one data page's rows; returns how many rows it holds."""
    v2 = header[1] == _DATA_PAGE_V2
    page = header.get(8 if v2 else 5, {})
    count, encoding = page.get(1, -1), page.get(4 if v2 else 2)
    if count < 0 or count > len(starts):
        raise Unsupported(f"a data page of {count} values, {len(starts)} rows left")
    width = max_def.bit_length()
    if v2:
        if page.get(6, 0):
            raise Unsupported("repetition levels")
        level_bytes = page.get(5, 0)
        levels = (_hybrid(_pread(fd, level_bytes, body), width, count) if max_def
                  else np.zeros(count, np.int64))
        values = body + level_bytes
    elif max_def:
        if page.get(3) != _RLE:
            raise Unsupported(f"definition levels encoded {page.get(3)}")
        (level_bytes,) = struct.unpack("<i", _pread(fd, 4, body))
        levels = _hybrid(_pread(fd, level_bytes, body + 4), width, count)
        values = body + 4 + level_bytes
    else:
        levels, values = np.zeros(count, np.int64), body
    present = np.flatnonzero(levels == max_def)
    if encoding == _PLAIN:
        at, size = _plain_values(fd, values, end, len(present))
    elif encoding in (_PLAIN_DICTIONARY, _RLE_DICTIONARY) and dictionary is not None:
        raw = _pread(fd, end - values, values) if len(present) else b"\x00"
        keys = _hybrid(raw[1:], raw[0], len(present))
        if len(keys) and (keys.min() < 0 or keys.max() >= len(dictionary[0])):
            raise Unsupported("a dictionary index out of range")
        at, size = dictionary[0][keys], dictionary[1][keys]
    else:
        raise Unsupported(f"values encoded {encoding}")
    starts[present], lengths[present] = at, size
    return count


def _plain_values(fd: int, pos: int, end: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where ``count`` PLAIN BYTE_ARRAY values (each a 4-byte length, then its bytes) lie."""
    if count < 0:
        raise Unsupported("a page with no value count")
    at, size = np.empty(count, np.int64), np.empty(count, np.int64)
    for n in range(count):
        if pos + 4 > end:
            raise Unsupported("PLAIN values run past their page")
        (length,) = struct.unpack("<i", _pread(fd, 4, pos))
        at[n], size[n], pos = pos + 4, length, pos + 4 + length
        if length < 0 or pos > end:
            raise Unsupported("PLAIN values run past their page")
    return at, size


def _hybrid(data: bytes, width: int, count: int) -> np.ndarray:
    """``count`` values of Parquet's RLE / bit-packed hybrid encoding, ``width`` bits each."""
    if not 0 <= width <= 32:
        raise Unsupported(f"a bit width of {width}")
    out, filled, pos, step = np.zeros(count, np.int64), 0, 0, (width + 7) // 8
    weights = np.int64(1) << np.arange(width, dtype=np.int64)
    while filled < count:
        header, pos = _varint(data, pos)
        if header >> 1 == 0:
            raise Unsupported("an empty run in levels or indices")
        if header & 1:  # bit-packed: groups of 8 values, least significant bit first
            size = (header >> 1) * width
            if pos + size > len(data):
                raise Unsupported("levels or indices run past their page")
            bits = np.unpackbits(np.frombuffer(data, np.uint8, size, pos), bitorder="little")
            values = bits.reshape(-1, width).astype(np.int64) @ weights if width else np.zeros((header >> 1) * 8, np.int64)
            take = min(len(values), count - filled)
            out[filled:filled + take] = values[:take]
            pos += size
        else:  # a run of one value
            if pos + step > len(data):
                raise Unsupported("levels or indices run past their page")
            take = min(header >> 1, count - filled)
            out[filled:filled + take] = int.from_bytes(data[pos:pos + step], "little")
            pos += step
        filled += take
    return out


def _page_header(fd: int, pos: int) -> tuple[dict[int, Any], int]:
    """The Thrift PageHeader at ``pos`` and where the page's body starts."""
    want = _HEADER_READ
    while want <= _HEADER_MAX:
        data = _pread(fd, want, pos, exact=False)
        try:
            header, used = _struct(data, 0)
            return header, pos + used
        except _Short:
            if len(data) < want:
                raise Unsupported(f"the file ends inside the page header at byte {pos}") from None
            want *= 4
    raise Unsupported(f"a page header over {_HEADER_MAX} bytes at byte {pos}")


def _pread(fd: int, size: int, pos: int, exact: bool = True) -> bytes:
    data = os.pread(fd, size, pos)
    if exact and len(data) != size:
        raise Unsupported(f"the file ends at byte {pos + len(data)}, inside a page")
    return data


# Thrift's compact protocol, as much as a PageHeader needs: a struct is {field id: value}.

def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise _Short
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    value, pos = _varint(data, pos)
    return (value >> 1) ^ -(value & 1), pos


def _struct(data: bytes, pos: int) -> tuple[dict[int, Any], int]:
    fields: dict[int, Any] = {}
    last = 0
    while True:
        if pos >= len(data):
            raise _Short
        byte = data[pos]
        pos += 1
        if byte == 0:  # STOP
            return fields, pos
        kind, delta = byte & 0x0F, byte >> 4
        if delta:
            last += delta
        else:
            last, pos = _zigzag(data, pos)
        fields[last], pos = _value(data, pos, kind, in_struct=True)


def _value(data: bytes, pos: int, kind: int, in_struct: bool = False) -> tuple[Any, int]:
    if kind in (1, 2) and in_struct:  # a struct's boolean is in its field header
        return kind == 1, pos
    if kind in (1, 2, 3):  # a list's boolean, or a byte
        if pos >= len(data):
            raise _Short
        return data[pos], pos + 1
    if kind in (4, 5, 6):
        return _zigzag(data, pos)
    if kind == 7:
        if pos + 8 > len(data):
            raise _Short
        return struct.unpack_from("<d", data, pos)[0], pos + 8
    if kind == 8:
        size, pos = _varint(data, pos)
        if pos + size > len(data):
            raise _Short
        return data[pos:pos + size], pos + size
    if kind in (9, 10):
        if pos >= len(data):
            raise _Short
        size, element = data[pos] >> 4, data[pos] & 0x0F
        pos += 1
        if size == 15:
            size, pos = _varint(data, pos)
        items = []
        for _ in range(size):
            item, pos = _value(data, pos, element)
            items.append(item)
        return items, pos
    if kind == 11:
        size, pos = _varint(data, pos)
        if not size:
            return {}, pos
        if pos >= len(data):
            raise _Short
        key_kind, value_kind = data[pos] >> 4, data[pos] & 0x0F
        pos += 1
        mapping = {}
        for _ in range(size):
            key, pos = _value(data, pos, key_kind)
            mapping[key], pos = _value(data, pos, value_kind)
        return mapping, pos
    if kind == 12:
        return _struct(data, pos)
    raise Unsupported(f"a Thrift field of type {kind} in a page header")
