"""AWS's S3 Connector for PyTorch (``s3torchconnector``, on the AWS CRT) as a contender on the same
store as fastload: its ``S3MapDataset`` read one GET per object (what a user of the connector has),
and its ranged reader over a packed dataset's shards, one ranged GET per record.

The connector is optional: without it there is no row, and a note says how to add it. It takes
credentials from the environment or an AWS profile only, so the ``key``/``secret``/``token`` of
the storage options are put in ``AWS_ACCESS_KEY_ID``/... of this process (never over other values
already there: that is refused, by name).
"""

from __future__ import annotations

import importlib.util
import os
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

PACKAGE = "s3torchconnector"
DEFAULT_REGION = "us-east-1"


def installed() -> bool:
    """Whether ``s3torchconnector`` can be imported here (found without importing it)."""
    return importlib.util.find_spec(PACKAGE) is not None


@dataclass(frozen=True)
class ConnectorTarget:
    """Where and how the connector reaches the objects under an ``s3://`` prefix: what
    ``S3MapDataset.from_prefix`` and ``S3ClientConfig`` take, from fsspec/s3fs storage options."""

    uri: str  # s3://bucket/prefix/ (the slash keeps ``photos`` from matching ``photos.fl/``)
    region: str
    endpoint: str | None = None
    force_path_style: bool = False  # a custom endpoint (moto, MinIO) serves path-style URLs
    unsigned: bool = False
    profile: str | None = None
    credentials: dict[str, str | None] = field(default_factory=dict)  # AWS_* variables to set

    @classmethod
    def from_options(cls, url: str, storage_options: dict[str, Any] | None) -> ConnectorTarget:
        """The target for ``url`` (``s3://`` only: the connector reads nothing else)."""
        if not url.startswith("s3://"):
            raise ValueError(f"{url}: s3torchconnector reads s3:// URLs only")
        opts = dict(storage_options or {})
        client = dict(opts.get("client_kwargs") or {})
        endpoint = opts.get("endpoint_url") or client.get("endpoint_url")
        region = (client.get("region_name") or opts.get("region_name") or opts.get("region")
                  or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION)
        style = ((opts.get("config_kwargs") or {}).get("s3") or {}).get("addressing_style")
        key = opts.get("key") or client.get("aws_access_key_id")
        credentials: dict[str, str | None] = {}
        if key:  # a token that belongs to other credentials must not be sent with these
            credentials = {"AWS_ACCESS_KEY_ID": key,
                           "AWS_SECRET_ACCESS_KEY": opts.get("secret") or client.get("aws_secret_access_key"),
                           "AWS_SESSION_TOKEN": opts.get("token") or client.get("aws_session_token")}
        return cls(url.rstrip("/") + "/", region, endpoint, bool(endpoint) or style == "path",
                   bool(opts.get("anon")), opts.get("profile"), credentials)

    def export_credentials(self) -> None:
        """Put the options' credentials where the connector reads them: this process's environment."""
        for name, value in self.credentials.items():
            there = os.environ.get(name)
            if there is not None and there != value:
                raise ValueError(f"{name} is set in the environment to another value than the storage "
                                 "options give, and s3torchconnector reads credentials from the "
                                 f"environment only: unset {name}, or pass the same credentials")
            if value is not None:
                os.environ[name] = value

    def settings(self, reader: str) -> str:
        where = f"endpoint {self.endpoint}" if self.endpoint else f"region {self.region}"
        return f"S3MapDataset.from_prefix, {reader} reader, {where}" + (", path style" * self.force_path_style)


class ConnectorReads:
    """The objects under a prefix through the connector's ``S3MapDataset``, read ``in_flight`` at
    once on a thread pool (the CRT client does each GET off the GIL): whole objects with its
    sequential reader (one GET each), or byte ranges with its ranged reader, unbuffered (one
    ranged GET each). The listing is made here, before any timed read."""

    def __init__(self, target: ConnectorTarget, in_flight: int, ranged: bool = False) -> None:
        from s3torchconnector import S3ClientConfig, S3MapDataset, S3ReaderConstructor

        target.export_credentials()
        config = S3ClientConfig(force_path_style=target.force_path_style, unsigned=target.unsigned,
                                profile=target.profile)
        constructor = S3ReaderConstructor.range_based(buffer_size=0) if ranged else S3ReaderConstructor.sequential()
        self.dataset = S3MapDataset.from_prefix(target.uri, region=target.region, endpoint=target.endpoint,
                                                s3client_config=config, reader_constructor=constructor)
        prefix = target.uri.split("/", 3)[3]
        # key → position in the dataset (a reader is made without a request)
        self.positions = {self.dataset[i].key[len(prefix):]: i for i in range(len(self.dataset))}
        self.in_flight = in_flight
        self.settings = target.settings("ranged, unbuffered" if ranged else "sequential")
        self.pool = ThreadPoolExecutor(in_flight, thread_name_prefix="s3torchconnector-read")
        weakref.finalize(self, self.pool.shutdown, wait=False)

    def position(self, name: str) -> int:
        """The dataset position of object ``name`` (relative to the prefix); KeyError names it."""
        try:
            return self.positions[name]
        except KeyError:
            raise KeyError(f"{name}: not listed by s3torchconnector under the prefix") from None

    def read_objects(self, positions: Sequence[int]) -> list[bytes]:
        """Whole objects, one GET each, all in flight at once (up to ``in_flight``)."""
        return list(self.pool.map(lambda i: self.dataset[i].read(), positions))

    def read_ranges(self, ranges: Sequence[tuple[int, int, int]]) -> list[bytes]:
        """``(position, offset, size)`` ranges, one ranged GET each, all in flight at once."""
        def one(place: tuple[int, int, int]) -> bytes:
            reader = self.dataset[place[0]]
            reader.seek(place[1])
            return reader.read(place[2])
        return list(self.pool.map(one, ranges))


