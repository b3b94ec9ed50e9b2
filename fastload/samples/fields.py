"""Samples with fields: a PackedDataset's ``fields=`` as dict (or tuple) samples and batches.

The fields asked for are ``"image"``, ``"label"`` and any the pack stored (numbers, text, arrays,
file fields: see fastload.format.layout). A sample is a dict of them; a batch is collated field by
field by type (:func:`fastload.samples.collate.collate_field`). The built-in crop moves what lies on the
image with its pixels: file fields of its size (masks, second images, depth maps:
:mod:`fastload.samples.file_fields`) and ``boxes``, an array field of boxes
(:func:`fastload.decode.transforms.boxes_through_crop`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastload.samples.collate import ImageBatch, collate_field
from fastload.samples.field_slots import FieldSlots
from fastload.errors import CorruptRecordError
from fastload.samples.file_fields import decode_file_field
from fastload.format import Manifest, RecordIndex
from fastload.format.layout import FILE_TYPES, array_type
from fastload.decode.transforms import CropPlan, boxes_through_crop


def field_names(fields: Iterable[str]) -> tuple[str, ...]:
    """``fields=`` read once (a generator too) as a tuple of distinct names."""
    if isinstance(fields, (str, bytes)):
        raise TypeError(f"fields={fields!r}: pass a sequence of names, e.g. fields=({fields!r},)")
    names = tuple(fields)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"fields={names!r}: {name!r} is not a field name (a str)")
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise ValueError(f"fields={names!r}: {twice!r} is asked for {names.count(twice)} times; "
                         "name each field once")
    return names


class SampleFields:
    """Which fields a dataset's samples carry, checked against its manifest, and how they are
    read, moved with the crop and collated.

    Args:
        manifest, index: the dataset's.
        names: the fields asked for, in the order the dicts list them.
        pad: ``{name: value}``: variable-length array fields padded into one tensor.
        boxes: the box field that follows the crop (needs ``cropped``), or None.
        box_fields: fields with one row per box, filtered with the boxes.
        cropped: the dataset runs the built-in crop (``image_size=``).
        where: names the dataset in messages.
        as_tuple: samples and batches are tuples in the order of ``names``, not dicts.
        max_pixels: the dataset's limit, for images in file fields too.
    """

    def __init__(self, manifest: Manifest, index: RecordIndex, names: Sequence[str],
                 pad: Mapping[str, float] | None, boxes: str | None, box_fields: Sequence[str], *,
                 cropped: bool, where: str, as_tuple: bool = False, max_pixels: int) -> None:
        names = field_names(names)
        self.types: dict[str, str] = {"image": "image", "label": "int64", **manifest.fields}
        unknown = [name for name in names if name not in self.types]
        if unknown or not names:
            raise ValueError(f"fields={tuple(names)!r}: {where} has no field {unknown[0]!r}; it has "
                             f"{', '.join(self.types)}" if unknown else "fields=(): ask for at least one field")
        self.names, self.index = tuple(names), index
        self.reader: Any = None  # the dataset's reader, attached by it (file fields are read with it)
        self.as_tuple, self.max_pixels = as_tuple, max_pixels
        self.files = tuple(name for name in self.names if name != "image" and self.types[name] in FILE_TYPES)
        variable = [n for n in self.names if (k := array_type(self.types[n])) and k[1] is None]
        for name in pad or {}:
            if name not in variable:
                raise ValueError(f"pad_fields: {name!r} is not one of the variable-length array fields asked "
                                 f"for ({', '.join(variable) or 'none'})")
            if f"{name}_lengths" in self.names:  # the batch would hold one under the other's key
                raise ValueError(f"pad_fields: {name!r} adds {name}_lengths to each batch, a field asked for "
                                 "too; leave one of them out of fields=")
        self.pad = dict(pad or {})
        self.boxes, self.box_fields = self._check_boxes(boxes, tuple(box_fields), cropped, where)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["index"] = state["reader"] = None  # the dataset re-opens them where it is unpickled
        return state

    def _check_boxes(self, boxes: str | None, aligned: tuple[str, ...], cropped: bool,
                     where: str) -> tuple[str | None, tuple[str, ...]]:
        if boxes is None:
            if aligned:
                raise ValueError("box_fields= are filtered with the boxes: pass boxes= too")
            return None, ()
        kind = array_type(self.types.get(boxes, ""))
        if kind is None or kind[0] == "bool" or kind[2] != (4,):
            fields = {n: t for n, t in self.types.items() if n not in ("image", "label")}
            raise ValueError(f"boxes={boxes!r}: not a field of boxes in {where} (one needs type "
                             f"<number>[*,4]: x0, y0, x1, y1 in the image's pixels; its fields: {fields or 'none'})")
        if not cropped or boxes not in self.names:
            raise ValueError(f"boxes={boxes!r} moves the boxes with the built-in crop: pass image_size= and "
                             f"fields= naming {boxes!r}")
        for name in aligned:
            if name not in self.names or array_type(self.types.get(name, "")) is None:
                raise ValueError(f"box_fields: {name!r} must be an array field asked for in fields=, with "
                                 "one row per box (the labels of the boxes, say)")
        return boxes, aligned

    def value(self, name: str, i: int) -> Any:
        """Record ``i``'s stored value of field ``name`` (arrays as read-only views of the index)."""
        return int(self.index.label[i]) if name == "label" else self.index.field(name, i)

    def values(self, i: int, plan: CropPlan | None, where: str,
               reads: Mapping[str, Callable[[int], bytes]] | None = None,
               slots: FieldSlots | None = None) -> dict[str, Any]:
        """Record ``i``'s stored fields other than image and label, file fields read (``reads``:
        a file field's batch, fetched already) and decoded; with a crop ``plan``, the file fields
        of the image's size cut as its pixels are (masks into their batch's ``slots``), and the
        ``boxes`` moved (clipped, mirrored; those left without area dropped
        with their rows of ``box_fields``). ``where`` names the record in errors."""
        values = {name: self.value(name, i) for name in self.names
                  if name not in ("image", "label") and name not in self.files}
        for name in self.files:
            data = reads[name](i) if reads else self.reader.read(i, name)
            spatial = plan is not None and int(self.index.files[name].width[i]) >= 0
            out = slots.slot_of(name, i) if slots is not None and spatial else None
            values[name] = decode_file_field(self.types[name], data, plan if spatial else None,
                                             where=self.reader.where(i, name), max_pixels=self.max_pixels, out=out)
        if self.boxes is not None and plan is not None:
            moved, keep = boxes_through_crop(values[self.boxes], plan)
            for name in self.box_fields:
                if len(values[name]) != len(keep):
                    raise CorruptRecordError(f"{where}: {len(keep)} boxes but {len(values[name])} rows of "
                                             f"{name!r}; box_fields need one row per box")
            values[self.boxes] = moved
            for name in self.box_fields:
                values[name] = np.asarray(values[name])[keep]
        return values

    def sample(self, image: Any, label: Any, values: dict[str, Any]) -> Any:
        """One sample as the dict (or tuple) of the fields asked for, arrays as tensors (copies: the
        index's views are read-only)."""
        out = {name: image if name == "image" else label if name == "label" else values[name]
               for name in self.names}
        out = {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in out.items()}
        return tuple(out.values()) if self.as_tuple else out

    def collate(self, samples: list[Any]) -> Any:
        """Samples into one batch: numbers as tensors, text as lists of str, arrays stacked when
        they share a shape, else lists, or padded with ``<name>_lengths`` (``pad``); images and
        file fields stacked when they are tensors of one shape."""
        if self.as_tuple:
            samples = [dict(zip(self.names, s)) for s in samples]
        out: dict[str, Any] = {}
        for name in self.names:
            values = [s[name] for s in samples]
            if name == "image":
                tensors = all(isinstance(v, torch.Tensor) for v in values)
                out[name] = torch.stack(values) if tensors and len({v.shape for v in values}) == 1 else values
            else:
                self._collate_into(out, name, values)
        return self.batch_as_asked(out)

    def batch_as_asked(self, out: dict[str, Any]) -> Any:
        """The collated fields as a dict, or as a tuple in the order asked (a padded field: its
        ``(padded, lengths)`` pair in its place)."""
        if not self.as_tuple:
            return out
        return tuple((out[name], out[f"{name}_lengths"]) if name in self.pad else out[name] for name in self.names)

    def slots(self, indices: list[int], out_size: tuple[int, int]) -> FieldSlots | None:
        """Batch tensors for the cut masks of records ``indices`` (None: no field asked for is
        a mask)."""
        if not any(self.types[name] in ("mask", "mask-rows") for name in self.files):
            return None
        return FieldSlots(indices, out_size)

    def into_batch(self, batch: ImageBatch, samples: list[dict[str, Any]], slots: FieldSlots | None = None) -> None:
        """Give a decoded batch its fields (its images and labels as they are), collated from each
        sample's ``values`` (computed in the decode threads; masks cut into ``slots`` are their
        batch tensor as it is)."""
        out: dict[str, Any] = {}
        for name in self.names:
            if name == "image":
                out[name] = batch.images
            elif name == "label":
                out[name] = batch.labels
            else:
                values = [s[name] for s in samples]
                whole = slots.collated(name, values) if slots is not None else None
                if whole is None:
                    self._collate_into(out, name, values)
                else:
                    out[name] = whole
        batch.fields, batch.samples = self.batch_as_asked(out), samples

    def _collate_into(self, out: dict[str, Any], name: str, values: list[Any]) -> None:
        collated = collate_field(self.types[name], values, self.pad.get(name))
        if name in self.pad:
            out[name], out[f"{name}_lengths"] = collated
        else:
            out[name] = collated
