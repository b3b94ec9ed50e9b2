"""What a batch looks like: your own tensor transform after the built-in decode and crop, and the
output layouts on the device (float16/bfloat16 after mean/std, channels_last)."""

from __future__ import annotations

import pytest
import torch

import fastload

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def eval_set(path, **kwargs) -> fastload.PackedDataset:
    return fastload.PackedDataset(path, image_size=16, train=False, **kwargs)


def to_unit_corner(image: torch.Tensor) -> torch.Tensor:
    """A torch user's tensor transform: float in [0, 1], flipped, its 8×8 corner."""
    return image.float().div(255).flip(-1)[:, :8, :8]


@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
def test_a_tensor_transform_runs_after_the_builtin_decode_and_crop(id_packed, num_workers):
    path = id_packed("lmdb")
    plain = list(fastload.DataLoader(eval_set(path), batch_size=5))
    loader = fastload.DataLoader(eval_set(path, transform=to_unit_corner), batch_size=5, num_workers=num_workers)
    assert loader.settings.mode != "main" or num_workers == 0  # the fast path stays
    for (images, labels), (raw, raw_labels) in zip(loader, plain, strict=True):
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 8, 8)
        assert torch.equal(labels, raw_labels)
        assert torch.equal(images, torch.stack([to_unit_corner(x) for x in raw]))


def test_a_transform_that_breaks_the_batch_names_the_record(id_packed):
    path = id_packed("lmdb")
    shapes = fastload.PackedDataset(path, image_size=16, train=False,
                                    transform=lambda x: x[:, : 4 + int(x.sum()) % 3])
    with pytest.raises(ValueError, match=r"record \d+ .*transform returned .*a batch stacks one shape"):
        list(fastload.DataLoader(shapes, batch_size=8, num_workers=0))
    not_a_tensor = eval_set(path, transform=lambda x: x.tolist())
    with pytest.raises(TypeError, match=r"record \d+.*transform must return a tensor .* returned a list"):
        not_a_tensor[0]
    with pytest.raises(ValueError, match="normalise in the transform, or drop it"):
        fastload.DataLoader(eval_set(path, transform=to_unit_corner), mean=MEAN, std=STD)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_normalised_images_come_as_the_dtype_and_layout_asked(id_packed, dtype, memory_format):
    path = id_packed("hdf5")
    reference = list(fastload.DataLoader(eval_set(path), batch_size=5, mean=MEAN, std=STD))
    loader = fastload.DataLoader(eval_set(path), batch_size=5, mean=MEAN, std=STD, dtype=dtype,
                                 memory_format=memory_format)
    for (images, labels), (expected, expected_labels) in zip(loader, reference, strict=True):
        assert images.dtype == dtype and images.shape == expected.shape
        assert images.is_contiguous(memory_format=memory_format)
        assert torch.equal(images, expected.to(dtype)) and torch.equal(labels, expected_labels)


def test_uint8_images_come_channels_last_and_dtype_needs_mean_std(id_packed):
    path = id_packed("lmdb")
    images, _ = next(iter(fastload.DataLoader(eval_set(path), batch_size=5, memory_format=torch.channels_last)))
    assert images.dtype == torch.uint8 and images.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="dtype is what normalised images are delivered as: pass mean and std"):
        fastload.DataLoader(eval_set(path), dtype=torch.float16)
    with pytest.raises(ValueError, match="memory_format=.*choose"):
        fastload.DataLoader(eval_set(path), memory_format=torch.preserve_format)
