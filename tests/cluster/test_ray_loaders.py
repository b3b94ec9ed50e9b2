"""Several mode="ray" loaders in one process, on the package's two 1-CPU nodes: a pass saved and
resumed by a new loader through any sampler torch's DataLoader takes yields exactly the rest
(issue 44, item 1); a loader made while another is still referenced takes that one's actors when
its pass is over (the same dataset: as they are; another: they are ended for its own), and one
whose CPUs another loader's running pass holds says so within seconds, naming it (item 9). The
loaders are kept alive from test to test, so that most take the actors of those before them."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.loading.helpers import ID_RECORDS, write_id_list
from tests.loading.test_tail_resume import CASES, assert_resumes_exactly, labels

ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")

from fastload.converters import pack

import fastload


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ray-loaders")
    pack(write_id_list(base / "pictures", ID_RECORDS), base / "ids.fl", shard_size="64KB", workers=1, progress=False)
    return base / "ids.fl"


@pytest.fixture(scope="module")
def kept() -> Iterator[list[Any]]:
    """Loaders kept for the module's later tests to take their actors (ray_lending): few start."""
    made: list[Any] = []
    yield made
    made.clear()
    gc.collect()


@pytest.mark.parametrize("case", list(CASES))
def test_a_resume_through_any_torch_sampler_delivers_exactly_the_rest(cluster: Any, packed: Path, kept: list[Any],
                                                                    case: str) -> None:
    dataset = fastload.PackedDataset(packed, image_size=16, train=False)

    def make(sampling: dict[str, Any]) -> Any:
        kept.append(fastload.DataLoader(dataset, mode="ray", num_workers=1, **sampling))
        return kept[-1]

    assert_resumes_exactly(make, case)


def test_a_loader_takes_the_actors_of_others_between_passes_or_names_a_running_one(cluster: Any, packed: Path,
                                                                                  kept: list[Any]) -> None:
    def loader(image_size: int, **extra: Any) -> Any:
        return fastload.DataLoader(fastload.PackedDataset(packed, image_size=image_size, train=True), batch_size=4,
                                   shuffle=True, seed=1, **extra)

    kept.clear()  # the resume tests' loaders: gone, and their actors with them
    gc.collect()
    want = labels(loader(16, mode="threads"))
    first = loader(16, mode="ray", num_workers=2)  # both CPUs of the cluster
    assert labels(first) == want
    held = set(first._tail.actors)
    again = loader(16, mode="ray", num_workers=2)  # a notebook cell run again: the first is still referenced
    assert labels(again) == want
    assert set(again._tail.actors) == held and first._tail.actors == []  # taken over as they were: none started
    other = loader(24, mode="ray", num_workers=2)  # another dataset (its pictures' size): actors of its own
    assert labels(other) == labels(loader(24, mode="threads"))
    other._tail.start(wait=True)  # its second actor may start after the pass
    assert again._tail.actors == [] and len(other._tail.actors) == 2 and not held & set(other._tail.actors)

    running = iter(other)
    next(running)  # a pass under way, its iterator kept: its actors stay its own
    with pytest.raises(RuntimeError, match=r"mode='ray': this loader's 2 decode actor\(s\) cannot start: each asks "
                                           r"for 1 CPU, and the cluster's 2 CPUs are held by the 2 decode actors of "
                                           r"1 other mode='ray' loader\(s\) of this process whose pass is still "
                                           r"running .*finish or drop that iteration \(del it\)"):
        next(iter(first))
