"""doctor on constructed real cases: a slow reader, a slow transform, a slow model step."""

from __future__ import annotations

import time

import pytest

from fastload.benchmark import ImageFolderBaseline, doctor, validate
from fastload.dataset import PackedDataset

QUICK = {"batch_size": 4, "duration": 0.5, "samples": 12, "stage_budget": 0.1, "progress": False, "repeats": 1}


class SlowRead(ImageFolderBaseline):
    """A network share: every file read waits 20 ms."""

    def read(self, i: int) -> bytes:
        time.sleep(0.02)
        return super().read(i)


class SlowTransform(ImageFolderBaseline):
    """An expensive augmentation: 15 ms of CPU per sample."""

    def transform(self, img):
        end = time.perf_counter() + 0.015
        while time.perf_counter() < end:
            pass
        return super().transform(img)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_reader_is_io_bound(photos, workers):
    report = doctor(SlowRead.from_folder(photos("folder"), image_size=32), num_workers=workers, **QUICK)
    v = report.verdict
    assert v is not None and v.bottleneck == "io" and v.stage == "read", report.table()
    assert any("fastload pack SRC" in a for a in v.advice)
    read = next(s for s in report.stages if s.name == "read")
    assert read.seconds_per_sample >= 0.02 and read.parallel == max(1, workers)
    assert report.runs[0].status == "ok" and report.runs[0].settings == f"num_workers={workers}"
    assert validate(report.to_dict()) == []


def test_a_slow_transform_is_cpu_bound(photos):
    report = doctor(SlowTransform.from_folder(photos("folder"), image_size=32), num_workers=0, **QUICK)
    v = report.verdict
    assert v is not None and v.bottleneck == "cpu" and v.stage == "transform", report.table()
    assert v.label == "CPU-bound (transform)"
    assert any("num_workers=" in a for a in v.advice)  # one sample at a time on several cores


def test_a_slow_model_step_is_model_bound(photos):
    report = doctor(ImageFolderBaseline.from_folder(photos("folder"), image_size=32), num_workers=0,
                    model_step=0.5, **QUICK)  # long enough that a stall on a loaded machine stays < 10%
    v = report.verdict
    assert v is not None and v.bottleneck == "model", report.table()
    assert v.wait_fraction is not None and v.wait_fraction < 0.1
    assert report.config["model_step_ms"] == pytest.approx(500)
    assert "data wait" in report.table()


def test_a_callable_model_step_is_timed_from_the_run(photos):
    def step(batch):
        images, labels = batch
        assert images.shape[0] == labels.shape[0] == 4
        time.sleep(0.5)

    report = doctor(ImageFolderBaseline.from_folder(photos("folder"), image_size=32), num_workers=0,
                    model_step=step, **QUICK)
    assert report.verdict.bottleneck == "model"
    assert report.config["model_step_callable"] is True and report.config["model_step_ms"] is None
    assert "model step: a callable" in " ".join(report.table().split())


def test_doctor_on_a_packed_dataset_times_the_fastload_stages(photos):
    report = doctor(photos("lmdb"), image_size=32, **QUICK)
    names = [s.name for s in report.stages]
    assert names == ["read", "decode+crop (reduced-scale)", "transform", "collate"]
    by_name = {s.name: s for s in report.stages}
    assert by_name["read"].parallel == 1 and by_name["decode+crop (reduced-scale)"].parallel >= 1
    assert report.runs[0].name == "doctor: fastload lmdb" and report.runs[0].kind == "fastload"
    assert report.verdict is not None and not any("reduced scale" in a for a in report.verdict.advice)
    assert validate(report.to_dict()) == []


def test_doctor_takes_a_packed_dataset_object_and_refuses_other_datasets(photos):
    report = doctor(PackedDataset(photos("hdf5"), image_size=32, train=True), **QUICK)
    assert report.runs[0].name == "doctor: fastload hdf5" and report.verdict is not None
    import torch

    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i

    with pytest.raises(TypeError, match="Plain has no read\\(\\) method; pass a PackedDataset"):
        doctor(Plain(), **QUICK)
