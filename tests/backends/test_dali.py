"""backend="dali": what is DALI's own beyond the contract every decoding backend meets
(tests/backends/test_contract.py): one iterator at a time, its missing-package error, the datasets
it refuses (on_error="skip" among them), and its words for a record it cannot decode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fastload
from fastload.errors import CorruptRecordError, MissingDependencyError
from tests.backends.contract import BATCH, SIZE, make, needs_dali, run
from tests.conftest import REPO
from tests.loading.helpers import ID_RECORDS, Numbers


@needs_dali
def test_an_older_iterator_is_refused_after_a_new_one_starts(packed):
    loader = make(packed["lmdb"], "dali")
    expected = run(make(packed["lmdb"], "torch"))[0]
    old = iter(loader)
    assert next(old)[1].tolist() == expected[:BATCH]
    new_ids, _, _ = run(loader)
    assert len(new_ids) == ID_RECORDS
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)



# --- errors ---------------------------------------------------------------------------------------

def test_without_dali_the_error_names_the_package(packed):
    """A real failed import: ``nvidia.dali`` blocked in a fresh interpreter."""
    code = (
        "import sys, json\n"
        "sys.modules['nvidia.dali'] = None\n"
        "import fastload\n"
        f"ds = fastload.PackedDataset({str(packed['lmdb'])!r}, image_size=16, train=True)\n"
        "try:\n"
        "    fastload.DataLoader(ds, batch_size=4, backend='dali')\n"
        "except Exception as exc:\n"
        "    print(json.dumps([type(exc).__name__, isinstance(exc, ImportError), str(exc)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    name, is_import_error, message = json.loads(done.stdout.strip().splitlines()[-1])
    assert (name, is_import_error) == (MissingDependencyError.__name__, True)
    assert "nvidia-dali-cuda120" in message and "pip install -e '.[dali]'" in message
    assert "backend='dali'" in message


def test_unsupported_datasets_point_to_the_built_in_pipeline(packed):
    path = packed["lmdb"]
    with_transform = fastload.PackedDataset(path, transform=lambda img: img)
    cases = [with_transform, fastload.PackedDataset(path), Numbers(10)]
    for dataset in cases:
        with pytest.raises(ValueError, match=r"PackedDataset\(path, image_size=\.\.\., train=\.\.\.\)"):
            fastload.DataLoader(dataset, batch_size=4, backend="dali")
    skipping = fastload.PackedDataset(path, image_size=SIZE, train=True, on_error="skip")
    with pytest.raises(ValueError, match="on_error='skip'.*open it with on_error='raise'"):
        fastload.DataLoader(skipping, batch_size=4, backend="dali")
    ds = fastload.PackedDataset(path, image_size=SIZE, train=True)
    with pytest.raises(ValueError, match="batch_size"):
        fastload.DataLoader(ds, batch_size=None, backend="dali")
    with pytest.raises(ValueError, match="collate_fn"):
        fastload.DataLoader(ds, batch_size=4, backend="dali", collate_fn=lambda b: b)
    unknown = r"backend='jax' is not a fastload backend; choose one of 'torch', 'dali'"
    with pytest.raises(ValueError, match=unknown):
        fastload.DataLoader(ds, batch_size=4, backend="jax")  # type: ignore[arg-type]


@needs_dali
def test_a_record_dali_cannot_decode_fails_the_loop_naming_it(undecodable):
    path, bad = undecodable
    loader = make(path, "dali", batch_size=3, shuffle=False, train=False)
    delivered = []
    with pytest.raises(CorruptRecordError) as info:
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == [0, 1, 2, 3, 4, 5]  # every batch before the bad one
    message = str(info.value)
    assert f"record {bad} (img{bad:04d}.jpg)" in message and "DALI could not decode it" in message
    assert "fastload verify --decode" in message
    # The pipeline died with the error; the next iteration builds a new one.
    loader.set_epoch(0)
    assert run(loader, limit=2)[0] == [0, 1, 2, 3, 4, 5]
    # The torch backend refuses the same record too.
    with pytest.raises(CorruptRecordError):
        run(make(path, "torch", batch_size=3, shuffle=False, train=False))
