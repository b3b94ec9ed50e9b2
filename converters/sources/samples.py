"""Python writer, sample side: a sample's fields typed from the first sample (or ``fields=``), every
later sample checked against them, and each value turned into the bytes or index value a record keeps.

Python numbers, bools and strings are index fields (int64, float64, bool, str); lists and tuples
of numbers are array fields (``float64[*,4]``); the image, and bytes, paths, PIL images and NumPy
arrays in other fields, are file fields (a torch tensor is taken as its NumPy array, a 0-d one as
its number) (see converters.sources.sample_payloads for how each is
stored). ``fields=`` declares types the first sample cannot tell (a fixed first dimension, an
array as "mask": a 2-D uint8/uint16 array is a mask only when the field is named "mask").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import numpy as np
from fastload.converters.packing.headers import JPEG_SOI
from fastload.converters.sources.file_fields import field_type

from fastload.format.files import read_regular
from fastload.format.layout import (
    FIELD_DTYPES,
    FILE_TYPES,
    MASK_MODES,
    NO_LABEL,
    array_type,
    field_name_problem,
    float64_problem,
    is_field_dtype,
)

KEY = "__key__"  # a sample's name (the index's ``path``); by default its number, zero-padded
_INT64 = (-(2**63), 2**63 - 1)
# the torch dtypes NumPy holds (bfloat16, float8, complex32 and quantized tensors have no NumPy twin)
_NUMPY_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64", "complex64", "complex128")


class BadSample(Exception):
    """A sample that cannot be written; ``reason`` names the field and says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Checked:
    """A sample whose fields match the schema: index values now, file inputs still to convert."""

    number: int
    key: str
    label: int
    values: dict[str, Any]  # index field → value
    inputs: dict[str, Any]  # "image" and each file field → the value given (arrays as given)


