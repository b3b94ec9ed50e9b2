"""The verdict as a pure function: constructed stage timings → bottleneck and advice."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fastload.benchmark.verdict import MODEL_BOUND_WAIT, Evidence, diagnose


@dataclass
class S:
    name: str
    kind: str
    seconds_per_sample: float
    parallel: int = 1
    low: float | None = None  # the fastest and slowest timing round
    high: float | None = None


def stages(read: float = 50e-6, decode: float = 4e-3, transform: float = 1e-3, collate: float = 20e-6,
           parallel: int = 2, transfer: float | None = None) -> list[S]:
    out = [S("read", "io", read, parallel), S("decode", "cpu", decode, parallel),
           S("transform", "cpu", transform, parallel), S("collate", "cpu", collate, parallel)]
    if transfer is not None:
        out.append(S("transfer", "transfer", transfer, 1))
    return out


def test_a_slow_read_is_io_bound_and_says_pack_the_files():
    v = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, source="folder"))
    assert v.bottleneck == "io" and v.label == "I/O-bound" and v.stage == "read"
    assert "20.00 ms" in v.reason and "reading is" in v.reason
    assert any("fastload pack SRC" in a for a in v.advice)
    assert any("local disk" in a for a in v.advice) and any("reads in flight" in a for a in v.advice)


def test_io_bound_on_packed_data_does_not_say_pack_again():
    v = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, source="packed"))
    assert v.bottleneck == "io"
    assert not any("`fastload pack SRC`, then" in a for a in v.advice)
    assert any("--max-side" in a for a in v.advice)


def test_reads_in_flight_raise_the_io_capacity():
    # 8 reads at once at 8 ms each (1 ms a sample) outrun 2 cores decoding at 5 ms (2.5 ms a sample)
    many = stages(read=8e-3, parallel=8)
    for s in many[1:]:
        s.parallel = 2
    assert diagnose(Evidence(many, cores=2, batch_size=64)).bottleneck == "cpu"
    # two reads at once: 4 ms a sample against 2.5 ms
    assert diagnose(Evidence(stages(read=8e-3, parallel=2), cores=2, batch_size=64)).bottleneck == "io"


def test_decode_bound_advice_names_reduced_decode_pre_resize_and_dali():
    v = diagnose(Evidence(stages(), cores=2, batch_size=64, source="folder", cuda=True))
    assert v.bottleneck == "cpu" and v.label == "CPU-decode-bound" and v.stage == "decode"
    text = " ".join(v.advice)
    assert "reduced scale" in text and "--max-side" in text and "backend='dali'" in text
    assert "num_workers" not in text  # already one per core
    assert v.capacities["cpu"] == pytest.approx(1 / ((4e-3 + 1e-3 + 20e-6) / 2))
    assert v.predicted_rate == pytest.approx(1 / (50e-6 / 2 + (4e-3 + 1e-3 + 20e-6) / 2))


def test_reduced_decode_is_advised_only_where_it_measures_faster():
    faster = diagnose(Evidence(stages(), cores=2, batch_size=64, reduced_decode_s=2e-3))
    assert any("measured here: 2.00 ms per sample against 5.00 ms now" in a for a in faster.advice)
    slower = diagnose(Evidence(stages(), cores=2, batch_size=64, reduced_decode_s=4.8e-3))
    assert slower.bottleneck == "cpu" and not any("reduced scale" in a for a in slower.advice)
    assert any("--max-side" in a for a in slower.advice)


def test_too_few_workers_is_the_first_advice():
    v = diagnose(Evidence(stages(parallel=1), cores=4, batch_size=64))
    assert v.bottleneck == "cpu" and v.advice[0].startswith("use every core: num_workers=4")


def test_cpu_stages_never_count_more_than_the_cores():
    wide = diagnose(Evidence(stages(parallel=16), cores=2, batch_size=64))
    assert wide.capacities["cpu"] == pytest.approx(diagnose(Evidence(stages(parallel=2), cores=2,
                                                                     batch_size=64)).capacities["cpu"])


def test_reduced_decode_already_on_is_not_advised_again():
    v = diagnose(Evidence(stages(), cores=2, batch_size=64, source="packed", reduced_decode=True))
    assert v.bottleneck == "cpu" and not any("reduced scale" in a for a in v.advice)


def test_a_slow_transform_is_cpu_bound_on_the_transform():
    v = diagnose(Evidence(stages(decode=1e-3, transform=15e-3), cores=2, batch_size=64))
    assert v.bottleneck == "cpu" and v.stage == "transform" and v.label == "CPU-bound (transform)"
    assert any("transform costs 15.00 ms" in a for a in v.advice)


def test_decode_close_to_transform_counts_as_decode_bound():
    # a full-size resize is decode's cost too: reduced-scale decode shrinks both
    v = diagnose(Evidence(stages(decode=0.8e-3, transform=0.85e-3), cores=2, batch_size=64))
    assert v.label == "CPU-decode-bound"


def test_a_slow_copy_is_transfer_bound():
    v = diagnose(Evidence(stages(transfer=10e-3), cores=2, batch_size=64, pinned=False))
    assert v.bottleneck == "transfer" and v.label == "transfer-bound"
    assert any("pin_memory=True" in a for a in v.advice) and any("uint8" in a for a in v.advice)
    pinned = diagnose(Evidence(stages(transfer=10e-3), cores=2, batch_size=64, pinned=True))
    assert not any("pin_memory" in a for a in pinned.advice)


@pytest.mark.parametrize("wait", [0.0, MODEL_BOUND_WAIT])
def test_a_loop_that_barely_waits_is_model_bound(wait):
    v = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, wait_fraction=wait,
                          model_step_s=0.5, loader_rate=100))
    assert v.bottleneck == "model" and v.label == "model-bound" and v.stage is None
    assert f"{wait:.0%} of the time" in v.reason and "not the problem" in v.advice[0]


def test_a_loop_that_waits_names_the_data_stage_and_the_wait():
    v = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, wait_fraction=0.6,
                          model_step_s=0.05, loader_rate=100))
    assert v.bottleneck == "io" and "waits for data 60% of the time" in v.reason
    assert v.wait_fraction == 0.6


def test_model_bound_without_a_measured_wait_compares_rates():
    fast_data = Evidence(stages(), cores=2, batch_size=64, model_step_s=1.0, loader_rate=400)
    assert diagnose(fast_data).bottleneck == "model"  # 400/s of data, the step takes 64/s
    slow_data = Evidence(stages(), cores=2, batch_size=64, model_step_s=0.01, loader_rate=400)
    assert diagnose(slow_data).bottleneck == "cpu"  # the step would take 6400/s


def test_no_model_step_is_never_model_bound():
    assert diagnose(Evidence(stages(), cores=2, batch_size=64, wait_fraction=0.0)).bottleneck == "cpu"


def test_no_stages_is_an_error_that_says_what_to_do():
    with pytest.raises(ValueError, match="no stage timings; measure the stages first"):
        diagnose(Evidence([], cores=2, batch_size=64))


def test_the_verdict_prints_its_label_reason_and_advice():
    text = str(diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64)))
    assert text.startswith("verdict: I/O-bound — reading is ") and "\n  - pack the files" in text


def test_dali_install_advice_only_when_dali_does_not_import(monkeypatch):
    import sys

    from fastload.benchmark import judge

    missing = diagnose(Evidence(stages(), cores=2, batch_size=64, dali_installed=False, cuda=True))
    there = diagnose(Evidence(stages(), cores=2, batch_size=64, dali_installed=True, cuda=True))
    assert any("backend='dali') (pip install nvidia-dali-cuda120)" in a for a in missing.advice)
    assert any(a.endswith("backend='dali')") for a in there.advice)
    assert not any("pip install" in a for a in there.advice)
    judge._dali_installed.cache_clear()
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali now raises ImportError
    try:
        assert judge._dali_installed() is False
    finally:
        judge._dali_installed.cache_clear()


def test_no_gpu_decode_advice_without_a_cuda_device():
    for installed in (False, True):
        advice = " ".join(diagnose(Evidence(stages(), cores=2, batch_size=64, dali_installed=installed)).advice)
        assert "DALI" not in advice and "GPU" not in advice


def test_no_cache_advice_when_the_cache_already_holds_the_dataset():
    def advice(limit):
        return " ".join(diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, source="packed",
                                          store_bound="bandwidth", store_mb_s=50, dataset_bytes=10**8,
                                          cache_limit=limit)).advice)
    assert "cache_limit=" not in advice(10**9) and "cache_limit='110.00 MB'" in advice(10**7)
    assert "cache_limit=" in advice(None)  # no cache: room for the dataset is advice


def test_a_verdict_whose_stage_limit_is_below_the_delivered_rate_says_it_is_unsure():
    # decode timed alone allows 2 / 5 ms = 400 samples/s; a loader that delivered 900/s contradicts it
    doubtful = diagnose(Evidence(stages(), cores=2, batch_size=64, loader_rate=900.0))
    assert doubtful.doubt is not None and "allows 39" in doubtful.doubt and "delivered 900" in doubtful.doubt
    assert "\n  ! unsure: " in str(doubtful)
    assert diagnose(Evidence(stages(), cores=2, batch_size=64, loader_rate=380.0)).doubt is None



# --- issue 47 item 1: no verdict on noise ----------------------------------------------------------


def test_a_stage_whose_rounds_overlap_the_next_one_is_not_named():
    """A doctor once blamed collate at 25 ms a sample; the rerun said decode and collate 0.1 ms."""
    noisy = stages(decode=2e-3, collate=25e-3)
    noisy[1].low, noisy[1].high = 1.9e-3, 2.1e-3
    noisy[3].low, noisy[3].high = 0.1e-3, 40e-3  # collate: one round hit a burst of load
    v = diagnose(Evidence(noisy, cores=2, batch_size=64))
    assert v.bottleneck == "cpu" and v.stage is None and v.label == "CPU-bound, too noisy to name the stage"
    assert v.reason.startswith("collate (12.5 ms (0.05–20) a sample) and decode (")
    assert "overlap across their timing rounds" in v.reason
    assert not any("collate costs" in a for a in v.advice) and any("rerun on a quiet machine" in a for a in v.advice)
    noisy[3].low, noisy[3].high = 20e-3, 40e-3  # every round of collate slower than every one of decode
    assert diagnose(Evidence(noisy, cores=2, batch_size=64)).stage == "collate"


def test_stage_groups_whose_rounds_overlap_name_no_bottleneck():
    close = stages(read=5e-3, decode=4e-3, transform=0.0, collate=0.0, parallel=1)
    close[0].low, close[0].high = 3e-3, 9e-3
    close[1].low, close[1].high = 3.5e-3, 4.5e-3
    v = diagnose(Evidence(close, cores=1, batch_size=64))
    assert v.bottleneck is None and v.stage is None and v.label == "too noisy to name the bottleneck"
    assert v.reason.startswith("reading (5 ms (3–9) a sample) and CPU work (4 ms (3.5–4.5))")
    assert str(v).startswith("verdict: too noisy to name the bottleneck — reading (")
    close[0].low = 4.6e-3  # no round of reading as fast as the slowest of decoding
    assert diagnose(Evidence(close, cores=1, batch_size=64)).bottleneck == "io"


def test_a_verdict_measured_on_a_busy_machine_says_it_is_a_hint():
    quiet = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64))
    busy = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, machine_busy=True))
    assert quiet.doubt is None and busy.bottleneck == quiet.bottleneck == "io"
    assert busy.doubt.startswith("measured on a busy machine") and "\n  ! measured on a busy machine" in str(busy)
