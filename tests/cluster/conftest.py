"""The cluster tests' Ray cluster: two nodes of one CPU each on this machine, started once for all
of tests/cluster (the folder and the store modules share it)."""

from __future__ import annotations

from collections.abc import Iterator
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
