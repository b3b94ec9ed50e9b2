"""The GPU pipeline's streams and events (fastload/backends/stream_events.py): what the GPU may still
read is let go once its event has passed, polled, and waited for only past the limit or at a pass's
end; on the CPU nothing is held and no stream is made. The events here are stand-ins with CUDA
events' two methods (the real ones run in the gpu-marked tests)."""

from __future__ import annotations

import torch

from fastload.backends.stream_events import Retiring, in_stream, on_device, pinned, recorded


class Event:
    """query() as a CUDA event answers it; synchronize() completes it (and is counted)."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def test_what_the_gpu_reads_is_let_go_in_order_once_its_event_has_passed():
    retiring, released = Retiring(limit=8), []
    events = [Event() for _ in range(3)]
    for k, event in enumerate(events):
        retiring.add(event, release=lambda k=k: released.append(k))
    assert released == [] and len(retiring) == 3
    events[1].done = True  # a later one done first: still let go in order, after the first
    retiring.add(None, release=lambda: released.append("now"))  # no event (the CPU): at once
    assert released == ["now"]
    events[0].done = True
    retiring.add(Event())  # each add looks again
    assert released == ["now", 0, 1] and len(retiring) == 2
    assert sum(e.waited for e in events) == 0  # passed: never waited for


def test_past_the_limit_the_oldest_is_waited_for_and_a_flush_waits_for_all():
    retiring, released = Retiring(limit=2), []
    events = [Event() for _ in range(4)]
    for k, event in enumerate(events):
        retiring.add(event, release=lambda k=k: released.append(k))
    assert released == [0, 1] and len(retiring) == 2  # the GPU two behind: the host waits
    retiring.flush()
    assert released == [0, 1, 2, 3] and len(retiring) == 0


def test_on_the_cpu_there_is_no_stream_no_event_and_no_device_switch():
    tensor = torch.arange(3)
    cpu = torch.device("cpu")
    with on_device(cpu), in_stream(None):
        assert recorded(None) is None
        assert pinned(tensor, cpu) is tensor  # nothing to pin for the CPU
    assert not torch.cuda.is_initialized()
