"""The cluster tests' Ray cluster: two nodes of one CPU each on this machine, started once for all
of tests/cluster (the folder and the store modules share it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="package")
def cluster() -> Iterator[Any]:
    """Two Ray nodes of one CPU each (the head and a worker), on this machine."""
    ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    made.add_node(num_cpus=1)
    made.wait_for_nodes()
    ray.init(address=made.address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def write_photo_tables(files: list[Path], tables: Path, row_group: int) -> Path:
    """``files`` as two Parquet tables in ``tables``: a key, the JPEG bytes, the class name
    (``species``), a caption and a score; rows keep the files' order, file by file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables.mkdir()
    half = len(files) // 2
    for part, rows in enumerate((range(half), range(half, len(files)))):
        pq.write_table(pa.table({
            "key": [f"{i:06d}" for i in rows],
            "jpg": pa.array([files[i].read_bytes() for i in rows], pa.binary()),
            "species": [files[i].parent.name for i in rows],
            "caption": [f"photo {i}" for i in rows],
            "score": [i / 7 for i in rows],
        }), tables / f"part-{part}.parquet", row_group_size=row_group)
    return tables

