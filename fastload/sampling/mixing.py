"""Sampling stage: an epoch of several datasets mixed by weight, as pure functions of (seed, epoch).

Each source has a share of every epoch (its *count*, the same each epoch). Its draws come from
its own stream: pass after pass over its records, each pass a permutation fixed by
``(seed, source, pass)``, read on from where the previous epoch stopped. So within a source:

* every record is drawn once before any record is drawn again (once per pass, across epochs);
* within one epoch no record is drawn twice while the count is at most the source's size;
  above it, each record is drawn ``count // size`` or ``count // size + 1`` times.

Where an epoch starts a new pass part way, the new pass begins with records the epoch has not
drawn yet (the rest of the pass keeps its order), which is what keeps the second promise. That
makes a pass depend on the pass before, so the state at epoch ``e`` is found by stepping through
the epochs before it: :class:`MixPlan` keeps the last state, so consecutive epochs cost one
step each, and a resume at epoch ``e`` costs about ``e`` epochs of draws (numpy, no reads).
The sources' draws are then shuffled together by ``(seed, epoch)`` (``shuffle=False``: spread
evenly, in stream order); ranks take their part of that order as of any epoch's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

_MIX = 0x6D6978  # "mix": these streams are not epoch_order's for the same seed
MAX_EPOCH_DRAWS = 2**31
"""Most draws an epoch of a mix may hold beyond its sources' records: an epoch's order is held as
int64 arrays (some 24 bytes a draw), so 2**31 draws already take 48 GB."""


def source_counts(sizes: Sequence[int], *, weights: Sequence[float] | None = None,
                  samples_per_epoch: Sequence[int] | None = None, repeat: Sequence[float] | None = None,
                  epoch_length: int | None = None) -> list[int]:
    """Each source's draws per epoch, from one of three ways of saying it (none: each once).

    Args:
        sizes: records in each source.
        weights: relative shares of an epoch of ``epoch_length`` draws (default: every source's
            records summed); counts are ``epoch_length * weight / sum(weights)`` rounded by largest
            remainder (ties to the earlier source), so they sum to ``epoch_length`` and each is
            within 1 of its exact share, exactly it when that is a whole number.
        samples_per_epoch: each source's count as given (Streaming's ``choose``).
        repeat: each source's count as ``round(repeat * size)`` (Streaming's ``repeat``).
        epoch_length: with ``weights`` only.
    """
    sizes = [_whole(f"sizes[{k}]", n) for k, n in enumerate(sizes)]
    if not sizes:
        raise ValueError("a mix needs at least one source")
    given = [name for name, value in (("weights", weights), ("samples_per_epoch", samples_per_epoch),
                                      ("repeat", repeat)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: give one way of sizing the sources' shares, not several")
    if epoch_length is not None and weights is None:
        raise ValueError("epoch_length sets the draws that weights= share out; with samples_per_epoch= or "
                         "repeat= the epoch is their sum")
    for name, value in (("weights", weights), ("samples_per_epoch", samples_per_epoch), ("repeat", repeat)):
        if value is not None and len(value) != len(sizes):
            raise ValueError(f"{name} has {len(value)} values for {len(sizes)} sources; give one per source")
    if samples_per_epoch is not None:
        counts = [_whole(f"samples_per_epoch[{k}]", n) for k, n in enumerate(samples_per_epoch)]
    elif repeat is not None:
        counts = [math.floor(_share(f"repeat[{k}]", r) * n + 0.5) for k, (r, n) in enumerate(zip(repeat, sizes))]
    elif weights is not None:
        total = sum(sizes) if epoch_length is None else _whole("epoch_length", epoch_length)
        counts = _apportion(total, [_share(f"weights[{k}]", w) for k, w in enumerate(weights)])
    else:
        counts = list(sizes)
    for k, (count, size) in enumerate(zip(counts, sizes)):
        if count and not size:
            raise ValueError(f"source {k} has no records but a share of {count} draws an epoch; "
                             "give it weight 0 or leave it out")
    what = "epoch_length" if epoch_length is not None else given[0] if given else "the sources' sizes"
    check_epoch_draws(sum(counts), sum(sizes), what)
    return counts


def check_epoch_draws(draws: int, records: int, given: str) -> None:
    """Refuse an epoch of no draws, or of more than MAX_EPOCH_DRAWS beyond the sources' ``records``
    (``given``: what set the draws), before any order is made."""
    if draws < 1:
        raise ValueError(f"{given} makes an epoch of 0 draws; give every epoch at least one (a positive "
                         "epoch_length, or a weight, count or repeat above 0)")
    if draws > max(MAX_EPOCH_DRAWS, records):
        raise ValueError(f"{given} makes an epoch of {draws} draws, over the {MAX_EPOCH_DRAWS} an epoch's order "
                         f"can be held in memory for (its sources hold {records} records); draw fewer an epoch")


def source_draws(size: int, count: int, *, seed: int, source: int, epoch: int,
                 shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """One source's draws in ``epoch``: its record numbers and the pass of its stream each came
    from (a record is drawn once per pass, so ``(pass, record)`` names each draw for good)."""
    return _Stream(size, count, seed, source, shuffle).draws(epoch)


def mixed_order(sizes: Sequence[int], counts: Sequence[int], *, seed: int, epoch: int,
                shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's global order over the sources laid end to end (source ``k``'s record ``r`` is
    ``sum(sizes[:k]) + r``), and each draw's pass; the same for every rank and worker."""
    return MixPlan(sizes, counts).order(seed, epoch, shuffle)


