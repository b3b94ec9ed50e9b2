"""Loading: what a DataLoader makes of its arguments before torch's loader is given them."""

from __future__ import annotations

import weakref
from typing import Any

import torch.distributed as dist
import torch.utils.data

from fastload.loading.settings import uses_builtin_pipeline
from fastload.samples.collate import collate_images, keep_skips
from fastload.sampling.epoch_sampler import EpochSampler


def check_transform_and_backend(dataset: Any, backend: str, batch_transform: Any, device: Any = None) -> None:
    """Refuse a ``batch_transform`` that cannot be called, a decoding backend for a dataset whose
    samples it would not make as asked (a ``sample_transform``, ``fields=``), and GPU decode
    asked for on a machine without CUDA."""
    from fastload.backends import GPU_DECODE

    if batch_transform is not None and not callable(batch_transform):
        raise TypeError(f"batch_transform={batch_transform!r}: must be a callable (batch, generator) -> batch")
    if backend in GPU_DECODE and getattr(dataset, "sample_transform", None) is not None:
        raise ValueError(f"backend={backend!r} decodes the batch itself, so the dataset's sample_transform "
                         "would not run; use batch_transform= (on the device), or backend='torch'")
    if backend in GPU_DECODE and getattr(dataset, "pixel_cache", None) is not None:
        raise ValueError(f"backend={backend!r} decodes the JPEGs itself, so the dataset's pixel_cache would not "
                         "be used; drop pixel_cache=, or use backend='torch' (which crops the cached pixels)")
    if backend in GPU_DECODE and getattr(dataset, "fields", None):
        raise ValueError(f"backend={backend!r} delivers (images, labels) batches; the dataset's fields= (dict "
                         "samples) need backend='torch'")
    if (backend == "nvimgcodec" and device is not None and torch.device(device).type == "cuda"
            and not torch.cuda.is_available()):
        raise ValueError("backend='nvimgcodec' with device='cuda': CUDA is not available here (torch "
                         f"{torch.__version__}); decode on the CPU with backend='torch' (the fast CPU path), "
                         "or pass device='cpu' to run nvImageCodec's CPU codecs")


def packed_subset(dataset: Any) -> Any:
    """A ``torch.utils.data.Subset`` (a ``random_split`` part, or a Subset of one) of a
    PackedDataset, as the PackedDataset subset it is: the same samples, with the fast path kept."""
    chain = []
    inner = dataset
    while isinstance(inner, torch.utils.data.Subset):
        chain.append(inner.indices)
        inner = inner.dataset
    if not chain:
        return dataset
    # only for a Subset: a plain dataset's loader stays light
    from fastload.dataset import PackedDataset

    if not isinstance(inner, PackedDataset):
        return dataset
    for indices in reversed(chain):  # innermost first: each Subset numbers the samples of the one it wraps
        inner = inner.subset(indices)
    return inner


def image_place(dataset: Any) -> int:
    """Where a tuple batch holds the images (``PackedDataset(fields=..., sample_as="tuple")``),
    for mean/std; 0 for any other dataset. Refused when its fields have no image."""
    fields, as_tuple = getattr(dataset, "fields", None), getattr(dataset, "sample_as", "dict") == "tuple"
    if not as_tuple or not isinstance(fields, tuple):
        return 0
    if "image" not in fields:
        raise ValueError(f"mean/std normalise the images, but the dataset's fields={fields!r} have no 'image'")
    return fields.index("image")


_MADE_BY_A_LOADER: weakref.WeakSet[Any] = weakref.WeakSet()
"""The samplers and batch samplers fastload's loaders (and torch's code under them) made, not
their users: only these are recognised when passed back."""


def remember_made(loader: Any, sampler: Any, batch_sampler: Any) -> None:
    """Note ``loader``'s sampler and batch sampler where they are not the ``sampler`` and
    ``batch_sampler`` its user gave (torch's BatchSampler, the sampler ``shuffle`` chose, ours)."""
    data = torch.utils.data
    kinds = (data.BatchSampler, data.SequentialSampler, data.RandomSampler)
    for made, given in ((loader.sampler, sampler), (loader.batch_sampler, batch_sampler)):
        # a user's sampler inside a BatchSampler passed back is still the user's: only these types
        if made is not given and (type(made) in kinds or isinstance(made, EpochSampler)):
            _MADE_BY_A_LOADER.add(made)


