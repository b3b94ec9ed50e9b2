"""The pack job: a listing cut into a shard plan, its shards written into a folder, then finalized."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastload.converters.destination.append import AppendBase
from fastload.converters.finalize import finalize
from fastload.converters.packing.options import digest_on_error
from fastload.converters.packing.packer import Packer
from fastload.converters.packing.plan import ShardPlan, plan_digest, plan_shards, stored_values
from fastload.converters.packing.report import PackReport, write_error
from fastload.converters.sources.items import Skip, SourceListing, check_field_names
from fastload.errors import PackError
from fastload.format import Manifest
from fastload.format.layout import stored_file_types
from fastload.storage.remote import RemoteStore


def pack_job(listing: SourceListing, options: dict[str, Any], exts: tuple[str, ...], progress: bool | None,
         src_store: RemoteStore | None) -> PackJob:
    """The shard plan over ``listing``: what a re-run with the same source and options finds again."""
    # the field's type says how its masks are stored
    listing.file_fields = stored_file_types(listing.file_fields, options["mask_storage"])
    # one rule for every source's field names (fastload.format.layout), whatever listed them
    check_field_names(listing.root, [*listing.fields, *listing.file_fields], "a field of the source")
    return PackJob(listing, shard_plans(listing, options, exts), options, exts, progress, src_store)


def shard_plans(listing: SourceListing, options: dict[str, Any], exts: tuple[str, ...]) -> list[ShardPlan]:
    """``listing``'s items cut into shards, each named by a digest of what it stores and how."""
    # Read threads do not change what is written: a resume with other --workers keeps the shards.
    # How masks are stored shows in file_fields' types, so a pack without masks keeps its digest.
    content = {k: v for k, v in options.items() if k not in ("workers", "max_file_size", "mask_storage")}
    content["on_error"] = digest_on_error(content["on_error"])
    if listing.file_fields:  # names and types: a renamed column is another pack (absent: old digests hold)
        content["file_fields"] = dict(listing.file_fields)
    if listing.layout == "table":  # which column the payloads come from
        content["image_column"] = listing.reader.column
    # every value the dataset stores is in the digest: "already packed" means all of them unchanged
    # (a label's class name, a field's type and values; absent: a pack without them keeps its digest)
    if listing.classes is not None:
        content["classes"] = list(listing.classes)
    if listing.fields:
        content["fields"] = dict(listing.fields)
    return plan_shards(listing.items, options["shard_size"], {**content, "extensions": exts},
                       stored_values(listing.fields, listing.field_values, len(listing.items)))


@dataclass
class PackJob:
    """What to pack and how: the listing, its shard plan and the checked options."""

    listing: SourceListing
    plans: list[ShardPlan]
    options: dict[str, Any]
    exts: tuple[str, ...]
    progress: bool | None
    src_store: RemoteStore | None = None
    base: AppendBase | None = None  # an append's: the dataset at OUT the records are added to

    def same_pack(self, manifest: Manifest) -> bool:
        return _same_pack(manifest, self.plans)

    def leave_out(self, indices: list[int]) -> None:
        """Leave the listing's items ``indices`` out (an append's records the dataset holds already),
        and plan the shards of what is left."""
        gone = set(indices)
        keep = [k for k in range(len(self.listing.items)) if k not in gone]
        self.listing.items = [self.listing.items[k] for k in keep]
        self.listing.field_values = {name: [values[k] for k in keep]
                                     for name, values in self.listing.field_values.items()}
        self.plans = shard_plans(self.listing, self.options, self.exts)

    def pack_into(self, out: Path, on_shard: Callable[[Path], None] | None = None) -> PackReport:
        """Write the shards that are not finished yet, then the index and the manifest, into ``out``;
        ``on_shard(path)`` is called with each finished shard file (kept ones first)."""
        shard_records, resumed = self.write_shards(out, on_shard)
        return self.finish(out, shard_records, resumed)

    def write_shards(self, out: Path, on_shard: Callable[[Path], None] | None = None
                     ) -> tuple[list[dict[str, Any]], int]:
        """The shards not finished yet written into ``out``: every shard's record, and how many were kept."""
        writer = Packer(self.listing.items, out, self.options["storage"], self.options, self.progress,
                        self.src_store, on_shard, file_types=dict(self.listing.file_fields),
                        reader=self.listing.reader, images=self.listing.images)
        return writer.run(self.plans), writer.resumed

    def finish(self, out: Path, shard_records: list[dict[str, Any]], resumed: int) -> PackReport:
        """The index and the manifest, last, over the shards written into ``out``."""
        try:
            report = finalize(out, self.options["storage"], self.listing, shard_records, self.options,
                              self.exts, plan_digest(self.plans), base=self.base)
        except OSError as exc:  # the finished shards stay: the same command resumes from them
            raise PackError(write_error(out, "the index and manifest", exc)) from None
        report.resumed_shards = resumed
        return report


def pack_listing(listing: SourceListing, options: dict[str, Any], exts: tuple[str, ...], out: Path) -> PackReport:
    """``listing`` packed into the folder ``out`` by this loop (``options``: ``check_options``'),
    without OUT's lock or a dataset replaced: a cluster task's part, whose folder is its own. Shards
    a killed run finished there are kept. Every record skipped: no dataset, a report of 0 records
    and the skips."""
    job = pack_job(listing, options, exts, False, None)
    shard_records, resumed = job.write_shards(out)
    if not any(r["items"] for r in shard_records):
        skipped = [*listing.skipped, *(Skip(rel, reason) for r in shard_records for rel, reason in r["skips"])]
        return PackReport(out=out, storage=options["storage"], skipped=len(skipped), skipped_files=skipped)
    return job.finish(out, shard_records, resumed)


def _same_pack(manifest: Manifest, plans: list[ShardPlan]) -> bool:
    return manifest.packed.get("plan") == plan_digest(plans)
