"""A damaged record fails the loop with CorruptRecordError naming it, in every mode: main process,
decode threads, worker processes (never swallowed, never a hang)."""

from __future__ import annotations

import shutil

import pytest

import fastload
from fastload.errors import CorruptRecordError

from .helpers import ID_RECORDS

BAD = 11


@pytest.fixture(scope="module")
def damaged(id_packed, tmp_path_factory):
    """A copy of the id dataset with one byte of record ``BAD`` flipped inside its shard."""
    dataset = shutil.copytree(id_packed("lmdb"), tmp_path_factory.mktemp("damaged") / "ids.fl")
    ds = fastload.PackedDataset(dataset)
    payload, shard = ds.record(BAD)["data"], ds.manifest.shards[int(ds.index.shard[BAD])].file
    path = dataset / shard
    blob = bytearray(path.read_bytes())
    at = blob.find(payload)
    assert at >= 0 and blob.find(payload, at + 1) < 0
    blob[at + len(payload) // 2] ^= 0x5A
    path.write_bytes(bytes(blob))
    return dataset


@pytest.mark.parametrize("num_workers", ["auto", 0, 2])
def test_a_damaged_record_fails_the_loop_naming_it(damaged, num_workers):
    ds = fastload.PackedDataset(damaged, image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=False, num_workers=num_workers)
    it = iter(loader)
    delivered = []
    with pytest.raises(CorruptRecordError) as info:
        for _, labels in it:
            delivered += labels.tolist()
    message = str(info.value)
    assert f"record {BAD} (img{BAD:04d}.jpg)" in message and "checksum" in message
    if num_workers == 2:
        assert "in DataLoader worker process" in message
    assert delivered == list(range(8))  # the batches before the damaged one arrived
    info.value.with_traceback(None)
    del info, it  # shut workers down now, not in a later gc pass


def test_resume_past_the_damaged_batch_reads_on(damaged):
    """Resuming after the damaged batch reads on: the error was the record's, not the loader's."""
    ds = fastload.PackedDataset(damaged, image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=False, num_workers=0)
    state = loader.state_dict()
    loader.load_state_dict({**state, "position": 12})
    assert [i for _, y in loader for i in y.tolist()] == list(range(12, ID_RECORDS))
