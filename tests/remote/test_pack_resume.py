"""A pack to the store killed (kill -9) during its upload, three times, then run to the end: every
source file is in the dataset exactly once and the store holds nothing else."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from fastload import PackedDataset
from fastload.storage.remote import RemoteStore
from tests.conftest import REPO, make_jpeg


def _pack_command(src, url, staging, options) -> list[str]:
    command = [sys.executable, "-m", "fastload.cli", "pack", str(src), "-o", url, "--shard-size", "12KB",
               "--staging", str(staging), "--quiet"]
    for key, value in options.items():
        command += ["--storage-option", f"{key}={value if isinstance(value, str) else __import__('json').dumps(value)}"]
    return command


def test_killed_uploads_resume_to_every_file_exactly_once(tmp_path, s3_server, s3_bucket, fault_proxy):
    src = tmp_path / "images"
    for c in range(3):
        (src / f"class{c}").mkdir(parents=True)
        for i in range(30):
            (src / f"class{c}" / f"{i:03d}.jpg").write_bytes(make_jpeg(64, 48, seed=1000 * c + i))
    url = f"s3://{s3_bucket}/resumed.fl"
    options = s3_server.storage_options(fault_proxy.url)
    fault_proxy.latency = 0.05  # a far store: uploads take long enough to be killed in the middle
    command = _pack_command(src, url, tmp_path / "staging", options)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(7)
    killed = 0
    for _ in range(3):
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        # wait for the first uploads of this run (PUTs through the proxy), then kill at a random moment
        seen = sum(r.method == "PUT" for r in fault_proxy.requests)
        while proc.poll() is None and time.monotonic() < deadline:
            if sum(r.method == "PUT" for r in fault_proxy.requests) > seen:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.communicate(timeout=30)
    assert killed >= 2, "the pack finished before it could be killed: slow the proxy down"
    store = RemoteStore(url, s3_server.storage_options())
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    ds = PackedDataset(url, storage_options=s3_server.storage_options(), cache_limit=0)
    sources = sorted(p.read_bytes() for p in src.rglob("*.jpg"))
    assert sorted(ds.reader.read_many(list(range(len(ds))))) == sources  # each exactly once
    assert sorted(ds.index.path[i] for i in range(len(ds))) == sorted(
        p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
    listed = {name for name, _, _ in store.list_objects()}
    wanted = {s.file for s in ds.manifest.shards} | {e.file for e in ds.manifest.index.values()} | {"manifest.json"}
    assert listed == wanted  # no shard of an earlier, killed run left behind
    assert not (tmp_path / "staging").exists()
