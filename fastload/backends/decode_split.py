"""Both processors at once: each batch's keys split between CPU worker processes and the GPU decoder.

The first ``share`` of a batch's samples (by position) goes to the CPU path, the rest to the GPU;
the two parts are joined back in that order, so order, labels and resume are untouched. The
share adapts while training runs: when the loop waited for the CPU part of a batch, later
batches give the CPU less, and more when it waited for the GPU's (DALI's ``hw_decoder_load`` is
a fixed share; this one follows the machine and the model sharing it). Which sample goes where
is decided by timing, so a sample's pixels may come from either decoder, within rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

STEP = 0.02
"""How far the CPU share moves after a batch for which one side kept the loop waiting."""
MAX_SHARE = 0.9  # the GPU keeps a part: its decoder stays warm, and the share can come back
WAIT_MARGIN_S = 0.0005  # waits shorter than this are noise, not a side falling behind


class Split(NamedTuple):
    """One batch's keys cut in two: ``cpu`` (its first samples) and ``gpu`` (the rest)."""

    cpu: list[Any]
    gpu: list[Any]


def next_share(share: float, waited_cpu: float, waited_gpu: float) -> float:
    """The CPU share for the batches still to be split, after the loop waited ``waited_cpu``
    seconds for one batch's CPU part and ``waited_gpu`` for its GPU part."""
    if waited_cpu > waited_gpu + WAIT_MARGIN_S:
        share -= STEP
    elif waited_gpu > waited_cpu + WAIT_MARGIN_S:
        share += STEP
    return min(MAX_SHARE, max(0.0, share))


class DecodeSplit:
    """Cuts the sampler's key batches as each side asks for them; each side reads its own parts.

    The worker processes' batch sampler (:class:`~fastload.backends.worker_parts.TaggedParts`,
    which torch reads as it dispatches parts, ahead of the loop) and the loop's merger reach a
    batch at different times; whichever first reaches it cuts it with the share of that moment,
    and the other finds the same cut.
    """

    def __init__(self, key_batches: Iterable[Sequence[Any]], share: float) -> None:
        self._keys = iter(key_batches)
        self._lock = threading.Lock()
        self._cuts: dict[int, Split] = {}  # cut, and not yet released by the merger
        self._cut = 0  # batches cut so far
        self._ended = False
        self.share = share

    def cut(self, b: int) -> Split | None:
        """Batch ``b``'s cut (None past the last batch); the same for both sides."""
        with self._lock:
            while self._cut <= b and not self._ended:
                try:
                    keys = list(next(self._keys))
                except StopIteration:
                    self._ended = True
                    break
                at = round(self.share * len(keys))
                self._cuts[self._cut] = Split(keys[:at], keys[at:])
                self._cut += 1
            return self._cuts.get(b)

    def release(self, b: int) -> None:
        """The merger is done with batch ``b``: forget its cut."""
        with self._lock:
            self._cuts.pop(b, None)

    def adapt(self, waited_cpu: float, waited_gpu: float) -> None:
        """Move the share for the batches not cut yet (see :func:`next_share`)."""
        with self._lock:
            self.share = next_share(self.share, waited_cpu, waited_gpu)

