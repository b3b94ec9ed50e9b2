"""The report of ``bench`` and ``doctor``: one structure, printed as a table or written as JSON.

JSON (``--json FILE``), schema ``fastload-bench/1``; :data:`SCHEMA` is the same as JSON Schema
and :func:`validate` checks a document against it. Rates are per second of timed wall clock.

- ``schema``: ``"fastload-bench/1"``; ``command``: ``"bench"`` or ``"doctor"``; ``created``: UTC
  ISO-8601 time; ``interrupted``: Ctrl-C cut the run short (the rest is what was measured).
- ``machine``: ``cores`` (available to the process), ``cpu``, ``platform``, ``python``,
  ``torch``, ``pillow``, ``fastload`` versions, ``jpeg_decoder`` (fastload's JPEG crop decoder,
  in words), ``cuda`` (device name or null).
- ``config``: ``source``, ``packed`` (datasets used), ``batch_size``, ``image_size``,
  ``duration_s`` and ``samples`` (bounds of each run), ``cold``, ``model_step_ms`` (null: none or a
  callable), ``model_step_callable``, ``repeats`` (runs of each row, interleaved: A, B, C, A, B,
  C, ...; 1 in documents written before it existed); doctor adds ``num_workers``.
- ``runs``: one object per row: ``name``, ``kind`` (``baseline`` torch ImageFolder, ``fastload``,
  ``dali``, ``raw`` reads without decode), ``source`` (``folder``, ``lmdb``, ``hdf5``), ``status``
  (``ok``, ``partial``: interrupted, ``skipped``: could not start, ``failed``: raised while
  running; ``note`` says why), ``samples``, ``batches``, ``seconds`` (timed, after the warm-up),
  ``samples_per_s``, ``mb_per_s`` (raw rows: bytes read; others: samples × mean record size),
  ``wait_fraction`` (time inside ``next()`` / wall), ``peak_rss_mb`` (peak PSS of the process and
  its workers during the row; rows share one process, so a later row carries what earlier rows
  left: compare memory with each loader alone, as ``bench/load_bench.py`` does), ``speedup``
  (against ``reference``: the median over repeats of each repeat's own ratio), ``settings``;
  with ``repeats`` > 1 the rates are medians over the repeats that delivered, and ``samples``,
  ``batches`` and ``seconds`` their sums. ``median``, ``min``, ``max`` (samples/s over the
  repeats; null when none delivered), ``per_repeat`` and ``per_repeat_mb_s`` (each repeat's
  samples/s and MB/s, in order) were added later in /1: older documents lack them.
  ``step_ms`` (optional, added later in /1): under a model step, its mean time per batch in that
  row's loop (null or absent without one; raw rows never run the step).
- ``headspace`` (optional, added later in /1; null or absent without a model step): ``step``
  (the step in words), ``device``, ``samples_per_s`` and ``step_ms`` of the step alone on one
  batch already on its device, ``steps`` timed (0 for a slept stand-in, whose rate is by
  construction). ``config.model`` names a ``--model`` (null: none).
- ``reference``: ``pipeline`` (the best torch row: what decoded rows' ``speedup`` divides by)
  and ``raw`` (the small-file raw row, for raw rows), each a row name or null.
- ``ceilings`` (null when not measured): ``decode_per_core`` (full-size decode, images/s on one
  core), ``cores``, ``decode_ceiling`` (per core × cores), ``decode_all_cores_measured`` (decode
  on every core at once), ``decode_reduced_per_core`` (fastload's train decode on one decode
  thread; null without JPEGs), ``decode_reduced_pillow_per_core`` (the same through Pillow's
  whole-image path; null without JPEGs or without the native region decoder), ``memcpy_mb_s``,
  ``read_warm_mb_s`` and ``read_cold_mb_s`` (record reads with 16 in flight; cold: null unless
  ``cold``), ``disk_sequential_mb_s`` (shards read in order, cold;
  null unless ``cold`` with a packed dataset), ``h2d_pinned_mb_s``, ``h2d_pageable_mb_s`` (null
  without CUDA).
- ``stages`` (doctor, or bench with ``--stages``; else empty): ``name``, ``kind`` (``io``, ``cpu``,
  ``transfer``), ``seconds_per_sample`` on one thread (the median of its timing rounds),
  ``samples_per_s``, ``parallel`` (at once in the diagnosed loader), ``note``; ``low`` and
  ``high`` (added later in /1): its fastest and slowest round (null: timed once).
- ``verdict`` (null without stages): ``bottleneck`` (``io``, ``cpu``, ``transfer``, ``model``;
  null when the timings' spread was too wide to name one: ``label`` and ``reason`` say so),
  ``label``, ``stage`` (null also when its group is clear but its stages too close to tell apart),
  ``reason``, ``advice`` (list), ``capacities`` (stage group → samples/s it allows),
  ``predicted_rate``, ``wait_fraction``.
- ``verdict.loader``: the row whose loader the verdict is about (added later in /1).
- ``verdict.doubt`` (optional, added later in /1): why the verdict is only a hint (a stage timed
  alone allows less than the loader delivered), or null.
- ``load`` (optional, added later in /1; null where /proc cannot be read): the machine's load
  while it measured (:class:`~fastload.benchmark.machine_load.MachineLoad`): ``cores`` watched,
  ``seconds``, ``others_cores``, ``steal_cores`` and ``own_cores`` (cores' worth of CPU used by
  other processes, stolen by the hypervisor, used by this process and its workers),
  ``load_average`` (1 minute) on ``machine_cores``, and ``busy`` (others took at least a quarter
  of the cores: the numbers move from run to run).
- ``skipped`` (optional): ``path`` (below the image folder) and ``reason`` of each file left out
  of every row because it cannot be decoded.
- ``notes``: what the reader should know (skipped files, temporary pack, mismatched record
  counts, ...).
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastload.benchmark.machine_load import MachineLoad
from fastload.benchmark.repeats import paired_ratio
from fastload.benchmark.result import RunResult
from fastload.benchmark.stages import Stage
from fastload.benchmark.text import format_report
from fastload.benchmark.training import Headspace
from fastload.benchmark.verdict import Verdict

SCHEMA_ID = "fastload-bench/1"
_NUM, _INT, _STR = {"type": "number"}, {"type": "integer"}, {"type": "string"}
_NUM_OR_NULL, _STR_OR_NULL = {"type": ["number", "null"]}, {"type": ["string", "null"]}


def _obj(props: dict[str, Any], extra: bool = False,
         optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": sorted(props), "properties": {**props, **(optional or {})},
            "additionalProperties": extra}


SCHEMA: dict[str, Any] = _obj({
    "schema": {"enum": [SCHEMA_ID]},
    "command": {"enum": ["bench", "doctor"]},
    "created": _STR,
    "interrupted": {"type": "boolean"},
    "machine": _obj({"cores": _INT, "cpu": _STR, "platform": _STR, "python": _STR, "torch": _STR,
                     "pillow": _STR, "fastload": _STR, "cuda": _STR_OR_NULL},
                    optional={"jpeg_decoder": _STR}),  # added later in /1: older documents lack it
    "config": _obj({"source": _STR, "packed": {"type": "array", "items": _STR}, "batch_size": _INT,
                    "image_size": _INT, "duration_s": _NUM, "samples": {"type": ["integer", "null"]},
                    "cold": {"type": "boolean"}, "model_step_ms": _NUM_OR_NULL,
                    "model_step_callable": {"type": "boolean"}}, extra=True,
                   optional={"repeats": _INT}),
    "runs": {"type": "array", "items": _obj({
        "name": _STR, "kind": {"enum": ["baseline", "fastload", "dali", "raw"]},
        "source": {"enum": ["folder", "lmdb", "hdf5"]},
        "status": {"enum": ["ok", "partial", "skipped", "failed"]},
        "samples": _INT, "batches": _INT, "seconds": _NUM, "samples_per_s": _NUM, "mb_per_s": _NUM,
        "wait_fraction": _NUM_OR_NULL, "peak_rss_mb": _NUM_OR_NULL, "speedup": _NUM_OR_NULL,
        "settings": _STR, "note": _STR_OR_NULL},
        optional={"median": _NUM_OR_NULL, "min": _NUM_OR_NULL, "max": _NUM_OR_NULL,
                  "per_repeat": {"type": "array", "items": _NUM},
                  "per_repeat_mb_s": {"type": "array", "items": _NUM}, "step_ms": _NUM_OR_NULL})},
    "reference": _obj({"pipeline": _STR_OR_NULL, "raw": _STR_OR_NULL}),
    "ceilings": {"type": ["object", "null"], "additionalProperties": {"type": ["number", "null"]},
                 "required": ["decode_per_core", "cores", "decode_ceiling", "memcpy_mb_s"]},
    "stages": {"type": "array", "items": _obj({
        "name": _STR, "kind": {"enum": ["io", "cpu", "transfer"]}, "seconds_per_sample": _NUM,
        "samples_per_s": _NUM_OR_NULL, "parallel": _INT, "note": _STR_OR_NULL},
        optional={"low": _NUM_OR_NULL, "high": _NUM_OR_NULL})},
    "verdict": {"type": ["object", "null"], "required": ["bottleneck", "label", "reason", "advice"],
                "properties": {"bottleneck": {"enum": ["io", "cpu", "transfer", "model", None]},
                               "label": _STR, "stage": _STR_OR_NULL, "reason": _STR,
                               "advice": {"type": "array", "items": _STR},
                               "capacities": {"type": "object", "additionalProperties": _NUM},
                               "predicted_rate": _NUM_OR_NULL, "wait_fraction": _NUM_OR_NULL,
                               "loader": _STR_OR_NULL, "doubt": _STR_OR_NULL},
                "additionalProperties": False},
    "notes": {"type": "array", "items": _STR},
}, optional={"skipped": {"type": "array", "items": _obj({"path": _STR, "reason": _STR})},
             "load": {"type": ["object", "null"], "required": ["cores", "seconds", "others_cores", "busy"],
                      "properties": {"cores": _INT, "seconds": _NUM, "others_cores": _NUM, "steal_cores": _NUM,
                                     "own_cores": _NUM, "load_average": _NUM, "machine_cores": _INT,
                                     "busy": {"type": "boolean"}},
                      "additionalProperties": False},
             "headspace": {"type": ["object", "null"], "required": ["step", "samples_per_s", "step_ms"],
                           "properties": {"step": _STR, "device": _STR, "samples_per_s": _NUM,
                                          "step_ms": _NUM, "steps": _INT},
                           "additionalProperties": False}})


def validate(doc: Any, schema: dict[str, Any] = SCHEMA, where: str = "$") -> list[str]:
    """Problems of ``doc`` against ``schema`` (the subset of JSON Schema SCHEMA uses); [] when valid."""
    problems: list[str] = []
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else types
        if not any(_is(doc, t) for t in allowed):
            return [f"{where}: expected {' or '.join(allowed)}, found {type(doc).__name__} {doc!r:.60}"]
    if "enum" in schema and doc not in schema["enum"]:
        problems.append(f"{where}: {doc!r} is not one of {schema['enum']}")
    if isinstance(doc, dict):
        problems += [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in doc]
        props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for key, value in doc.items():
            if key in props:
                problems += validate(value, props[key], f"{where}.{key}")
            elif extra is False:
                problems.append(f"{where}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                problems += validate(value, extra, f"{where}.{key}")
    if isinstance(doc, list) and "items" in schema:
        for k, item in enumerate(doc):
            problems += validate(item, schema["items"], f"{where}[{k}]")
    return problems


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, {"string": str, "boolean": bool, "null": type(None), "array": list,
                              "object": dict}[kind])


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import PIL
    import torch

    from fastload import __version__
    from fastload.config import available_cpus
    from fastload.decode.crops import jpeg_decoder

    cpu = platform.processor() or platform.machine()
    try:
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cores": available_cpus(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "pillow": PIL.__version__, "fastload": __version__, "jpeg_decoder": jpeg_decoder(),
            "cuda": cuda}


@dataclass
class BenchReport:
    """Everything one ``bench`` or ``doctor`` measured; ``to_dict()`` is the JSON document."""

    command: str
    config: dict[str, Any]
    runs: list[RunResult]
    ceilings: dict[str, Any] | None = None
    stages: list[Stage] = field(default_factory=list)
    verdict: Verdict | None = None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason): left out of every row
    reference: dict[str, str | None] = field(default_factory=lambda: {"pipeline": None, "raw": None})
    headspace: Headspace | None = None  # the model step alone, on batches already on its device
    load: MachineLoad | None = None  # what else ran on the cores while it measured
    machine: dict[str, Any] = field(default_factory=machine)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def measured(self, kind: str | None = None) -> list[RunResult]:
        """Rows that delivered samples (finished or cut short), optionally of one kind."""
        return [r for r in self.runs if r.status in ("ok", "partial") and r.samples
                and (kind is None or r.kind == kind)]

    def compute_speedups(self) -> None:
        """Decoded rows against the best torch row (by median); raw rows against the small-file
        reads; each ratio paired repeat by repeat (see :func:`~.repeats.paired_ratio`)."""
        torch_rows = self.measured("baseline")
        best = max(torch_rows, key=lambda r: r.samples_per_s, default=None)
        raw = next((r for r in self.measured("raw") if r.source == "folder"), None)
        self.reference = {"pipeline": best.name if best else None, "raw": raw.name if raw else None}
        for r in self.measured():
            ref, attr = (raw, "mb_per_s") if r.kind == "raw" else (best, "samples_per_s")
            r.speedup = paired_ratio(r, ref, attr) if ref is not None else None

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "schema": SCHEMA_ID, "command": self.command, "created": self.created,
            "interrupted": self.interrupted, "machine": self.machine, "config": self.config,
            "runs": [r.as_dict() for r in self.runs], "reference": self.reference,
            "ceilings": self.ceilings, "stages": [s.as_dict() for s in self.stages],
            "verdict": self.verdict.as_dict() if self.verdict else None, "notes": self.notes}
        if self.headspace is not None:
            doc["headspace"] = self.headspace.as_dict()
        if self.load is not None:
            doc["load"] = self.load.as_dict()
        if self.skipped:
            doc["skipped"] = [{"path": path, "reason": why} for path, why in self.skipped]
        return _finite(doc)

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return out

    def table(self, markdown: bool = False) -> str:
        return format_report(self, markdown=markdown)


def _finite(value: Any) -> Any:
    """JSON has no Infinity or NaN: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
