"""DataLoader: torch's arguments and meaning, plus tuned defaults, resumable order and device delivery."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Literal, TypeVar

import torch
import torch.utils.data

from fastload.backends import backend_class
from fastload.loading.delivery import LoaderIterator
from fastload.loading.loader_arguments import (
    check_transform_and_backend,
    collate_for,
    epoch_sampler_for,
    image_place,
    packed_subset,
    rebuilt_arguments,
    remember_made,
    wants_epoch_sampler,
)
from fastload.loading.prefetch import ThreadPrefetcher
from fastload.loading.settings import LoaderSettings, resolve_settings, uses_builtin_pipeline
from fastload.loading.stats import LoaderStats
from fastload.loading.transfer import ImageLayout, Normalizer, resolve_device
from fastload.samples.user_transforms import BatchTransform
from fastload.sampling.epoch_sampler import EpochSampler
from fastload.sampling.epoch_state import epoch_state, resume_epoch
from fastload.sampling.iterable_resume import iterable_state, load_iterable_state
from fastload.sampling.resume import ResumableSampler

Auto = Literal["auto"]
T_co = TypeVar("T_co", covariant=True)


class DataLoader(torch.utils.data.DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader``.

    Every torch argument keeps its name, position and meaning; with explicit torch arguments and
    any Dataset it yields what torch's loader yields. What differs:

    * ``num_workers``, ``prefetch_factor`` and ``pin_memory`` default to ``"auto"``: resolved once,
      with reasons, into ``loader.settings`` (see :mod:`fastload.loading.settings`).
    * A :class:`~fastload.PackedDataset` (or any dataset with ``distributed=True``) is sampled by
      :class:`~fastload.sampling.epoch_sampler.EpochSampler`: a global ``(seed, epoch)`` permutation,
      independent of ``num_workers``, sharded across ``torch.distributed`` ranks, resumable with
      ``state_dict()`` / ``load_state_dict()``. Each new iteration is the next epoch unless
      ``set_epoch`` chose one. An explicit ``sampler`` or ``batch_sampler`` is always respected.

    The arguments torch does not have (torch's keep their meaning):

    Args:
        device: deliver batches on this device (``"cuda"``: pinned, non-blocking copies on a side
            stream, one batch ahead). Without CUDA, batches stay on the CPU (said once).
        mean, std: normalise uint8 image batches to float32 ``(x/255 - mean) / std`` on ``device``.
        seed: shuffle and augmentation seed of the EpochSampler. None (the default): drawn at the
            first iteration from ``generator``, else from torch's global RNG (so ``generator=`` and
            ``torch.manual_seed`` decide the order, as they do torch's); under ``torch.distributed``
            with neither, 0, as ``DistributedSampler``'s default, so that every rank has the same.
        distributed: shard across ``torch.distributed`` ranks: None = PackedDataset loaders when a
            process group is initialised; True = any dataset (needs a process group); False = never.
        backend: ``"torch"`` (torch's iterator), ``"nvimgcodec"`` (a PackedDataset's built-in image
            pipeline with JPEG crops decoded by nvImageCodec on ``device="cuda"``: the hardware
            JPEG engines where the GPU has them) or ``"dali"`` (the same run by NVIDIA DALI); in
            the same order, with the same batches, state and stats. See docs/gpu.md.
        dtype: what normalised images are delivered as (``torch.float16``/``bfloat16``: half the
            bytes for mixed precision), cast on ``device`` after ``mean``/``std``; needs them.
        memory_format: ``torch.channels_last`` delivers images NHWC in memory (the layout
            convolutions with tensor cores want), on ``device``; the shape stays N×C×H×W.
        mode: where batches are made: ``"main"`` (this process, as torch's ``num_workers=0``),
            ``"threads"`` (a background thread and a decode thread pool, 0 worker processes),
            ``"processes"`` (``num_workers`` worker processes), ``"ray"`` (``num_workers`` decode
            actors on a Ray cluster, the same batches; see docs/ray.md), or ``"auto"``: from ``num_workers``
            when it is given (0: main, as torch's), else chosen in ``loader.settings``. What
            ``fastload.tune`` finds is passed back as ``DataLoader(ds, **settings.as_kwargs())``.
        batch_transform: ``fn(batch, generator) -> batch`` on each delivered ``(images, labels)``
            batch, on ``device``, after ``mean``/``std`` (GPU augmentations: mixup, cutmix, colour
            jitter as torch ops; see :mod:`fastload.augment`); ``generator`` is a
            ``torch.Generator`` on the batch's device seeded from ``(seed, epoch, position of the
            batch's first sample)``: the same draws after a resume, for either backend.
        ray_address: with ``mode="ray"``, the cluster: None joins the Ray this process is
            connected to, else ``RAY_ADDRESS`` or the cluster this machine is part of; ``"host:port"``
            that cluster's head; ``"local"`` starts a Ray on this machine.
        ray_min_workers: with ``mode="ray"``, elastic actors: start this many, add more (up to
            ``num_workers``) while the loop waits on them and retire idle ones (down to this);
            None keeps ``num_workers`` actors. ``loader.stats()["actors"]`` says how many run.
        ray_local_workers: with ``mode="ray"``, local and remote decode together: this many of the
            actors run on this machine's own Ray node (never retired; at most ``ray_min_workers``),
            the others wherever the cluster has CPUs.
    """

    def __init__(self, dataset: torch.utils.data.Dataset, batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Any = None, batch_sampler: Any = None,
                 num_workers: int | Auto = "auto", collate_fn: Any = None,
                 pin_memory: bool | Auto = "auto", drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Any = None, multiprocessing_context: Any = None, generator: Any = None,
                 *, prefetch_factor: int | None | Auto = "auto", persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True,
                 device: str | torch.device | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, seed: int | None = None, distributed: bool | None = None,
                 backend: Literal["torch", "dali", "nvimgcodec"] = "torch",
                 batch_transform: BatchTransform | None = None,
                 mode: Literal["auto", "main", "threads", "processes", "ray"] = "auto",
                 dtype: torch.dtype | None = None,
                 memory_format: torch.memory_format = torch.contiguous_format,
                 ray_address: str | None = None, ray_min_workers: int | None = None,
                 ray_local_workers: int = 0) -> None:
        check_transform_and_backend(dataset, backend, batch_transform, device)
        self.batch_transform = batch_transform
        dataset = packed_subset(dataset)
        tail = backend_class(backend)
        self.backend = backend
        self.shuffle = shuffle
        self.device = device
        self.mean, self.std = mean, std
        self.seed = seed
        self.distributed = distributed
        if (mean is None) != (std is None):
            raise ValueError("pass mean and std together (or neither)")
        if mean is not None and uses_builtin_pipeline(dataset) and getattr(dataset, "transform", None) is not None:
            raise ValueError("mean/std normalise the built-in pipeline's uint8 images, and the dataset's transform= "
                             "may return anything: normalise in the transform, or drop it")
        self._normalizer = Normalizer(mean, std, image_place(dataset)) if mean is not None else None
        self.dtype, self.memory_format = dtype, memory_format
        self._layout = (ImageLayout(dtype, memory_format, image_place(dataset), normalised=mean is not None)
                        if dtype is not None or memory_format != torch.contiguous_format else None)
        self._device = resolve_device(device)
        given_samplers = sampler, batch_sampler
        batch_size, shuffle, sampler, batch_sampler = rebuilt_arguments(
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last)
        if sampler is None and batch_sampler is None and wants_epoch_sampler(dataset, distributed):
            sampler = epoch_sampler_for(dataset, shuffle, seed, generator, drop_last, distributed)
            shuffle = None
        self.settings: LoaderSettings = resolve_settings(
            dataset, batch_size=batch_size, num_workers=num_workers, prefetch_factor=prefetch_factor,
            pin_memory=pin_memory, device=self._device, timeout=timeout, mode=mode)
        self.mode = self.settings.mode  # what a loader rebuilt from its attributes (Lightning) is given back
        batching = batch_size is not None or batch_sampler is not None
        collate_fn = collate_for(dataset, collate_fn, batching)
        self._stats = LoaderStats()
        self._progress: dict[str, Any] = {}
        super().__init__(dataset, batch_size, shuffle, sampler, batch_sampler, self.settings.num_workers,
                         collate_fn, self.settings.pin_memory, drop_last, timeout, worker_init_fn,
                         multiprocessing_context, generator, prefetch_factor=self.settings.prefetch_factor,
                         persistent_workers=persistent_workers, pin_memory_device=pin_memory_device,
                         in_order=in_order)
        remember_made(self, *given_samplers)
        # A tail of our own replaces torch's iterator; the sampler, len() and state stay the loader's.
        self.ray_address, self.ray_min_workers = ray_address, ray_min_workers
        self.ray_local_workers = ray_local_workers
        if self.settings.mode == "ray":  # decode actors on a Ray cluster
            from fastload.loading.ray_mode import RayDecode

            tail = partial(RayDecode, backend=backend, pin_memory=self.settings.pin_memory, in_order=in_order,
                           address=ray_address, min_workers=ray_min_workers, local_workers=ray_local_workers)
        elif given := ", ".join(f"{name}={value!r}" for name, value, default in (
                ("ray_address", ray_address, None), ("ray_min_workers", ray_min_workers, None),
                ("ray_local_workers", ray_local_workers, 0)) if value != default):
            raise ValueError(f"{given} apply to mode='ray' only, and this loader's mode is "
                             f"{self.settings.mode!r}: pass mode='ray' or drop them")
        self._tail = None if tail is None else tail(
            dataset, batch_size=self.batch_size, device=self._device, mean=mean, std=std,
            collate_fn=self.collate_fn, batched=self.batch_sampler is not None,
            num_workers=self.settings.num_workers, prefetch_factor=self.settings.prefetch_factor)

    @property
    def epoch_sampler(self) -> EpochSampler | None:
        """The fastload sampler behind this loader, when it uses one."""
        sampler = self.sampler
        return sampler if isinstance(sampler, EpochSampler) else None

    @property
    def _index_sampler(self) -> Any:
        """What torch's iterators and len() draw indices from: for a loader without fastload's
        EpochSampler, the sampler wrapped so that any pass can be resumed (fastload.sampling.resume)."""
        base = super()._index_sampler
        if self.epoch_sampler is not None or isinstance(self.dataset, torch.utils.data.IterableDataset):
            return base
        resumable = self.__dict__.get("_resumable")
        if resumable is None or resumable.base is not base:
            resumable = self.__dict__["_resumable"] = ResumableSampler(base)  # one per sampler: it holds the pass
        return resumable

    def __iter__(self) -> LoaderIterator:  # type: ignore[override]
        # Where this iteration starts, taken before torch's iterator (or workers) pull the sampler.
        progress: dict[str, Any] = {"delivered": 0}
        sampler = self.epoch_sampler
        if sampler is not None:
            epoch, start = sampler.upcoming()
            progress.update(epoch=epoch, start=start, share=sampler.share(epoch),
                            consumed=sampler.consumed if epoch == sampler.epoch else 0)
            sampler.running = progress
        self._progress = progress
        from fastload.dataset import PackedDataset
        from fastload.samples.mixed import MixedDataset

        if isinstance(self.dataset, (PackedDataset, MixedDataset)) and self.settings.mode != "ray":
            # in a store: fetch ahead into the node cache (mode="ray": the actors' nodes' caches)
            self.dataset.fill_cache()
        inner: Any = None
        if self._tail is not None:  # already on the device, normalised
            keys = iter(self._index_sampler)  # resumable, as torch's iterator draws it: the pass's state
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # torch's base seed: its order
            source: Iterator[Any] = self._tail.batches(keys)
        else:
            inner = source = super().__iter__()
            if self.settings.mode == "threads":
                source = ThreadPrefetcher(source, self.settings.prefetch_batches)
        return LoaderIterator(self, inner, source, progress, self._stats, self._device, self._normalizer,
                              on_device=getattr(self._tail, "on_device", self._tail is not None),
                              workers=self._tail is None and self.num_workers > 0, layout=self._layout)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration (forwarded to the sampler if it has set_epoch)."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is None:
            raise TypeError(f"set_epoch: the sampler {type(self.sampler).__name__} has no set_epoch; "
                            "use a PackedDataset, distributed=True, or a DistributedSampler")
        set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: for fastload's EpochSampler the epoch and how many of its samples
        were delivered; for any other sampler what decided this pass's order and how many batches
        were delivered (see fastload.sampling.resume); for an IterableDataset its own ``state_dict()``."""
        if not self.in_order and self.num_workers > 0:
            # Only a count of delivered samples is kept: right when batches arrive in sampler order.
            warnings.warn("state_dict: with in_order=False, workers may deliver batches out of "
                          "order, and a resume from this state can repeat some samples and skip others; "
                          "keep in_order=True (the default) for an exact resume", stacklevel=2)
        sampler = self.epoch_sampler
        if sampler is None:
            if isinstance(self.dataset, torch.utils.data.IterableDataset):
                return iterable_state(self.dataset, num_workers=self.num_workers)
            return self._index_sampler.state(self._progress.get("batches", 0))
        return epoch_state(sampler, self._progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields exactly the samples the saved loader had not delivered.

        The state of any rank serves (DDP ranks deliver in step), also on another number of ranks
        (elastic): the samples the saved ranks delivered are a prefix of the epoch's global order,
        and the rest of it is shared out among the new ranks as an epoch would be (``drop_last``
        truncates it to a multiple of the new world size, padding repeats its start).
        """
        sampler = self.epoch_sampler
        if sampler is not None:
            resume_epoch(sampler, state)
        elif isinstance(self.dataset, torch.utils.data.IterableDataset):
            load_iterable_state(self.dataset, state, num_workers=self.num_workers)
        else:
            self._index_sampler.load(state)
        self._progress = {}

    def stats(self, reset: bool = False) -> dict[str, float]:
        """samples/s, MB/s of payload, the fraction of wall time the loop waited for data, and
        ``skipped``: records an ``on_error="skip"`` dataset left out of the delivered batches; with
        ``mode="ray"``, ``actors``: the decode actors running now (elastic with ``ray_min_workers``);
        with a pixel cache, ``pixel_cache`` (:meth:`~fastload.loading.stats.LoaderStats.pixel_figures`).

        They add up over every epoch since the loader was made, the wall time running from its
        first batch to its last (time between epochs, a validation pass say, counts too);
        ``reset=True`` starts the counts again after returning them (once per epoch: per-epoch figures).
        """
        figures = self._stats.as_dict()
        if (pixel_cache := getattr(self.dataset, "pixel_cache", None)) is not None:
            figures["pixel_cache"] = self._stats.pixel_figures(pixel_cache.bytes())
        if self.settings.mode == "ray":
            figures["actors"] = len(self._tail.actors)
        if reset:
            self._stats.reset()
        return figures
