"""Many ranks, one store (issue 16): under real torchrun (gloo, CPU) two ranks read a dataset in the
moto server, each through a FaultProxy of its own, so every request is known by rank. Between
epochs each rank waits for its cache filler, meets the other at a barrier and sends a marker
request through its proxy: the proxy's log splits by epoch, and nothing of an epoch is logged
after its end. One torchrun runs every phase over the same dataset:

* ``node``: both ranks share one cache folder, as the ranks of one machine do;
* ``handoff``: a fresh shared folder; rank 0 reads the first epoch alone, then both read;
* ``nodes``: each rank has a cache folder of its own, as two machines would;
* ``nocache``: ``cache_limit=0``; each shard's index pages are read before the counted epochs.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fastload.converters import pack
from fastload import PackedDataset
from fastload.sampling.order import epoch_order
from fastload.storage.cache_entry_files import BLOCK
from fastload.storage.remote import coalesce
from tests.conftest import REPO, make_jpeg, with_comment
from tests.remote.fault_proxy import FaultProxy, ProxyRequest

SCRIPT = Path(__file__).with_name("store_rank.py")
RANKS, RECORDS, BATCH, SEED = 2, 301, 8, 5  # 301 records: odd, so the ranks' shares are padded
READERS = {  # phase -> for each epoch, the ranks that read it
    "node": [[0, 1], [0, 1]],
    "handoff": [[0], [0, 1]],
    "nodes": [[0, 1], [0, 1]],
    "nocache": [[0, 1], [0, 1]],
}

Span = tuple[str, int, int]  # (shard object, start, end) of one GET


@dataclass
class Run:
    """What one torchrun of store_rank.py delivered and what each rank's proxy saw, by phase."""

    ids: dict[str, list[list[list[int]]]]  # phase -> rank -> epoch -> record ids in delivery order
    gets: dict[str, list[list[list[Span]]]]  # phase -> rank -> epoch -> shard GETs
    shard_sizes: dict[str, int]
    places: list[Span]  # each record's (shard object, offset, size)

    @property
    def dataset_bytes(self) -> int:
        return sum(self.shard_sizes.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_id_list(root: Path) -> Path:
    """RECORDS small distinct JPEGs and a list whose label is the record's number (its id)."""
    root.mkdir(parents=True)
    bases = [make_jpeg(40, 32, seed=k) for k in range(8)]
    rows = ["path,label"]
    for i in range(RECORDS):
        (root / f"r{i:04d}.jpg").write_bytes(with_comment(bases[i % len(bases)], f"record {i}"))
        rows.append(f"r{i:04d}.jpg,{i}")
    (root / "list.csv").write_text("\n".join(rows) + "\n")
    return root / "list.csv"


def _shard_get(request: ProxyRequest, sizes: dict[str, int]) -> Span | None:
    """The span a GET of a shard object asked for (None for any other request)."""
    path = request.path.split("?", 1)[0]
    name = next((key for key in sizes if path.endswith("/" + key)), None)  # keys: the manifest's names
    if request.method != "GET" or name is None:
        return None
    if "range" not in request.headers:
        return name, 0, sizes[name]
    first, last = request.headers["range"].removeprefix("bytes=").split("-")
    return name, int(first), int(last) + 1


def _by_epoch(requests: list[ProxyRequest], sizes: dict[str, int]) -> list[list[Span]]:
    """Shard GETs between the markers ``epoch-0``, ``epoch-1``, ..., ``end`` (those before the
    first marker belong to opening the dataset, outside the counted epochs)."""
    epochs: list[list[Span]] | None = None
    for request in requests:
        if request.path.startswith("/fastload-marker/"):
            if request.path.endswith("/end"):
                assert epochs is not None
                return epochs
            epochs = (epochs or []) + [[]]
        elif epochs is not None and (span := _shard_get(request, sizes)) is not None:
            epochs[-1].append(span)
    raise AssertionError("the proxy saw no end marker")


@pytest.fixture(scope="module")
def run(s3_server, tmp_path_factory) -> Run:
    base = tmp_path_factory.mktemp("ranks")
    url = f"s3://{s3_server.make_bucket('ranks-module')}/ids.fl"
    pack(_write_id_list(base / "pictures"), url, shard_size="16KB", progress=False,
         storage_options=s3_server.storage_options(), staging=base / "staging")
    dataset = PackedDataset(url, storage_options=s3_server.storage_options(), cache_limit=0)
    assert dataset.targets.tolist() == list(range(RECORDS)) and len(dataset.manifest.shards) > 10
    sizes = {s.file: s.bytes for s in dataset.manifest.shards}
    places = [(shard.name, offset, size)
              for shard, offset, size in map(dataset.reader.locate, range(RECORDS))]
    cache_dirs = {"node": [base / "node"] * RANKS, "handoff": [base / "handoff"] * RANKS,
                  "nodes": [base / f"node-{r}" for r in range(RANKS)],
                  "nocache": [base / "none"] * RANKS}
    with contextlib.ExitStack() as stack:
        proxies = {phase: [stack.enter_context(FaultProxy(s3_server.host, s3_server.port))
                           for _ in range(RANKS)] for phase in READERS}
        config = {"url": url, "batch_size": BATCH, "seed": SEED, "phases": [
            {"name": phase, "readers": readers, "cache_dirs": [str(d) for d in cache_dirs[phase]],
             "cache_limit": 0 if phase == "nocache" else 10 * sum(sizes.values()),
             "open_shards_first": phase == "nocache",
             "storage_options": [s3_server.storage_options(p.url) for p in proxies[phase]]}
            for phase, readers in READERS.items()]}
        (base / "config.json").write_text(json.dumps(config))
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={RANKS}",
                   "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(SCRIPT),
                   str(base / "config.json"), str(base / "out")]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                              check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-4000:]
        assert not [e for ps in proxies.values() for p in ps for e in p.errors]
        got = [json.loads(Path(f"{base / 'out'}.{r}").read_text()) for r in range(RANKS)]
        return Run(ids={phase: [g[phase] for g in got] for phase in READERS},
                   gets={phase: [_by_epoch(p.requests, sizes) for p in proxies[phase]]
                         for phase in READERS},
                   shard_sizes=sizes, places=places)


