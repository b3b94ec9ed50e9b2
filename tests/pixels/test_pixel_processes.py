"""Processes sharing one pixel cache (issue 45): a filler killed with SIGKILL during the first epoch
leaves no entry a later epoch reads wrong, and two ranks with two worker processes each fill and
read one cache, every sample exactly once and each the pixels a single process would give."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xxhash

import fastload
from fastload.decode.stored import decode_stored
from fastload.pixels.layout import stored_bytes, stored_size
from tests.conftest import REPO, write_tree
from tests.pixels.conftest import RECORDS, photo_files
from tests.pixels.pixel_process import BATCH, SEED, SIZE, digests

WORLD = 2


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    """The test photos packed with each record's number as its label (a batch says which records it holds)."""
    from fastload.converters import pack

    root = tmp_path_factory.mktemp("numbered")
    files = write_tree(root / "images", photo_files())
    rows = [{"path": f"images/{name}", "label": i} for i, name in enumerate(files)]
    (root / "list.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pack(root / "list.jsonl", root / "n.fl", shard_size="200KB", progress=False)
    return root / "n.fl"


@pytest.fixture(scope="module")
def reference(numbered, tmp_path_factory):
    """Two epochs read by one process through a cache of its own: record → digest, per epoch."""
    ds = fastload.PackedDataset(numbered, image_size=SIZE, train=True, pixel_cache=tmp_path_factory.mktemp("ref"))
    loader = fastload.DataLoader(ds, batch_size=BATCH, seed=SEED)
    return [digests(loader) for _ in range(2)]


def process(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.pixels.pixel_process", *map(str, args)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_during(filler: subprocess.Popen, batch: int) -> None:
    """SIGKILL the filler as soon as it is let go on to batch ``batch`` (reading, decoding and
    storing it): it waits for a line on stdin after each batch, so it never gets further."""
    for _ in range(batch):
        line = filler.stdout.readline()  # bounded: the filler ends (EOF) if anything goes wrong
        if not line:
            pytest.fail(f"the filler ended early:\n{filler.stderr.read()[-3000:]}")
        filler.stdin.write("go\n")
        filler.stdin.flush()
    filler.send_signal(signal.SIGKILL)
    filler.wait(timeout=60)
    for pipe in (filler.stdin, filler.stdout, filler.stderr):
        pipe.close()


def test_sigkill_while_filling_leaves_no_torn_image(numbered, reference, tmp_path):
    cache = tmp_path / "cache"
    for batch in (2, 3):  # killed in epoch 1 twice, the second time after it found the first one's pixels
        kill_during(process("fill", numbered, cache), batch)
    ds = fastload.PackedDataset(numbered, image_size=SIZE, train=True, pixel_cache=cache)
    entries = ds.pixel_cache.store.entries(np.arange(RECORDS))
    held = np.flatnonzero(entries.present)
    assert 0 < len(held) < RECORDS
    for k in held:  # every entry published points at whole pixels: the ones a clean fill stores
        width, height = int(ds.index.width[k]), int(ds.index.height[k])
        stored = stored_size(width, height, ds.pixel_cache.side)
        want = decode_stored(ds.reader.read(int(k)), width, height, np.empty(stored_bytes(*stored), np.uint8),
                             stored, where="", max_pixels=ds.max_pixels)
        assert np.array_equal(ds.pixel_cache.store.pixels(entries, int(k)), want)
    loader = fastload.DataLoader(ds, batch_size=BATCH, seed=SEED)
    assert [digests(loader) for _ in range(2)] == reference
    assert loader.stats()["pixel_cache"]["hits"] == RECORDS + len(held)


def test_two_ranks_with_two_workers_each_share_one_cache(numbered, reference, tmp_path):
    cache, outs = tmp_path / "cache", [tmp_path / f"rank{r}.json" for r in range(WORLD)]
    ranks = [process("rank", r, WORLD, tmp_path / "group", numbered, cache, outs[r]) for r in range(WORLD)]
    deadline = time.monotonic() + 300
    for p in ranks:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            pytest.fail("the ranks did not finish in 300 s")
    results = []
    for r, (p, out) in enumerate(zip(ranks, outs)):
        errors = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        assert out.exists(), f"rank {r} wrote nothing (exit {p.returncode}):\n{errors[-3000:]}"
        result = json.loads(out.read_text())
        assert "error" not in result, f"rank {r} failed:\n{result['error']}"
        results.append(result)
    for epoch in range(2):
        shares = [result["epochs"][epoch] for result in results]
        assert not set(shares[0]) & set(shares[1])  # each sample exactly once across the ranks
        assert {**shares[0], **shares[1]} == reference[epoch]  # the pixels one process would give
        stats = [result["stats"][epoch] for result in results]
        assert sum(s["hits" if epoch else "stored"] for s in stats) == RECORDS
    assert os.path.isdir(cache) and len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1
