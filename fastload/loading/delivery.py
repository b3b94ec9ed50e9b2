"""The training loop's end of the pipeline: the iterator ``iter(fastload.DataLoader)`` returns.

It is torch's iterator for code that looks (``isinstance(it, _BaseDataLoaderIter)``,
``it._workers``, ``len(it)``, ``it._num_yielded``), and it behaves as torch's does: a batch
whose ``__getitem__`` raised raises that error, and the next ``next()`` carries on with the
following batch. fastload's extra work rides inside: batches on the device (normalised), skipped
records counted, stats, and the progress that ``loader.state_dict()`` reads.

torch's iterator classes are private (``torch.utils.data.dataloader``); subclassing the base is
the one way to be one, and every attribute it does not define here is torch's own iterator's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data.dataloader import _BaseDataLoaderIter

from fastload.samples.collate import pixels_in, skipped_in
from fastload.loading.prefetch import ThreadPrefetcher
from fastload.loading.stats import LoaderStats, batch_size_of
from fastload.loading.transfer import DeviceFeed, ImageLayout, Normalizer
from fastload.samples.user_transforms import apply_batch_transform


_WORKER_DIED = "DataLoader worker (pid"  # how torch's errors for a dead worker begin


class LoaderIterator(_BaseDataLoaderIter):
    """One pass over a loader: torch's iterator (``inner``; None for the DALI tail) → optional
    prefetch thread → skip counts → device → the loop."""

    def __init__(self, loader: Any, inner: Any, source: Iterator[Any], progress: dict[str, Any],
                 stats: LoaderStats, device: Any, normalizer: Normalizer | None, *,
                 on_device: bool, workers: bool, layout: ImageLayout | None = None) -> None:
        # torch's __init__ is not run: ``inner`` already is torch's iterator, with its own state.
        self._loader, self._inner, self._source = loader, inner, source
        self._progress, self._stats, self._workers_died_named = progress, stats, workers
        tail = getattr(loader, "_tail", None)
        if hasattr(tail, "counts"):  # the backend's own counts (decoders, payload slots) in loader.stats()
            stats.tail = tail
        self._skips: deque[int] = deque()  # on_error="skip" records left out of each batch, in order
        noted = _NotingSkips(source, self._skips, stats)
        # The DALI tail delivers on the device, normalised, already.
        self._batches: Iterator[Any] = noted if on_device else DeviceFeed(noted, device, normalizer)
        if layout is not None:  # the dtype and memory format asked for, on the device, after mean/std
            self._batches = map(layout, self._batches)
        self._sizes = getattr(loader.dataset, "record_sizes", None)  # a PackedDataset's (or subset's)
        self._num_yielded = 0
        # Kept as attributes, not looked up in the module at close: __del__ may run at interpreter
        # exit, when this module's globals are already gone.
        self._prefetcher = source if isinstance(source, ThreadPrefetcher) else None
        self._worker_died: RuntimeError | None = None

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(inner, name)  # _workers, _dataset_kind, _index_sampler, ... are torch's

    def __iter__(self) -> LoaderIterator:
        return self

    def __len__(self) -> int:
        return len(self._inner) if self._inner is not None else len(self._loader)

    def __next__(self) -> Any:
        if self._worker_died is not None:  # its workers are stopped: there is no next batch
            raise RuntimeError(f"{self._worker_died}; this iteration ended there: start a new one")
        started = time.perf_counter()
        try:
            batch = next(self._batches)
        except StopIteration:
            self._progress["finished"] = True
            self._close()
            raise
        except (EOFError, ConnectionError) as exc:
            if not self._workers_died_named or str(exc).startswith("Caught "):
                raise  # a worker's own exception of these types, re-raised by torch
            died = RuntimeError(f"DataLoader worker exited unexpectedly while handing over a batch "
                                f"({type(exc).__name__}: {exc or 'connection closed'}); it was killed "
                                "(out of memory? see dmesg) or crashed")
            raise self._stop_workers(died) from exc
        except RuntimeError as exc:
            if self._workers_died_named and str(exc).startswith(_WORKER_DIED):
                said = self._stop_workers(exc)
                if said is not exc:
                    raise said from exc
            raise
        waited = time.perf_counter() - started
        skipped = self._skips.popleft()
        n = 0 if skipped and isinstance(batch, (list, tuple)) and not batch else batch_size_of(batch)
        progress, nbytes = self._progress, 0
        if self._sizes is not None and "share" in progress:
            at = progress["start"] + progress["delivered"]
            nbytes = int(np.asarray(self._sizes)[progress["share"][at:at + n + skipped]].sum())
        position = progress.get("start", 0) + progress["delivered"]
        progress["delivered"] += n + skipped  # skipped samples were consumed too: resume past them
        self._num_yielded += 1
        progress["batches"] = self._num_yielded  # what a resume of any other sampler counts
        transform = getattr(self._loader, "batch_transform", None)
        if transform is not None:  # counted as delivered first: if it raises, the next call goes on
            started = time.perf_counter()
            sampler = self._loader.epoch_sampler  # its seed: given, or drawn from torch's RNG once
            batch = apply_batch_transform(transform, batch, sampler.seed if sampler is not None else 0,
                                          progress.get("epoch"), position)
            waited += time.perf_counter() - started
        self._stats.record(n, nbytes, waited, skipped)
        return batch

    def _stop_workers(self, died: RuntimeError) -> RuntimeError:
        """After a worker died: stop the others and take every worker's pid out of torch's SIGCHLD
        handler, as torch's handler does for a loader it reports. Otherwise a later SIGCHLD (a late
        one for this death, another worker killed) raises in the loop's process wherever it then
        is, the user's own ``except`` block included.

        Returns the error to raise: ``died``, or torch's own report of the death when its SIGCHLD
        handler raised it while the workers were being stopped (then that is what the loop sees,
        and what the next ``next()`` repeats), the stopping finished all the same.
        """
        self._worker_died = died
        try:
            self._end_pass()
        except RuntimeError as late:
            if not str(late).startswith(_WORKER_DIED):
                raise
            self._worker_died = died = late
            self._end_pass()
        return died

    def _end_pass(self) -> None:
        loader, inner = self._loader, self.__dict__.get("_inner")
        if inner is not None and loader.__dict__.get("_iterator") is inner:
            loader._iterator = None  # persistent workers: the next pass starts new ones
        self._shutdown_inner()

    def _shutdown_inner(self) -> None:
        # torch's own shutdown of its iterator (what its __del__ runs): stops the workers, removes
        # their pids from the SIGCHLD handler, reaps them. It does nothing at interpreter exit.
        # Persistent workers belong to the loader (its next pass), not to this pass.
        inner = self.__dict__.get("_inner")
        loader = self.__dict__.get("_loader")
        if inner is None or (loader is not None and loader.__dict__.get("_iterator") is inner):
            return
        shutdown = getattr(inner, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def _close(self) -> None:
        prefetcher = self.__dict__.get("_prefetcher")
        if prefetcher is not None:
            prefetcher.close()

    def __del__(self) -> None:
        # Dropped or collected mid-pass: its workers go now, as torch's iterator's do, even while
        # something else (a kept exception's traceback) still holds torch's iterator.
        self._close()
        self._shutdown_inner()


class _NotingSkips:
    """Pass batches through, noting each one's on_error="skip" count (and pixel cache counts) before
    transfer drops them; an error from the source passes through too, and the next call goes on."""

    def __init__(self, batches: Iterator[Any], skips: deque[int], stats: LoaderStats) -> None:
        self.batches, self.skips, self.stats = batches, skips, stats

    def __iter__(self) -> _NotingSkips:
        return self

    def __next__(self) -> Any:
        batch = next(self.batches)
        self.skips.append(skipped_in(batch) or 0)
        pixels = pixels_in(batch)
        if pixels is not None:
            self.stats.record_pixels(pixels)
        return batch
