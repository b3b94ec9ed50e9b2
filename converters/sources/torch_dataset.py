"""Map-style dataset source: a torch ``Dataset`` or any sequence of samples, each item read, checked
and encoded as the Python writer does (converters.sources.samples, sample_payloads).

An item is a dict of fields as ``fastload.Writer.write`` takes (``{"image": ..., "label": 3,
"caption": "..."}``, a ``__key__`` naming it) or a tuple ``(image, label)`` or ``(image, label,
{fields})``. torch tensors become NumPy arrays (a 0-d one its number). Each item's result is a
``Read``: its record's payloads and index values, or why it cannot be packed. ``read_item`` runs in
the pack's worker processes (converters.packing.dataset_reads); it never raises for an item.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastload.converters.sources.sample_payloads import Payloads, to_payloads
from fastload.converters.sources.samples import BadSample, Schema

from fastload.format.layout import stored_file_types


def is_sequence_source(src: object) -> bool:
    """Whether ``src`` is packed as a map-style dataset: it has ``len`` and ``[i]``, and is neither
    text nor bytes nor a table (a Hugging Face ``datasets`` object or a pyarrow table goes to the
    table source, converters.sources.tables)."""
    if isinstance(src, (str, bytes, bytearray, memoryview, Mapping)):
        return False
    if type(src).__module__.split(".")[0] in ("datasets", "pyarrow"):
        return False
    return hasattr(src, "__len__") and hasattr(src, "__getitem__")


@dataclass(frozen=True)
class ReadSettings:
    """How every item is checked and encoded (the writer's options)."""

    quality: int | None
    decode: bool
    max_pixels: int
    max_file_size: int
    mask_storage: str = "rows"  # "rows": a mask field stored as its values' rows (type mask-rows)


def stored_types(schema: Schema, settings: ReadSettings) -> dict[str, str]:
    """Each file field's type as stored: a mask as rows unless ``mask_storage="file"`` (as the writer's)."""
    return stored_file_types(schema.file_types, settings.mask_storage)


@dataclass
class Read:
    """Item ``index``: its record (``payloads`` and index values), or ``reason`` it cannot be packed;
    ``error``: the exception the dataset raised, when read in this process (None from a worker
    process, and for a bad sample: ``reason`` and ``trace`` say what happened)."""

    index: int
    key: str = ""
    label: int = -1
    values: dict[str, Any] | None = None
    payloads: Payloads | None = None
    reason: str | None = None
    error: BaseException | None = None
    trace: str = ""  # the dataset's traceback, as text (a worker's exception crosses without its own)

    def summary(self) -> dict[str, Any]:
        """What a resume compares: the record's checksums and index values (JSON's types)."""
        assert self.payloads is not None and self.values is not None
        return {"key": self.key, "label": self.label, "checksum": self.payloads.checksum,
                "files": [checksum for _, checksum, _ in self.payloads.files], "values": json_values(self.values)}


def json_values(values: dict[str, Any]) -> dict[str, Any]:
    """Index values as a journal keeps them: arrays as lists (float64 round-trips exactly)."""
    return {name: value.tolist() if isinstance(value, np.ndarray) else value for name, value in values.items()}


def read_item(dataset: Any, schema: Schema, settings: ReadSettings, index: int) -> Read:
    """``dataset[index]`` read, checked against ``schema`` and turned into its record's bytes."""
    try:
        item = dataset[index]
    except Exception as exc:  # noqa: BLE001 - the dataset's own, whatever it is: named with the item, never swallowed
        return Read(index, reason=f"raised {type(exc).__name__}: {exc}", error=exc,
                    trace="".join(traceback.format_exception(exc)))
    try:
        checked = schema.check(as_sample(item), index)
        payloads = to_payloads(checked, stored_types(schema, settings), settings.quality, decode=settings.decode,
                               max_pixels=settings.max_pixels, max_file_size=settings.max_file_size)
    except BadSample as exc:
        return Read(index, reason=exc.reason)
    return Read(index, checked.key, checked.label, checked.values, payloads)


def as_sample(item: object) -> Mapping[str, Any]:
    """A dataset item as the writer's dict of fields (see the module's docstring)."""
    if isinstance(item, Mapping):
        return item  # Schema.check makes the sample's own dict (tensors as arrays)
    if isinstance(item, tuple) and len(item) in (2, 3):
        fields = item[2] if len(item) == 3 else {}
        if not isinstance(fields, Mapping) or {"image", "label"} & set(fields):
            raise BadSample(f"is a tuple whose third value is {type(fields).__name__}; a tuple item is "
                            "(image, label) or (image, label, {fields}) with fields other than image and label")
        return {"image": item[0], "label": item[1], **fields}  # tensors: Schema.check takes them
    raise BadSample(f"is a {type(item).__name__}; an item is a dict of fields like {{'image': ..., 'label': 3}}, "
                    "or a tuple (image, label) or (image, label, {fields})")