# --- rows of ``fastload bench`` -----------------------------------------------------------------------

MAP_ROW = "raw reads: small objects, s3torchconnector"
NOT_INSTALLED = ("no s3torchconnector rows (AWS's S3 Connector for PyTorch, one GET per object and its "
                 "ranged reader, beside fastload on the same store): pip install s3torchconnector")


def ranged_row_name(storage: str) -> str:
    return f"raw reads: {storage} shards, store, s3torchconnector ranged"


def connector_rows(objects: Any, stored: Sequence[str], storage_options: dict[str, Any] | None,
                   batch_size: int) -> tuple[list[Any], list[str]]:
    """The connector's raw-read rows beside fastload's on the same ``s3://`` store: the small
    objects (``objects``, a StoreObjects) one GET each, and each packed dataset in ``stored`` one
    ranged GET per record; with notes (why there are none). Nothing for a store that is not S3."""
    from fastload.storage.remote import MAX_IN_FLIGHT

    urls = [u for u in ([objects.url] if objects is not None else []) + [str(u) for u in stored]
            if u.startswith("s3://")]
    if not urls:
        return [], []
    if not installed():
        return [], [NOT_INSTALLED]
    in_flight = objects.store.max_in_flight if objects is not None else MAX_IN_FLIGHT
    rows = []
    if objects is not None and objects.url.startswith("s3://"):
        rows.append(_map_row(objects, storage_options, batch_size, in_flight))
    rows += [_ranged_row(url, storage_options, batch_size, in_flight) for url in urls
             if objects is None or url != objects.url]
    return rows, []


def _map_row(objects: Any, storage_options: dict[str, Any] | None, batch_size: int, in_flight: int) -> Any:
    from fastload.benchmark.contenders import RawReads, raw_batch_bytes
    from fastload.benchmark.runs import RunSpec

    def make() -> RawReads:
        reads = ConnectorReads(ConnectorTarget.from_options(objects.url, storage_options), in_flight)
        positions = [reads.position(name) for name, _ in objects.samples]  # fastload's records, in its order
        return RawReads(lambda indices: reads.read_objects([positions[i] for i in indices]), len(positions),
                        batch_size, threads=1)

    return RunSpec(MAP_ROW, "raw", "folder", make,
                   f"S3MapDataset, sequential reader: one GET per object, up to {in_flight} in flight "
                   f"on threads, batches of {batch_size}", batch_bytes=raw_batch_bytes)


def _ranged_row(url: str, storage_options: dict[str, Any] | None, batch_size: int, in_flight: int) -> Any:
    import numpy as np

    from fastload.benchmark.contenders import RawReads, raw_batch_bytes
    from fastload.benchmark.runs import RunSpec
    from fastload.dataset import PackedDataset
    from fastload.storage.packed import locate_packed

    storage = locate_packed(url, storage_options).manifest().storage

    def make() -> RawReads:
        # fastload's index says where each record lies; the connector fetches it
        ds = PackedDataset(url, storage_options=storage_options, cache_limit=0)
        reads = ConnectorReads(ConnectorTarget.from_options(url, storage_options), in_flight, ranged=True)
        shards = {s.file: reads.position(s.file) for s in ds.manifest.shards}
        _, firsts = np.unique(ds.reader.index.shard, return_index=True)
        for i in firsts.tolist():  # every shard opened (an LMDB page walk) before the clock starts
            ds.reader.locate(i)

        def read_many(indices: list[int]) -> list[bytes]:
            places = [ds.reader.locate(i) for i in indices]
            return reads.read_ranges([(shards[shard.name], offset, size) for shard, offset, size in places])
        return RawReads(read_many, len(ds), batch_size, threads=1)

    return RunSpec(ranged_row_name(storage), "raw", storage, make,
                   f"S3MapDataset over the shards, ranged reader unbuffered: one ranged GET per record "
                   f"(no coalescing, no checksums), up to {in_flight} in flight", batch_bytes=raw_batch_bytes)


def connector_notes(runs: Sequence[Any]) -> list[str]:
    """fastload's cold raw reads from the store against the connector's, paired repeat by repeat."""
    from fastload.benchmark.repeats import paired_ratio

    rows = {r.name: r for r in runs if r.status in ("ok", "partial") and r.samples}
    notes = []
    for name, row in rows.items():
        if not name.startswith("raw reads: fastload "):
            continue
        storage = name.split()[3].rstrip(",")
        if name.endswith(", store, cache epoch 1") and MAP_ROW in rows:
            ratio = paired_ratio(row, rows[MAP_ROW])
            theirs = "s3torchconnector's one GET per object"
        elif name.endswith(", store, no cache") and ranged_row_name(storage) in rows:
            ratio = paired_ratio(row, rows[ranged_row_name(storage)])
            theirs = "s3torchconnector's ranged reads of the same shards"
        else:
            continue
        if ratio is not None:
            notes.append(f"{name}: {ratio:.2f}x the records/s of {theirs}")
    return notes
