"""backend="nvimgcodec" as a pipeline (issue 46): batch N+1's read, plan, parse and decode run while
batch N resamples and while the loop steps on batch N-1; stage runs of consecutive batches are
made to meet (each ends only once the other has started), so the overlap is shown by order, not
by timing: a pipeline passes on any machine, a sequence cannot. nvImageCodec's CPU codecs."""

from __future__ import annotations

import threading
from itertools import pairwise

import pytest

from fastload.backends.stage_trace import StageTrace
from tests.backends.contract import DEVICES, make, needs_nvimgcodec, run
from tests.backends.test_worker_parts import fixed_share

pytestmark = needs_nvimgcodec

MEETINGS = [
    (("plan", 1), ("resample", 0)),  # read + plan of the next batch while one resamples
    (("decode", 1), ("resample", 0)),  # its parse and decode too
    (("decode", 2), ("step", 0)),  # and while the loop steps on the one before
    (("resample", 1), ("step", 0)),
    (("plan", 3), ("step", 0)),
]


def traced_epoch(loader, trace: StageTrace) -> int:
    """One epoch, each batch's step recorded as the loop's own stage."""
    loader._tail.trace = trace
    batches = 0
    for number, (images, _) in enumerate(loader):
        with trace.stage("step", number):
            images.float().mean()
        batches += 1
    return batches


@pytest.mark.parametrize("device", DEVICES)
def test_stages_of_consecutive_batches_run_at_once(packed, device):
    trace = StageTrace(timeout_s=60.0)
    for a, b in MEETINGS:
        trace.meet(a, b)
    loader = make(packed["lmdb"], "nvimgcodec", device=device)  # each stage 2 batches ahead
    assert traced_epoch(loader, trace) == 8
    assert trace.missed == []  # every meeting happened: no stage waited for the other to finish
    for a, b in MEETINGS:
        assert trace.overlap(a, b), (a, b, trace.interval(*a), trace.interval(*b))
    # Within a stage, batches still go one after another, in order.
    for stage in ("plan", "decode", "resample", "step"):
        runs = sorted((i for i in trace.intervals if i.stage == stage), key=lambda i: i.batch)
        assert [i.batch for i in runs] == list(range(8))
        assert all(earlier.end <= later.start for earlier, later in pairwise(runs))


def test_a_sequence_cannot_pass_the_meeting():
    """The check itself: two stages run one after the other in one thread never meet; the trace
    says so (after its timeout) instead of passing."""
    trace = StageTrace(timeout_s=0.2)
    trace.meet(("decode", 1), ("resample", 0))
    for number in range(2):
        with trace.stage("decode", number):
            pass
        with trace.stage("resample", number):
            pass
    assert trace.missed == [(("resample", 0), ("decode", 1))]  # resample 0 gave up waiting for decode 1


@pytest.mark.parametrize(("num_workers", "prefetch_factor"), [(0, None), (2, 3)])
def test_each_stage_runs_prefetch_factor_batches_ahead_and_no_more(packed, monkeypatch, num_workers,
                                                                   prefetch_factor):
    """The depth follows prefetch_factor (2 without workers, where torch refuses one): with the
    loop holding batch 0, each stage fills the queue to the next and holds one more; none runs further."""
    loader = make(packed["lmdb"], "nvimgcodec", batch_size=2, num_workers=num_workers,
                  prefetch_factor=prefetch_factor)
    if num_workers:
        fixed_share(monkeypatch, loader, 0.0)  # every record through the GPU path
    depth = prefetch_factor or 2
    trace = StageTrace()
    loader._tail.trace = trace
    it = iter(loader)
    next(it)

    def ran(stage: str) -> int:
        return len({i.batch for i in trace.intervals if i.stage == stage})

    # The loop holds 1, the queue to it holds depth, the resample stage 1 more (waiting to put).
    resampled, decoded = 1 + depth + 1, (1 + depth + 1) + depth + 1
    waited = threading.Event()
    for _ in range(1200):  # bounded: up to 2 minutes on a busy machine
        if ran("resample") >= resampled and ran("decode") >= decoded:
            break
        waited.wait(0.1)
    assert (ran("resample"), ran("decode")) == (resampled, decoded)
    del it


def test_one_batch_at_a_time_goes_through_the_decoders(packed):
    """A pass given up may still be decoding when the next one starts on the same decoders (an
    nvImageCodec decoder called from two threads at once hung a test): the decode waits its turn."""
    from fastload.backends.planned import read_and_plan

    loader = make(packed["lmdb"], "nvimgcodec")
    run(loader, limit=1)  # decoders made
    decode, _ = loader._tail._stages()
    batch = read_and_plan(loader.dataset, list(range(5)))
    with decode.decoders.lock:  # another pass's decode, in the middle of its batch
        waiting = threading.Thread(target=decode, args=(0, batch))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()  # (on a slow machine the check passes either way, never fails)
    waiting.join(60)
    assert not waiting.is_alive()


def test_before_workers_fork_a_given_up_stage_finishes_its_batch():
    """settle(): a closed stage whose thread is still inside its batch (native code, a decode) is
    waited for, so that worker processes are not forked from the middle of a call."""
    from fastload.backends.pipeline_stage import PipelineStage, settle

    inside, finish = threading.Event(), threading.Event()

    def batches():
        yield "first"
        inside.set()
        finish.wait(60)  # the batch in hand, as a long decode
        yield "second"

    stage = PipelineStage(batches(), depth=1)
    assert next(stage) == "first" and inside.wait(60)
    stage.close()
    settling = threading.Thread(target=settle, args=(60.0,))
    settling.start()
    settling.join(0.5)
    assert settling.is_alive()  # waiting for the stage's thread
    finish.set()
    settling.join(60)
    assert not settling.is_alive() and not stage._thread.is_alive()