def _bytes(spans: list[Span]) -> int:
    return sum(end - start for _, start, end in spans)


def _covered(spans: list[Span]) -> dict[str, int]:
    """Distinct bytes of each shard object that ``spans`` hold between them."""
    held: dict[str, set[int]] = {}
    for name, start, end in spans:
        held.setdefault(name, set()).update(range(start, end))
    return {name: len(offsets) for name, offsets in held.items()}


def _whole_blocks(run: Run, spans: list[Span]) -> bool:
    """Each span is whole cache blocks (the last may end at the end of its shard)."""
    return all(start % BLOCK == 0 and (end % BLOCK == 0 or end == run.shard_sizes[name])
               for name, start, end in spans)


@pytest.mark.timeout(900)  # the module's ranks run in the first test's setup: a hang guard
@pytest.mark.parametrize("phase", list(READERS))
def test_each_epoch_is_dealt_out_among_the_ranks(run, phase):
    """drop_last=False: the epoch's global order is padded with its own start to a multiple of the
    ranks, and rank r takes positions r, r + W, ...: every record once, the first one twice."""
    share = -(-RECORDS // RANKS)
    for epoch, readers in enumerate(READERS[phase]):
        order = epoch_order(RECORDS, seed=SEED, epoch=epoch, shuffle=True)
        padded = np.resize(order, share * RANKS)
        got = {rank: run.ids[phase][rank][epoch] for rank in readers}
        assert got == {rank: padded[rank::RANKS].tolist() for rank in readers}
        if len(readers) == RANKS:
            counts = Counter(i for ids in got.values() for i in ids)
            assert set(counts) == set(range(RECORDS))  # every record, on some rank
            assert [i for i, n in counts.items() if n > 1] == [int(order[0])]  # the padding only
    assert run.ids[phase][0][0] != run.ids[phase][0][1]  # each epoch its own shuffle


@pytest.mark.timeout(900)  # the module's ranks run in the first test's setup: a hang guard
def test_a_rank_reads_what_another_rank_of_its_node_fetched(run):
    first, second = zip(*run.gets["handoff"])
    assert _covered(first[0]) == run.shard_sizes  # rank 0 alone filled the node's cache
    assert first[1] == []  # rank 1 waited
    assert second == ([], [])  # rank 1, which never fetched a byte, read its share from the cache


@pytest.mark.timeout(900)  # the module's ranks run in the first test's setup: a hang guard
def test_ranks_reading_at_once_fill_one_node_cache(run):
    """The ranks' first epoch brings in every byte of the dataset exactly once for the node, in
    whole cache blocks, and the second epoch fetches nothing. A piece is claimed while it is
    fetched, so a rank (or the filler of its own process) that wants it meanwhile waits for it
    instead of fetching it too (before the claims: 1.4-1.8x the dataset)."""
    first, second = zip(*run.gets["node"])
    spans = [span for ranks in first for span in ranks]
    assert _covered(spans) == run.shard_sizes and _bytes(spans) == run.dataset_bytes
    assert all(_whole_blocks(run, spans) for spans in first)
    assert second == ([], [])


@pytest.mark.timeout(900)  # the module's ranks run in the first test's setup: a hang guard
def test_ranks_with_caches_of_their_own_each_fetch_the_whole_dataset(run):
    """Two nodes: with a cache, each fills it with the whole dataset (the filler fetches every
    shard ahead of the reads), not with its rank's share; then reads only its disk."""
    for first, second in run.gets["nodes"]:
        assert _covered(first) == run.shard_sizes and _whole_blocks(run, first)
        assert _bytes(first) == run.dataset_bytes  # its reads and its filler never fetch a piece twice
        assert second == []


@pytest.mark.timeout(900)  # the module's ranks run in the first test's setup: a hang guard
def test_without_a_cache_each_rank_fetches_only_its_records(run):
    """cache_limit=0: each GET a rank sends is its own batch's records of one shard, neighbours
    within COALESCE_GAP in one request (the bytes between them come along), nothing else."""
    for rank in range(RANKS):
        for epoch, ids in enumerate(run.ids["nocache"][rank]):
            batches = [ids[k:k + BATCH] for k in range(0, len(ids), BATCH)]
            want = [span[:3] for batch in batches
                    for span in coalesce([run.places[i] for i in batch])]
            got = run.gets["nocache"][rank][epoch]
            assert Counter(got) == Counter(want)
            assert _bytes(got) < 0.6 * run.dataset_bytes  # its half of the records and some gaps
