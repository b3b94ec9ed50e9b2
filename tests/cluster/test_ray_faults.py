"""mode="ray" when the cluster fails under a pass (issue 44, items 2 and 3): the node holding all
of a loader's decode actors is lost mid-epoch, removed (Ray knows at once) or crashed (Ray learns
it late), and every sample still comes once and in order, while a record that kills each actor
decoding it fails the epoch, named, after 3; Ray shut down by the user mid-pass is an error in
the loop naming what happened, no Ray is started behind the user's back (no process of one is
left), and the pass resumes exactly once the script connects again."""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.loading.helpers import write_id_list

ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")

from fastload.converters import pack

import fastload

RECORDS = 37


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ray-faults")
    pack(write_id_list(base / "pictures", RECORDS), base / "ids.fl", shard_size="64KB", workers=1, progress=False)
    return base / "ids.fl"


@pytest.fixture(autouse=True)
def no_actor_left() -> Iterator[None]:
    """Each test's loaders (and their actors) go with it: the next test needs the cluster's CPUs."""
    yield
    gc.collect()


def labels_of(batches: Any) -> list[list[int]]:
    return [labels.tolist() for _, labels in batches]


def hold_cpus() -> list[Any]:
    """An actor holding the one CPU of each of the package's two nodes (nothing else runs in it):
    a loader's actors started meanwhile all go to the node added next."""

    @ray.remote(num_cpus=1)
    class Hold:
        def ready(self) -> bool:
            return True

    holds = [Hold.options(scheduling_strategy="SPREAD").remote() for _ in range(2)]
    ray.get([hold.ready.remote() for hold in holds])
    return holds


def crash(cluster: Any, node: Any) -> None:
    """``node`` gone as a machine goes: its workers (the actors) and its raylet killed at once, no
    word to Ray's head, which learns it from missed health checks, seconds later. A raylet
    killed alone leaves its workers running orphaned for a while, still answering calls."""
    psutil = pytest.importorskip("psutil")  # Ray's own dependency
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for worker in raylet.children(recursive=True):
        worker.kill()
    cluster.remove_node(node, allow_graceful=False)


def test_a_node_lost_with_all_its_actors_loses_no_sample(cluster: Any, packed: Path) -> None:
    dataset = fastload.PackedDataset(packed, image_size=16, train=True)
    threads = fastload.DataLoader(dataset, batch_size=2, shuffle=True, seed=5, mode="threads")
    want = [labels_of(threads), labels_of(threads)]  # epochs 0 and 1
    remote = fastload.DataLoader(dataset, batch_size=2, shuffle=True, seed=5, mode="ray", num_workers=3)
    pool = remote._tail.pool
    for epoch, graceful in enumerate((True, False)):  # removed (Ray knows at once), then crashed (it learns late)
        holds = hold_cpus()
        node = cluster.add_node(num_cpus=3)
        cluster.wait_for_nodes()
        remote._tail.start(wait=True)
        assert len(pool.actors) == 3 and set(pool.nodes.values()) == {node.node_id}
        replaced, it = pool.replaced, iter(remote)
        got = labels_of(itertools.islice(it, 2))
        if graceful:  # every actor of the loader goes, holding batches
            cluster.remove_node(node)
        else:
            crash(cluster, node)
        for hold in holds:
            ray.kill(hold)  # the CPUs their replacements take
        got += labels_of(it)
        # Every sample once, in the sampler's order: no batch was sent to a dead neighbour of a lost
        # actor until it failed 3 times, nor counted against a batch it held.
        assert got == want[epoch]
        # A crashed node is known dead only after Ray's missed heartbeats: a replacement placed on it
        # before then is lost and replaced in turn (seen beside CPU hogs), and no sample with it.
        assert (pool.replaced - replaced == 3 if graceful else pool.replaced - replaced >= 3)
        assert not set(pool.nodes.values()) & {node.node_id}
        remote._tail.close()  # the next round's actors start on its node


def exit_on_record_7(sample: Any, generator: Any) -> Any:
    """A record that ends the process decoding it (as one that exhausts its memory would)."""
    if int(sample["label"]) == 7:
        os._exit(1)
    return sample


def test_a_record_that_kills_each_actor_decoding_it_fails_the_epoch_naming_it(cluster: Any, packed: Path) -> None:
    poisoned = fastload.PackedDataset(packed, image_size=16, train=True, sample_transform=exit_on_record_7)
    remote = fastload.DataLoader(poisoned, batch_size=4, mode="ray", num_workers=2)
    got = []
    with pytest.raises(RuntimeError, match=r"(?s)mode='ray': the batch of records 4, 5, 6, 7 was being decoded by each "
                                           r"of 3 decode actors when it died .*Run this epoch with mode='threads'"):
        for _, labels in remote:
            got += labels.tolist()
    assert got == [0, 1, 2, 3]  # the batches before it, in order
    assert remote._tail.pool.replaced >= 2


def test_ray_shut_down_mid_pass_is_an_error_and_starts_no_ray(cluster: Any, packed: Path) -> None:
    runtime = tempfile.mkdtemp(prefix="fl-ray-", dir="/tmp")  # where a Ray started by this script would live
    script = f"""
        import ray
        import fastload
        ray.init(address={cluster.address!r}, log_to_driver=False, logging_level="ERROR")
        loader = fastload.DataLoader(fastload.PackedDataset({str(packed)!r}, image_size=16, train=True),
                                     batch_size=4, mode="ray", num_workers=1)
        seen = []
        try:
            for images, labels in loader:
                seen += labels.tolist()
                if len(seen) == 8:
                    ray.shutdown()
        except ConnectionError:
            print("delivered", len(seen), "then the error; Ray running:", ray.is_initialized(), flush=True)
            ray.init(address={cluster.address!r}, log_to_driver=False, logging_level="ERROR")
            loader.load_state_dict(loader.state_dict())
            rest = [y for _, labels in loader for y in labels.tolist()]
            print("resumed:", seen + rest == list(range({RECORDS})), flush=True)
            raise
        """
    env = {**os.environ, "RAY_TMPDIR": runtime}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=240, check=False)
        left = _processes_in(runtime)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "then the error; Ray running: False" in done.stdout and "resumed: True" in done.stdout, said
    assert ("fastload.errors.ClusterLostError: mode='ray': Ray was shut down (ray.shutdown()) while this loader "
            "used it, and this pass ends here; fastload never starts Ray by itself") in done.stderr, said
    assert "Exception in thread" not in said  # the pass given up told each actor alone, none raising
    assert "Started a local Ray instance" not in said and not left, said


def _processes_in(folder: str) -> list[str]:
    """Command lines of the processes that name ``folder`` (a Ray's raylet and agents do), once
    those of a Ray ending have had time to go."""
    deadline = time.monotonic() + 60
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            if folder in text:
                found.append(text)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