class Schema:
    """The fields every sample must have, with their types: ``fields`` or the first sample's."""

    def __init__(self, fields: Mapping[str, str] | None, classes: list[str] | None) -> None:
        self.classes = list(classes) if classes is not None else None
        self.types: dict[str, str] | None = None
        self.has_label = classes is not None
        self.seen = False  # a sample checked already: the first one says whether samples have labels
        if fields is not None:
            self.types = dict(fields)
            for name, dtype in self.types.items():
                try:
                    _check_name(name)
                except BadSample as exc:
                    raise ValueError(f"fields=: {exc.reason}") from None
                if not is_field_dtype(dtype):
                    raise ValueError(f"fields[{name!r}] = {dtype!r}: not a field type; use one of "
                                     f"{', '.join((*FIELD_DTYPES, *FILE_TYPES))} or an array type like 'float64[*,4]'")

    @property
    def index_types(self) -> dict[str, str]:
        return {n: t for n, t in (self.types or {}).items() if t not in FILE_TYPES}

    @property
    def file_types(self) -> dict[str, str]:
        return {n: t for n, t in (self.types or {}).items() if t in FILE_TYPES}

    def check(self, sample: object, number: int) -> Checked:
        """The sample's key, label and values, checked; BadSample naming the field otherwise."""
        if not isinstance(sample, Mapping):
            raise BadSample(f"is a {type(sample).__name__}, not a dict of fields like {{'image': ..., 'label': 3}}")
        sample = {name: untensor(str(name), value) for name, value in sample.items()}
        key = sample.get(KEY, f"{number:08d}")
        if not isinstance(key, str) or not key or "\x00" in key:
            raise BadSample(f"{KEY} is {key!r}: a sample's key must be non-empty text")
        if not self.seen:  # the first sample: its label (and, unless fields= named them, its fields) are every sample's
            self.has_label, self.seen = self.has_label or "label" in sample, True
        if self.types is None:
            self.types = {name: _infer(name, value) for name, value in sample.items()
                          if name not in ("image", "label", KEY) and _check_name(name) is None}
        expected = ["image", *(["label"] if self.has_label else []), *self.types]
        missing = [name for name in expected if name not in sample]
        if missing:
            raise BadSample(f"field {missing[0]!r} is missing; every sample needs the fields of the first "
                            f"({', '.join(expected)})")
        new = [name for name in sample if name not in expected and name != KEY]
        if new:
            raise BadSample(f"field {new[0]!r} is new: the first sample had no such field ({', '.join(expected)}); "
                            "give every sample the same fields")
        values, inputs = {}, {"image": _file_input("image", "image", sample["image"])}
        for name, dtype in self.types.items():
            if dtype in FILE_TYPES:
                inputs[name] = _file_input(name, dtype, sample[name])
            else:
                values[name] = _index_value(name, dtype, sample[name])
        label = self._label(sample.get("label", NO_LABEL)) if self.has_label else NO_LABEL
        return Checked(number, key, label, values, inputs)

    def _label(self, value: object) -> int:
        if isinstance(value, str):
            if self.classes is None:
                raise BadSample(f"label is the text {value!r}; pass classes=[...] to name the classes, or give numbers")
            if value not in self.classes:
                raise BadSample(f"label {value!r} is not one of classes ({', '.join(self.classes[:5])}, ...)")
            return self.classes.index(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise BadSample(f"label is a {type(value).__name__}; a label is a whole number (or a class name)")
        if value < 0 or (self.classes is not None and value >= len(self.classes)) or value > _INT64[1]:
            raise BadSample(f"label {value} is out of range (0..{len(self.classes) - 1 if self.classes else '2**63-1'})")
        return int(value)


def _check_name(name: object) -> None:
    problem = field_name_problem(name)
    if problem is not None:
        raise BadSample(f"field name {name!r} {problem}")


def _infer(name: str, value: object) -> str:
    """A field's type from its first value (see the module's docstring)."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int64"
    if isinstance(value, (float, np.floating)):
        return "float64"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        kinds = {"b": "bool", "i": "int64", "u": "int64", "f": "float64"}
        array = np.asarray(value)
        if array.size == 0 or array.dtype.kind not in kinds:
            raise BadSample(f"field {name!r} is a list whose element type cannot be told ({array.dtype}, "
                            f"{array.size} values); declare it with fields={{{name!r}: 'float64[*]'}}")
        return f"{kinds[array.dtype.kind]}[*{''.join(f',{d}' for d in array.shape[1:])}]"
    if isinstance(value, np.ndarray):
        mask = name == "mask" and value.ndim == 2 and value.dtype in (np.uint8, np.uint16)
        return "mask" if mask else "npy"
    if is_pil(value):
        return "mask" if value.mode in MASK_MODES else "image"  # type: ignore[attr-defined]
    if isinstance(value, (bytes, bytearray, memoryview, PurePath)):
        data = bytes(value) if not isinstance(value, PurePath) else _read_path(name, value)
        if data.startswith(JPEG_SOI):
            return "image"
        rel = str(value) if isinstance(value, PurePath) else "x.npy" if data.startswith(b"\x93NUMPY") else "x.png"
        return field_type(data, rel) or "file"
    raise BadSample(f"field {name!r} is a {type(value).__name__}; a field is a number, bool, text, a list of "
                    "numbers, a NumPy array, a PIL image, bytes or a path")


def _read_path(name: str, path: PurePath) -> bytes:
    """The file a field names, read to tell its type; BadSample naming the field and the path."""
    try:
        return read_regular(path, 2**30)
    except OSError as exc:  # /proc/self/environ, a folder, a FIFO, no such file, no permission
        raise BadSample(f"field {name!r}: {os.fsdecode(path)} cannot be read ({exc.strerror or exc})") from None


def _index_value(name: str, dtype: str, value: Any) -> Any:
    """``value`` as field ``name`` of type ``dtype`` stores it in the index."""
    def wrong() -> BadSample:
        return BadSample(f"field {name!r} is {type(value).__name__} {_short(value)}, the field holds {dtype} "
                         "(typed by the first sample or fields=)")

    if dtype == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise wrong()
        return bool(value)
    if dtype in ("int64", "float64") and (isinstance(value, (bool, np.bool_))
                                          or not isinstance(value, (int, float, np.integer, np.floating))):
        raise wrong()
    if dtype == "int64":
        if not isinstance(value, (int, np.integer)) or not _INT64[0] <= value <= _INT64[1]:
            raise wrong()
        return int(value)
    if dtype == "float64":
        number = int(value) if isinstance(value, (int, np.integer)) else float(value)
        problem = float64_problem(number)  # the rule a file list's numbers follow
        if problem is not None:
            raise BadSample(f"field {name!r} is {problem}")
        return float(number)
    if dtype == "str":
        if not isinstance(value, str):
            raise wrong()
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadSample(f"field {name!r} is not valid UTF-8 text ({_short(value)})") from None
        return value
    element, first, rest = array_type(dtype)  # type: ignore[misc]
    array = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if array is not None and array.size == 0 and first in (None, 0):  # no rows: [] has no shape to check
        return np.zeros((0, *rest), dtype=element)
    if array is None or array.dtype.kind not in {"bool": "b", "int64": "biu", "float64": "biuf"}[element] \
            or array.shape[1:] != rest or array.ndim != 1 + len(rest) or first not in (None, len(array)):
        raise wrong()
    if element == "float64":
        problem = _float_elements_problem(value, array)
        if problem is not None:
            raise BadSample(f"field {name!r} holds {problem}")
    return array.astype(element)


def _float_elements_problem(value: Any, array: np.ndarray) -> str | None:
    """The first element of a float64 array field's ``value`` that float64 does not hold as given
    (float64_problem), or None; a list's elements as given, an array's where they could be one."""
    if isinstance(value, np.ndarray):
        if array.dtype.kind == "f":
            bad = array[~np.isfinite(array)]
            return float64_problem(float(bad[0])) if bad.size else None
        if array.dtype.kind not in "iu":
            return None
        elements = array[(array > 2**53) | (array < -(2**53))].tolist()  # only these can round
    else:
        elements = np.asarray(value, dtype=object).reshape(-1).tolist()
    for element in elements:
        if not isinstance(element, (bool, np.bool_)):
            problem = float64_problem(int(element) if isinstance(element, (int, np.integer)) else float(element))
            if problem is not None:
                return problem
    return None


def _file_input(name: str, dtype: str, value: Any) -> Any:
    """The input of a file field, checked for its kind; an array as given (the Writer copies it once
    it is bounded: sample_payloads.held)."""
    if isinstance(value, (bytes, PurePath)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, np.ndarray) and dtype != "file":
        return value
    if is_pil(value) and dtype in ("image", "mask", "mask-rows"):
        return value
    pil = dtype in ("image", "mask", "mask-rows")
    raise BadSample(f"field {name!r} is {type(value).__name__} {_short(value)}; a {dtype} field takes bytes, a path"
                    f"{', a PIL image or a NumPy array' if pil else ' or a NumPy array' if dtype == 'npy' else ''}")


def untensor(name: str, value: object) -> object:
    """A torch tensor as a NumPy array (a 0-d one as its number), anything else as it is; BadSample
    naming the field for a tensor NumPy cannot hold, told by its dtype, layout and device alone. A
    broadcast tensor (zero strides) stays a broadcast array: only its distinct values are read, and
    the field's bounds (converters.sources.sample_payloads) judge it by its shape."""
    torch = sys.modules.get("torch")  # a tensor's type is defined there: no torch imported, no tensor
    if torch is None or not isinstance(value, torch.Tensor):
        return value
    what = f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if value.layout != torch.strided:
        raise BadSample(f"field {name!r} is {what} in {value.layout} layout; give a dense one (tensor.to_dense())")
    if value.device.type == "meta":
        raise BadSample(f"field {name!r} is {what} on the meta device: it has a shape but no values")
    if value.ndim > 0 and str(value.dtype).removeprefix("torch.") not in _NUMPY_DTYPES:
        raise BadSample(f"field {name!r} is {what}, a dtype NumPy cannot hold; convert it first "
                        "(tensor.float(), or tensor.to(torch.uint8) for pixels)")
    tensor = value.detach()
    try:
        if tensor.ndim == 0:
            return tensor.item()  # a number, whatever its dtype (a bfloat16 score too)
        distinct = tensor[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in tensor.stride())]
        return np.broadcast_to(distinct.cpu().resolve_conj().resolve_neg().numpy(), tuple(tensor.shape))
    except (RuntimeError, TypeError, ValueError) as exc:  # a kind of tensor not foreseen above
        raise BadSample(f"field {name!r} is {what} that cannot be read as a NumPy array ({exc})") from None


def is_pil(value: object) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "mode")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