class MixPlan:
    """The sources' sizes and counts, and the streams' last states (so that the next epoch costs
    one step); :meth:`order` gives what :func:`mixed_order` gives."""

    def __init__(self, sizes: Sequence[int], counts: Sequence[int]) -> None:
        if len(sizes) != len(counts):
            raise ValueError(f"{len(sizes)} sizes but {len(counts)} counts; give one count per source")
        self.sizes = [_whole(f"sizes[{k}]", n) for k, n in enumerate(sizes)]
        self.counts = [_whole(f"counts[{k}]", n) for k, n in enumerate(counts)]
        check_epoch_draws(sum(self.counts), sum(self.sizes), "counts")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)])
        self._streams: dict[tuple[int, bool], list[_Stream]] = {}
        self._last: tuple[tuple[int, int, bool], tuple[np.ndarray, np.ndarray]] | None = None

    def __getstate__(self) -> dict[str, object]:
        # to a worker process without the streams' states: they are remade where they are needed
        return {**self.__dict__, "_streams": {}, "_last": None}

    @property
    def epoch_length(self) -> int:
        """Draws in one epoch: the counts summed."""
        return sum(self.counts)

    def signature(self) -> dict[str, list[int]]:
        """What a saved loader state must match to resume this mix."""
        return {"sizes": list(self.sizes), "counts": list(self.counts)}

    def order(self, seed: int, epoch: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, passes)`` of ``epoch``: see :func:`mixed_order`."""
        if seed < 0 or epoch < 0:
            raise ValueError(f"seed={seed}, epoch={epoch}: both must be >= 0")
        if self._last is not None and self._last[0] == (seed, epoch, shuffle):
            return self._last[1]
        streams = self._streams.setdefault((seed, shuffle), [
            _Stream(n, c, seed, k, shuffle) for k, (n, c) in enumerate(zip(self.sizes, self.counts))])
        drawn = [s.draws(epoch) for s in streams]
        indices = np.concatenate([records + self.offsets[k] for k, (records, _) in enumerate(drawn)])
        passes = np.concatenate([p for _, p in drawn])
        if shuffle:
            mixing = np.random.default_rng([seed, epoch, _MIX]).permutation(len(indices))
        else:  # draw j of a source with count c sits at (j + 1/2) / c of the epoch
            times = np.concatenate([(np.arange(c) + 0.5) / c for c in self.counts if c])
            mixing = np.argsort(times, kind="stable")
        result = (indices[mixing].astype(np.int64), passes[mixing].astype(np.int64))
        self._last = ((seed, epoch, shuffle), result)
        return result


class _Stream:
    """One source's draws, pass after pass, epoch after epoch; keeps where it stopped."""

    def __init__(self, size: int, count: int, seed: int, source: int, shuffle: bool) -> None:
        self.size, self.count, self.seed, self.source, self.shuffle = size, count, seed, source, shuffle
        self._rewind()

    def _rewind(self) -> None:
        self.epoch, self.pass_, self.rest = 0, -1, np.empty(0, dtype=np.int64)  # rest: pass_'s undrawn part

    def draws(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if epoch < self.epoch:
            self._rewind()
        while self.epoch < epoch:
            self._step()
        at = (self.pass_, self.rest)
        records, passes = self._step()
        self.epoch -= 1
        self.pass_, self.rest = at  # draws(epoch) again is free; draws(epoch + 1) steps from here
        return records, passes

    def _step(self) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's draws; the stream moves on to the next epoch."""
        tail = self.rest[:self.count]  # the rest of a pass begun in an earlier epoch
        records, passes = [tail], [np.full(len(tail), self.pass_, dtype=np.int64)]
        self.rest = self.rest[len(tail):]
        need = self.count - len(tail)
        while need > 0:
            self.pass_ += 1
            fresh = self._permutation(self.pass_)
            if need < self.size and len(tail):
                fresh = _unseen_first(fresh, tail, need)
            taken = fresh[:need]
            records.append(taken)
            passes.append(np.full(len(taken), self.pass_, dtype=np.int64))
            self.rest, need = fresh[len(taken):], need - len(taken)
        self.epoch += 1
        return np.concatenate(records), np.concatenate(passes)

    def _permutation(self, pass_: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size, dtype=np.int64)
        return np.random.default_rng([self.seed, self.source, pass_, _MIX]).permutation(self.size)


def _unseen_first(fresh: np.ndarray, seen: np.ndarray, need: int) -> np.ndarray:
    """``fresh`` with its first ``need`` records not in ``seen`` moved to the front (the rest, and
    the order within each part, kept); records of ``seen`` fill up when too few are unseen."""
    marked = np.zeros(len(fresh), dtype=bool)
    marked[seen] = True
    was_seen = marked[fresh]
    front = np.flatnonzero(~was_seen)[:need]
    if len(front) < need:
        front = np.sort(np.concatenate([front, np.flatnonzero(was_seen)[:need - len(front)]]))
    head = np.zeros(len(fresh), dtype=bool)
    head[front] = True
    return np.concatenate([fresh[head], fresh[~head]])


def _apportion(total: int, weights: list[float]) -> list[int]:
    """``total`` split by ``weights``: largest remainders, ties to the earlier source."""
    whole = sum(weights)
    if whole <= 0:
        raise ValueError(f"weights={weights}: at least one must be > 0")
    quotas = [total * w / whole for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in by_remainder[:total - sum(counts)]:
        counts[k] += 1
    return counts


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name}={value!r}: must be a whole number >= 0")
    return int(value)


def _share(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not 0 <= value < math.inf:
        raise ValueError(f"{name}={value!r}: must be a finite number >= 0")
    return float(value)
