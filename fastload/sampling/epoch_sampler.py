"""The sampler stage: this rank's records for an epoch, in a (seed, epoch) order, resumable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Sampler

from fastload.sampling.mixing import MixPlan
from fastload.sampling.order import rank_share, resume_order


class SampleKey(NamedTuple):
    """What the sampler hands a PackedDataset: the record, and the epoch and seed of its augmentation."""

    index: int
    epoch: int
    seed: int


class EpochSampler(Sampler):
    """A global permutation from ``(seed, epoch)``, this rank's share of it, from a resume position.

    The order depends only on (num_samples, seed, epoch, rank, world_size, drop_last), never on
    ``num_workers``; ``keyed=True`` yields :class:`SampleKey` so augmentations are fixed too.
    ``seed=None``: the seed is drawn once, when first needed (the first iteration), from
    ``generator`` or else torch's global RNG, as torch's ``RandomSampler`` draws its own: so
    ``torch.manual_seed`` and ``generator=`` decide the order, as they do torch's.
    ``mix``: the global order is a mix's (:mod:`fastload.sampling.mixing`, ``num_samples`` its
    epoch length), and a keyed sample's ``epoch`` is the pass of its source's stream.
    """

    def __init__(self, num_samples: int, *, shuffle: bool, seed: int | None = 0, rank: int = 0,
                 world_size: int = 1, drop_last: bool = False, keyed: bool = False,
                 generator: torch.Generator | None = None, mix: MixPlan | None = None) -> None:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ValueError(f"seed={seed!r}: must be a non-negative integer (or None: drawn from torch's RNG)")
        self.num_samples, self.shuffle = num_samples, shuffle
        self._seed, self.generator = seed, generator
        self.seed_given = seed is not None  # else drawn: a resume takes the saved run's instead
        self.rank, self.world_size, self.drop_last, self.keyed = rank, world_size, drop_last, keyed
        if mix is not None and mix.epoch_length != num_samples:
            raise ValueError(f"num_samples={num_samples}, but the mix draws {mix.epoch_length} an epoch")
        self.mix = mix
        self.epoch = 0
        self.start = 0  # samples of this epoch's share already delivered (resume position)
        self.consumed = 0  # samples of this epoch's global order delivered before an elastic resume
        self.running: dict | None = None  # the loader's progress of the iteration it began last
        self._started = False  # an iteration has begun: the next one moves to the next epoch
        self._pinned = False  # set_epoch/resume chose the next iteration's epoch explicitly
        rank_share(0, seed=0, epoch=0, shuffle=shuffle, rank=rank, world_size=world_size,
                   drop_last=drop_last)  # validates rank and world_size now, not at the first batch

    @property
    def seed(self) -> int:
        """The seed of every epoch's order (drawn now if it was left to torch's RNG and not drawn yet)."""
        if self._seed is None:
            # RandomSampler's own draw: one int64 from the generator, or from torch's global RNG
            drawn = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
            self._seed = drawn & (2**63 - 1)
        return self._seed

    @seed.setter
    def seed(self, value: int) -> None:
        self._seed = int(value)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration (and restart it from its beginning).

        The epoch of an iteration that has begun and delivered nothing yet is confirmed, not
        restarted: PyTorch Lightning calls ``iter(loader)`` and then ``set_epoch`` with the same
        epoch, and a prefetch thread may already have drawn the order (or a resume position).
        """
        if epoch < 0:
            raise ValueError(f"epoch={epoch}: must be >= 0")
        running = self.running
        if (running is not None and running.get("epoch") == epoch and running["delivered"] == 0
                and not running.get("finished")):
            return
        self.epoch, self.start, self.consumed = int(epoch), 0, 0
        self._pinned = True

    def resume(self, epoch: int, position: int, consumed: int = 0) -> None:
        """Make the next iteration yield ``epoch``'s share from ``position`` on, after ``consumed``
        samples of the epoch's global order were delivered by ranks of another world size."""
        self.running = None
        self.set_epoch(epoch)
        self.consumed = int(consumed)
        resume_order(self.share(), position)  # validates both against this epoch's order
        self.start = int(position)

    def share(self, epoch: int | None = None) -> np.ndarray:
        """This rank's whole order for ``epoch`` (default: the current epoch)."""
        epoch = self.epoch if epoch is None else epoch
        consumed = self.consumed if epoch == self.epoch else 0
        if self.mix is not None:
            return self.mix.order(self.seed, epoch, self.shuffle)[0][self._positions(consumed)]
        return rank_share(self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                          rank=self.rank, world_size=self.world_size, drop_last=self.drop_last,
                          consumed=consumed)

    def _positions(self, consumed: int) -> np.ndarray:
        """This rank's positions in a mix's global order (already shuffled): shared out as an
        epoch's order is."""
        return rank_share(self.num_samples, seed=0, epoch=0, shuffle=False, rank=self.rank,
                          world_size=self.world_size, drop_last=self.drop_last, consumed=consumed)

    @property
    def pinned(self) -> bool:
        """set_epoch() or resume() chose the next iteration's epoch (and start)."""
        return self._pinned

    def upcoming(self) -> tuple[int, int]:
        """``(epoch, start)`` of the next iteration, before it begins."""
        if self._started and not self._pinned:
            return self.epoch + 1, 0
        return self.epoch, self.start

    def __iter__(self) -> Iterator[int | SampleKey]:
        # Each new iteration is the next epoch unless set_epoch()/resume() chose one: forgetting
        # set_epoch must not repeat the same order every epoch.
        epoch, self.start = self.upcoming()
        if epoch != self.epoch:
            self.consumed = 0  # an elastic resume's offset belongs to its epoch alone
        self.epoch = epoch
        self._started, self._pinned = True, False
        order = resume_order(self.share(), self.start)
        if not self.keyed:
            return iter(order.tolist())
        epoch, seed = self.epoch, self.seed
        if self.mix is not None:  # each draw's augmentation is keyed by its pass, not the epoch
            passes = self.mix.order(seed, epoch, self.shuffle)[1][self._positions(self.consumed)]
            return (SampleKey(i, p, seed) for i, p in zip(order.tolist(), passes[self.start:].tolist()))
        return (SampleKey(i, epoch, seed) for i in order.tolist())

    def __len__(self) -> int:
        """Samples of this rank's share of a whole epoch: torch's meaning, also while a resumed
        epoch is in progress (its iteration yields only the rest). Trainers count an epoch's
        batches from it and add the ones they ran before the checkpoint (Lightning does)."""
        n, w = self.num_samples, self.world_size
        return n // w if self.drop_last else -(-n // w)