def rebuilt_arguments(dataset: Any, batch_size: int | None, shuffle: bool | None, sampler: Any,
                       batch_sampler: Any, drop_last: bool) -> tuple[int | None, bool | None, Any, Any]:
    """The arguments that made a loader's attributes, when a framework (Lightning) passes them back.

    A constructed loader holds both the arguments and what torch made of them: the BatchSampler
    over its sampler, the sampler that ``shuffle`` chose, ``batch_size=None`` next to a custom
    batch_sampler. Passed back as they are, torch would refuse them as mutually exclusive; they
    are recognised here (objects a loader made, :func:`remember_made`) and mapped back. Any other
    combination, a user's own sampler objects included, goes to torch, which judges it.
    """
    data = torch.utils.data
    made = _MADE_BY_A_LOADER
    if (batch_sampler in made and type(batch_sampler) is data.BatchSampler
            and batch_sampler.batch_size == batch_size and batch_sampler.drop_last == drop_last
            and (sampler is None or sampler is batch_sampler.sampler)):
        sampler, batch_sampler = batch_sampler.sampler, None  # the BatchSampler torch made
    elif (batch_sampler is not None and batch_size is None and not drop_last and not shuffle
          and sampler in made and type(sampler) is data.SequentialSampler and sampler.data_source is dataset):
        sampler, batch_size = None, 1  # what torch made next to a custom batch_sampler
    if shuffle and sampler in made and (isinstance(sampler, EpochSampler)
                                        or (type(sampler) is data.RandomSampler and sampler.data_source is dataset)):
        shuffle = None  # the sampler shuffle=True made (or ours, which shuffles by itself)
    return batch_size, shuffle, sampler, batch_sampler


def wants_epoch_sampler(dataset: Any, distributed: bool | None) -> bool:
    """Whether fastload's EpochSampler orders ``dataset``: a PackedDataset or a MixedDataset, or with
    ``distributed=True`` any map-style dataset."""
    from fastload.dataset import PackedDataset
    from fastload.samples.mixed import MixedDataset

    if isinstance(dataset, torch.utils.data.IterableDataset):
        if distributed:
            raise ValueError("distributed=True needs a map-style dataset; an IterableDataset must "
                             "split itself across ranks")
        return False
    return isinstance(dataset, (PackedDataset, MixedDataset)) or bool(distributed)


def epoch_sampler_for(dataset: Any, shuffle: bool | None, seed: int | None, generator: Any, drop_last: bool,
                      distributed: bool | None) -> EpochSampler:
    """fastload's sampler for ``dataset``, over this rank's share under ``torch.distributed``."""
    rank, world_size = _rank_and_world(distributed)
    if seed is None and generator is None and world_size > 1:
        seed = 0  # ranks must share one order: DistributedSampler's default seed
    from fastload.samples.mixed import MixedDataset

    mix = dataset.plan if isinstance(dataset, MixedDataset) else None  # its epoch: the mix's draws
    return EpochSampler(len(dataset) if mix is None else mix.epoch_length, shuffle=bool(shuffle),  # type: ignore[arg-type]
                        seed=seed, rank=rank, world_size=world_size, drop_last=drop_last,
                        keyed=uses_builtin_pipeline(dataset), generator=generator, mix=mix)


def _rank_and_world(distributed: bool | None) -> tuple[int, int]:
    initialised = dist.is_available() and dist.is_initialized()
    if distributed and not initialised:
        raise ValueError("distributed=True but torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group() first (torchrun sets it up)")
    if distributed is False or not initialised:
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def collate_for(dataset: Any, collate_fn: Any, batching: bool) -> Any:
    """The collate function: the one given, else the one ``dataset``'s samples need (the built-in
    pipeline's, or its fields'); for an ``on_error="skip"`` dataset (or one with a pixel cache),
    one that passes on its counts."""
    if collate_fn is None and batching and uses_builtin_pipeline(dataset):
        collate_fn = collate_images  # unbatched, torch converts each sample: keep its default
    elif collate_fn is None and batching and getattr(dataset, "fields", None) and callable(
            getattr(dataset, "collate", None)):
        collate_fn = dataset.collate  # a PackedDataset's dict samples, collated by their fields' types
    if batching and (getattr(dataset, "on_error", None) == "skip" or getattr(dataset, "pixel_cache", None)):
        collate_fn = keep_skips(collate_fn)  # each batch carries its skip (and pixel cache) counts to stats()
    return collate_fn
