"""Tables as a source, the columns: which one holds the image, which the label, and every other
column as a typed field, its type read from the Arrow schema (not guessed from values)."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastload.converters.sources.json_text import parse_json

from fastload.errors import SourceError
from fastload.format.layout import array_type
from fastload.optional import require

_CHOOSE = "choose the columns to keep as fields with --columns (columns=[...])"


def _types() -> Any:
    return require("pyarrow", "packing Parquet or Arrow tables").types


def _is_binary(t: Any) -> bool:
    types = _types()
    return types.is_binary(t) or types.is_large_binary(t) or getattr(types, "is_binary_view", bool)(t)


def is_image_type(t: Any) -> bool:
    """Image bytes: a binary column, or a struct with a binary ``bytes`` field (HF's ``Image``)."""
    if _types().is_struct(t):
        index = t.get_field_index("bytes")
        return index >= 0 and _is_binary(t.field(index).type)
    return _is_binary(t)


def image_bytes(column: Any) -> Any:
    """The image bytes of a column (HF ``Image`` structs: their ``bytes``, null where the struct is)."""
    if _types().is_struct(column.type):
        return require("pyarrow.compute", "packing Parquet or Arrow tables").struct_field(column, "bytes")
    return column


def hf_features(schema: Any) -> dict[str, Any]:
    """The Hugging Face features a table's schema metadata records (``{}`` when none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = parse_json(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):  # BadJson is a ValueError
        return {}
    return features if isinstance(features, dict) else {}


def choose_image(where: object, schema: Any, name: str | None) -> str:
    if name is not None:
        if name not in schema.names:
            raise SourceError(f"{where}: no image column {name!r} (columns: {', '.join(schema.names)}); "
                              "name the one that holds the image bytes with --image-column")
        if not is_image_type(schema.field(name).type):
            raise SourceError(f"{where}: image column {name!r} holds {schema.field(name).type}, not image bytes "
                              "(binary, or a struct with a binary 'bytes' field as HF's Image feature stores it)")
        return name
    found = [f.name for f in schema if is_image_type(f.type)]
    if len(found) != 1:
        what = f"{len(found)} columns hold bytes ({', '.join(found)})" if found else "no column holds image bytes"
        raise SourceError(f"{where}: {what} (columns: {', '.join(schema.names)}); name the image column "
                          "with --image-column (image_column=)")
    return found[0]


def choose_label(where: object, schema: Any, name: str | None) -> str | None:
    if name is None:
        return "label" if "label" in schema.names else None
    if name not in schema.names:
        raise SourceError(f"{where}: no label column {name!r} (columns: {', '.join(schema.names)}); "
                          "name another with --label-column, or leave it out")
    return name


def raw_labels(where: object, name: str, column: Any) -> np.ndarray | list[str | None]:
    """A label column's values: int64 (null: -1), or text (null: None) to number once all files are read."""
    types = _types()
    t = column.type.value_type if types.is_dictionary(column.type) else column.type
    if types.is_integer(t):
        return _ints(where, name, column.cast(t) if t != column.type else column, fill=-1)
    if types.is_string(t) or types.is_large_string(t):
        return column.cast(t).to_pylist()
    raise SourceError(f"{where}: label column {name!r} holds {column.type}; labels are whole numbers or "
                      "class names (text): name another with --label-column")


def field_type(where: object, name: str, t: Any) -> str:
    """A column's field type (``int64``, ``float64``, ``bool``, ``str``, or an array type such as
    ``float64[*]`` / ``float64[*,4]``), or a SourceError naming it."""
    types, whole = _types(), t
    if types.is_dictionary(t):
        t = t.value_type
    if types.is_string(t) or types.is_large_string(t):
        return "str"
    dims = []
    while types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        dims.append(str(t.list_size) if types.is_fixed_size_list(t) else "*")
        t = t.value_type
    element = ("bool" if types.is_boolean(t) else "int64" if types.is_integer(t)
               else "float64" if types.is_floating(t) else None)
    if element is None or "*" in dims[1:]:
        raise SourceError(f"{where}: column {name!r} holds {whole}, which no field type stores (numbers, "
                          f"booleans, text, lists of numbers with one varying dimension); {_CHOOSE}")
    return f"{element}[{','.join(dims)}]" if dims else element


def field_values(where: object, name: str, dtype: str, column: Any) -> Any:
    """A field's values, one per row: a NumPy array for numbers, a list of str or of arrays."""
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if _types().is_dictionary(column.type):
        column = column.dictionary_decode()
    if dtype == "str":
        return [v if v is not None else "" for v in column.to_pylist()]  # as a CSV's empty cell
    if array_type(dtype) is None:
        _no_nulls(where, name, column)
        return _ints(where, name, column) if dtype == "int64" else numbers(column)[0].astype(dtype)
    element, first, rest = array_type(dtype)
    pc = require("pyarrow.compute", "packing Parquet or Arrow tables")
    if first is not None:
        _no_nulls(where, name, column)
    lengths, null = numbers(pc.list_value_length(column))
    lengths = np.where(null, 0, lengths).astype(np.int64) if null is not None else lengths.astype(np.int64)
    flat = column.flatten()
    for _ in rest:
        _no_nulls(where, name, flat, "inside its rows")
        flat = flat.flatten()
    _no_nulls(where, name, flat, "inside its rows")
    values = _ints(where, name, flat) if element == "int64" else numbers(flat)[0].astype(element)
    return np.split(values.reshape(-1, *rest), np.cumsum(lengths)[:-1])


def _no_nulls(where: object, name: str, column: Any, inside: str = "") -> None:
    if column.null_count:
        row = int(np.flatnonzero(numbers(column.is_null())[0])[0])
        at = f"row {row}" if not inside else "a row"
        raise SourceError(f"{where}: column {name!r} is null at {at}{' (' + inside + ')' if inside else ''}; "
                          f"fill it, or {_CHOOSE}")


def _ints(where: object, name: str, column: Any, fill: int = -1) -> np.ndarray:
    values, null = numbers(column)
    kept = values if null is None else values[~null]
    if values.dtype == np.uint64 and len(kept) and kept.max() > np.iinfo(np.int64).max:
        row = int(np.flatnonzero((values > np.iinfo(np.int64).max) & (True if null is None else ~null))[0])
        raise SourceError(f"{where}: column {name!r} is {values[row]} at row {row}, out of range for int64; "
                          f"store smaller numbers, or {_CHOOSE}")
    values = values.astype(np.int64)
    if null is not None:
        values[null] = fill
    return values


def numbers(column: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A column of numbers or booleans as NumPy, read from its buffers, and where it is null (None:
    nowhere; a null's value is whatever its slot holds). pyarrow's ``to_numpy`` and ``fill_null``
    import pandas, 0.12-0.3 s of a pack that never needs it."""
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    parts = [_chunk_numbers(chunk) for chunk in chunks if len(chunk)]
    if not parts:
        return np.zeros(0, _numpy_type(column.type)), None
    values = np.concatenate([v for v, _ in parts])
    if all(null is None for _, null in parts):
        return values, None
    return values, np.concatenate([np.zeros(len(v), bool) if null is None else null for v, null in parts])


def _chunk_numbers(array: Any) -> tuple[np.ndarray, np.ndarray | None]:
    n, start = len(array), array.offset
    validity, data = array.buffers()[:2]
    dtype = _numpy_type(array.type)
    if dtype == np.bool_:
        values = _bits(data, start, n)
    else:
        values = np.frombuffer(data, dtype, n, start * dtype.itemsize).copy()
    return values, None if not array.null_count else ~_bits(validity, start, n)


def _bits(buffer: Any, start: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[start:start + n].astype(bool)


def _numpy_type(t: Any) -> np.dtype:
    types = _types()
    if types.is_boolean(t):
        return np.dtype(bool)
    if types.is_floating(t):
        return np.dtype(f"f{t.bit_width // 8}")
    if types.is_integer(t):
        return np.dtype(f"{'i' if types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    raise TypeError(f"{t} is not a column of numbers")  # field_type and raw_labels admit no other
