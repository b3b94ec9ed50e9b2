"""Ready-made augmentations: each against plain per-pixel code given the same random draws."""

from __future__ import annotations

import colorsys
import math

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.augment import ColorJitter, Compose, CutMix, Mixup, RandomGrayscale
from fastload.augment.mixing import _beta

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
N, H, W = 4, 5, 7


def gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def images(seed: int = 0, n: int = N) -> torch.Tensor:
    """Random uint8 pixels, with pure black, white and gray pixels and equal channels in them."""
    x = torch.randint(0, 256, (n, 3, H, W), generator=gen(seed), dtype=torch.uint8)
    x[:, :, 0, 0] = 0
    x[:, :, 0, 1] = 255
    x[:, :, 0, 2] = 128
    x[:, 1, 1, 0] = x[:, 0, 1, 0]  # R == G: a tie between hue branches
    return x


def normalise(x: torch.Tensor) -> torch.Tensor:
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return (x.float() / 255 - mean) / std


def unnormalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)


# --- references: one pixel at a time, float64, no code from fastload.augment ---------------------

def clamp01(v: float) -> float:
    return min(1.0, max(0.0, v))


def gray(r: float, g: float, b: float) -> float:
    return 0.299 * r + 0.587 * g + 0.114 * b


def ref_jitter(img: np.ndarray, b: float, c: float, s: float, h: float) -> np.ndarray:
    """torchvision's four colour steps on one 3×H×W [0, 1] image, in the fixed order."""
    px = [[list(img[:, i, j]) for j in range(img.shape[2])] for i in range(img.shape[1])]
    px = [[[clamp01(v * b) for v in p] for p in row] for row in px]
    m = sum(gray(*p) for row in px for p in row) / (img.shape[1] * img.shape[2])
    px = [[[clamp01(c * v + (1 - c) * m) for v in p] for p in row] for row in px]
    px = [[[clamp01(s * v + (1 - s) * gray(*p)) for v in p] for p in row] for row in px]
    out = np.zeros(img.shape)
    for i, row in enumerate(px):
        for j, p in enumerate(row):
            hh, ss, vv = colorsys.rgb_to_hsv(*p)
            out[:, i, j] = colorsys.hsv_to_rgb((hh + h) % 1.0, ss, vv)
    return out


def ref_jitter_batch(x: torch.Tensor, params) -> np.ndarray:
    unit = x.double().numpy() / 255 if x.dtype == torch.uint8 else x.double().numpy()
    return np.stack([ref_jitter(unit[k], float(params.brightness[k]), float(params.contrast[k]),
                                float(params.saturation[k]), float(params.hue[k]))
                     for k in range(len(x))])


def assert_uint8_rounds(got: torch.Tensor, ref_unit: np.ndarray) -> None:
    """``got`` is ``ref_unit * 255`` rounded to nearest, except where float32 decides a near tie."""
    ref = ref_unit * 255
    expected = np.clip(np.round(ref), 0, 255)
    got_np = got.numpy().astype(np.float64)
    off = got_np != expected
    assert got.dtype == torch.uint8
    assert np.all(np.abs(got_np - ref)[off] < 0.5 + 1e-3), (got_np[off], ref[off])
    assert np.all(np.abs(ref - np.floor(ref) - 0.5)[off] < 1e-3)


def ref_pil_gray(x: torch.Tensor) -> torch.Tensor:
    grays = [np.asarray(Image.fromarray(img.permute(1, 2, 0).numpy()).convert("L")) for img in x]
    return torch.from_numpy(np.stack(grays))[:, None].expand(-1, 3, -1, -1)


def ref_box(lam: float, cy: int, cx: int, height: int, width: int) -> tuple[int, int, int, int]:
    """timm's ``rand_bbox`` given its draws: (top, left, bottom, right)."""
    ratio = math.sqrt(1 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    top, bottom = np.clip(cy - cut_h // 2, 0, height), np.clip(cy + cut_h // 2, 0, height)
    left, right = np.clip(cx - cut_w // 2, 0, width), np.clip(cx + cut_w // 2, 0, width)
    return int(top), int(left), int(bottom), int(right)


def onehot_rows(labels: list[int], num_classes: int) -> list[list[float]]:
    return [[1.0 if c == y else 0.0 for c in range(num_classes)] for y in labels]


# --- ColorJitter ---------------------------------------------------------------------------------

JITTERS = {
    "brightness": {"brightness": 0.8},
    "contrast": {"contrast": 0.8},
    "saturation": {"saturation": 0.9},
    "hue": {"hue": 0.5},
    "all": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
}


@pytest.mark.parametrize("kwargs", JITTERS.values(), ids=JITTERS.keys())
def test_color_jitter_matches_per_pixel_reference(kwargs):
    cj, x = ColorJitter(**kwargs), images()
    params = cj.draw(N, gen(3))
    out, labels = cj((x, torch.arange(N)), gen(3))
    assert torch.equal(labels, torch.arange(N))
    assert_uint8_rounds(out, ref_jitter_batch(x, params))
    # Each image drew its own factors; disabled components kept their identity value.
    for name in ("brightness", "contrast", "saturation", "hue"):
        values = getattr(params, name)
        if name in kwargs:
            assert len(set(values.tolist())) == N
        else:
            assert values.tolist() == [0.0 if name == "hue" else 1.0] * N


def test_color_jitter_factor_ranges():
    cj = ColorJitter(brightness=1.5, contrast=(0.2, 0.3), saturation=0.5, hue=0.2)
    params = cj.draw(1000, gen(0))
    assert 0 <= params.brightness.min() and params.brightness.max() <= 2.5
    assert params.brightness.min() < 0.1  # max(0, 1 - 1.5): the low end is 0, not -0.5
    assert 0.2 <= params.contrast.min() and params.contrast.max() <= 0.3
    assert 0.5 <= params.saturation.min() and params.saturation.max() <= 1.5
    assert -0.2 <= params.hue.min() < -0.19 and 0.19 < params.hue.max() <= 0.2


def test_color_jitter_uint8_rounds_and_clamps():
    x = torch.tensor([0, 9, 8, 200, 255], dtype=torch.uint8).view(1, 1, 1, 5).expand(1, 3, 1, 5)
    out, _ = ColorJitter(brightness=(1.3, 1.3))((x, torch.zeros(1)), gen(0))
    # 11.7 rounds up (truncation would give 11), 10.4 down, 260 and 331.5 clamp to 255.
    assert out[0, 0, 0].tolist() == [0, 12, 10, 255, 255]
    dark, _ = ColorJitter(contrast=(3.0, 3.0))((x, torch.zeros(1)), gen(0))
    assert dark[0, 0, 0].tolist()[:3] == [0, 0, 0]  # blended below 0: clamped


def test_color_jitter_float_and_normalised_batches_follow_the_uint8_path():
    kwargs = JITTERS["all"]
    x, labels = images(), torch.arange(N)
    as_uint8, _ = ColorJitter(**kwargs)((x, labels), gen(5))
    as_unit, _ = ColorJitter(**kwargs)((x.float() / 255, labels), gen(5))
    as_norm, _ = ColorJitter(**kwargs, mean=MEAN, std=STD)((normalise(x), labels), gen(5))
    assert as_unit.dtype == as_norm.dtype == torch.float32
    assert 0 <= as_unit.min() and as_unit.max() <= 1
    ref = ref_jitter_batch(x, ColorJitter(**kwargs).draw(N, gen(5)))
    np.testing.assert_allclose(as_unit.numpy(), ref, atol=1e-5)
    assert (as_unit * 255 - as_uint8.float()).abs().max() <= 0.5 + 1e-3
    assert torch.allclose(unnormalise(as_norm), as_unit, atol=1e-5)


def test_color_jitter_sample_equals_batch_of_one_and_rows_of_a_batch():
    cj, x = ColorJitter(**JITTERS["all"]), images()
    sample = {"image": x[2], "label": 7, "index": 42}
    out = cj(sample, gen(11))
    assert out["label"] == 7 and out["index"] == 42 and out["image"].shape == (3, H, W)
    assert torch.equal(out["image"], cj((x[2:3], torch.zeros(1)), gen(11))[0][0])
    # Row k of a batch is the sample transform given the batch's k-th draw.
    params = cj.draw(N, gen(12))
    batch, _ = cj((x, torch.arange(N)), gen(12))
    for k in range(N):
        row = type(params)(*(getattr(params, f)[k:k + 1] for f in ("brightness", "contrast",
                                                                    "saturation", "hue")))
        assert torch.equal(batch[k], cj.apply(x[k:k + 1], row)[0])


def test_color_jitter_leaves_the_callers_float_tensor_alone():
    x = torch.full((1, 3, 2, 2), 1.5)
    out, _ = ColorJitter()((x, torch.zeros(1)), gen(0))
    assert torch.equal(x, torch.full((1, 3, 2, 2), 1.5))
    assert torch.equal(out, torch.ones(1, 3, 2, 2))


# --- RandomGrayscale -----------------------------------------------------------------------------

def test_grayscale_p1_uint8_is_pils_L_and_p0_is_identity():
    x = images(seed=1)
    out, _ = RandomGrayscale(p=1.0)((x, torch.arange(N)), gen(0))
    assert out.dtype == torch.uint8 and torch.equal(out, ref_pil_gray(x))
    sample = RandomGrayscale(p=1.0)({"image": x[0], "label": 0, "index": 0}, gen(0))
    assert torch.equal(sample["image"], ref_pil_gray(x[:1])[0])
    same, _ = RandomGrayscale(p=0.0)((x, torch.arange(N)), gen(0))
    assert torch.equal(same, x)


def test_grayscale_pil_rounding_on_every_channel_value():
    # All 256 levels in each channel against PIL's integer conversion.
    levels = torch.arange(256, dtype=torch.uint8)
    x = torch.stack([levels, levels.roll(85), levels.roll(170)]).view(1, 3, 16, 16)
    assert torch.equal(RandomGrayscale(p=1.0)((x, None), gen(0))[0], ref_pil_gray(x))


def test_grayscale_picks_images_by_its_draw_and_float_paths_agree():
    x, gray_rg = images(seed=2, n=32), RandomGrayscale(p=0.5)
    picked = gray_rg.draw(32, gen(4))
    assert 0 < picked.sum() < 32
    out, _ = gray_rg((x, torch.arange(32)), gen(4))
    for k in range(32):
        assert torch.equal(out[k], ref_pil_gray(x[k:k + 1])[0] if picked[k] else x[k])
    unit = x.double().numpy() / 255
    ref = np.array([[[[gray(*unit[k, :, i, j]) if picked[k] else unit[k, c, i, j]
                       for j in range(W)] for i in range(H)] for c in range(3)] for k in range(32)])
    as_unit, _ = gray_rg((x.float() / 255, None), gen(4))
    np.testing.assert_allclose(as_unit.numpy(), ref, atol=1e-6)
    as_norm, _ = RandomGrayscale(p=0.5, mean=MEAN, std=STD)((normalise(x), None), gen(4))
    np.testing.assert_allclose(unnormalise(as_norm).numpy(), ref, atol=1e-5)


# --- Mixup and CutMix ----------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, cdf", [
    (0.5, lambda v: 2 / math.pi * np.arcsin(np.sqrt(v))),  # shape < 1: the boosted Gamma draw
    (1.0, lambda v: v),
    (2.0, lambda v: 3 * v**2 - 2 * v**3),
])
def test_lam_follows_beta_alpha_alpha(alpha, cdf):
    g = gen(0)
    lams = np.sort([float(_beta(alpha, g)) for _ in range(1500)])
    ks = np.max(np.abs(np.arange(1, len(lams) + 1) / len(lams) - cdf(lams)))
    assert ks < 1.95 / math.sqrt(len(lams))  # Kolmogorov-Smirnov at the 0.1% level


def test_mixup_matches_per_pixel_reference():
    mixup, x = Mixup(alpha=0.4, num_classes=5), normalise(images(seed=3))
    labels = torch.tensor([0, 4, 2, 2])
    params = mixup.draw(N, gen(8))
    out, soft = mixup((x, labels), gen(8))
    lam, perm = float(params.lam), params.perm.tolist()
    assert 0 < lam < 1 and sorted(perm) == list(range(N)) and perm != list(range(N))
    xs = x.double().numpy()
    ref = np.array([[[[lam * xs[k, c, i, j] + (1 - lam) * xs[perm[k], c, i, j] for j in range(W)]
                      for i in range(H)] for c in range(3)] for k in range(N)])
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-5)
    hot = onehot_rows(labels.tolist(), 5)
    ref_soft = [[lam * hot[k][c] + (1 - lam) * hot[perm[k]][c] for c in range(5)] for k in range(N)]
    assert soft.dtype == torch.float32 and soft.shape == (N, 5)
    np.testing.assert_allclose(soft.numpy(), ref_soft, atol=1e-6)
    np.testing.assert_allclose(soft.sum(1).numpy(), 1.0, atol=1e-6)


@pytest.mark.parametrize("seed", range(20))
def test_cutmix_matches_per_pixel_reference(seed):
    cutmix, x = CutMix(alpha=1.0, num_classes=3), images(seed=seed)
    labels = torch.tensor([0, 1, 2, 1])
    params = cutmix.draw(N, H, W, gen(seed))
    out, soft = cutmix((x, labels), gen(seed))
    cy, cx = params.center.tolist()
    assert 0 <= cy < H and 0 <= cx < W
    top, left, bottom, right = ref_box(float(params.drawn_lam), cy, cx, H, W)
    assert params.box.tolist() == [top, left, bottom, right]
    area = (bottom - top) * (right - left)
    lam, perm = 1 - area / (H * W), params.perm.tolist()
    assert float(params.lam) == pytest.approx(lam, abs=1e-12)
    ref = x.clone()
    for k in range(N):
        for c in range(3):
            for i in range(H):
                for j in range(W):
                    if top <= i < bottom and left <= j < right:
                        ref[k, c, i, j] = x[perm[k], c, i, j]
    assert out.dtype == torch.uint8 and torch.equal(out, ref)
    hot = onehot_rows(labels.tolist(), 3)
    ref_soft = [[lam * hot[k][c] + (1 - lam) * hot[perm[k]][c] for c in range(3)] for k in range(N)]
    np.testing.assert_allclose(soft.numpy(), ref_soft, atol=1e-6)
    np.testing.assert_allclose(soft.sum(1).numpy(), 1.0, atol=1e-6)


def test_cutmix_on_float_and_soft_labels_from_mixup():
    x, labels = normalise(images()), torch.tensor([0, 1, 2, 3])
    both = Compose(Mixup(num_classes=4), CutMix(num_classes=4))
    out, soft = both((x, labels), gen(6))
    g = gen(6)
    step = Mixup(num_classes=4)((x, labels), g)
    expected = CutMix(num_classes=4)(step, g)
    assert torch.equal(out, expected[0]) and torch.equal(soft, expected[1])
    assert out.dtype == torch.float32 and soft.shape == (N, 4)
    np.testing.assert_allclose(soft.sum(1).numpy(), 1.0, atol=1e-6)


# --- reproducibility, composition, errors --------------------------------------------------------

def everything() -> Compose:
    return Compose(RandomGrayscale(p=0.5, mean=MEAN, std=STD),
                   ColorJitter(**JITTERS["all"], mean=MEAN, std=STD),
                   Mixup(num_classes=3), CutMix(num_classes=3))


def test_same_seed_same_batch_other_seed_other_batch():
    batch = (normalise(images(n=8)), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    first, again, other = (everything()(batch, gen(s)) for s in (1, 1, 2))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0]) and not torch.equal(first[1], other[1])
    sample = {"image": images()[0], "label": 1, "index": 0}
    jitter = Compose(RandomGrayscale(p=0.5), ColorJitter(**JITTERS["all"]))
    assert torch.equal(jitter(sample, gen(1))["image"], jitter(sample, gen(1))["image"])
    assert not torch.equal(jitter(sample, gen(1))["image"], jitter(sample, gen(2))["image"])


def test_extra_batch_fields_pass_through():
    x = normalise(images())
    for t in everything().transforms:
        out = t((x, torch.arange(N) % 3, "paths"), gen(0))
        assert len(out) == 3 and out[2] == "paths"


@pytest.mark.parametrize("make, message", [
    (lambda: ColorJitter(brightness=-0.1), "brightness must be non-negative"),
    (lambda: ColorJitter(contrast=(1.2, 0.8)), r"contrast as \(min, max\)"),
    (lambda: ColorJitter(saturation=float("nan")), "saturation"),
    (lambda: ColorJitter(hue=0.6), r"hue must be in \[0, 0.5\]"),
    (lambda: ColorJitter(hue=(-0.7, 0.1)), r"hue as \(min, max\)"),
    (lambda: ColorJitter(brightness="a lot"), "brightness must be a number"),
    (lambda: ColorJitter(mean=MEAN), "mean and std go together"),
    (lambda: ColorJitter(mean=MEAN[:2], std=STD[:2]), "3 values"),
    (lambda: RandomGrayscale(p=1.5), r"p must be a probability"),
    (lambda: RandomGrayscale(mean=MEAN, std=(0.2, 0.0, 0.2)), "std must be positive"),
    (lambda: Mixup(alpha=0, num_classes=3), "Mixup: alpha must be positive"),
    (lambda: CutMix(num_classes=0), "CutMix: num_classes must be a positive int"),
])
def test_bad_arguments_say_which(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_misuse_raises_clear_errors():
    sample = {"image": images()[0], "label": 0, "index": 0}
    for t in (Mixup(num_classes=3), CutMix(num_classes=3)):
        with pytest.raises(TypeError, match="is a batch transform: pass it as DataLoader"):
            t(sample, gen(0))
    with pytest.raises(TypeError, match="give the DataLoader mean= and std="):
        Mixup(num_classes=3)((images(), torch.zeros(N, dtype=torch.long)), gen(0))
    with pytest.raises(ValueError, match=r"soft labels \(N×3\)"):
        CutMix(num_classes=3)((images(), torch.zeros(N, 5)), gen(0))
    with pytest.raises(TypeError, match="expected a sample dict"):
        ColorJitter(brightness=0.2)("not an image", gen(0))
    with pytest.raises(ValueError, match="N×3×H×W"):
        RandomGrayscale()((images()[0], None), gen(0))
    with pytest.raises(TypeError, match="transform 1 is not callable"):
        Compose(RandomGrayscale(), "jitter")


# --- CUDA ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)")
def test_cuda_results_equal_cpu_results_given_the_same_draws():
    x, labels = images(n=8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    xc, lc = x.cuda(), labels.cuda()
    for cj in (ColorJitter(**JITTERS["all"]), ColorJitter(**JITTERS["all"], mean=MEAN, std=STD)):
        data = x if cj.norm is None else normalise(x)
        params = cj.draw(8, gen(0, "cuda"))
        assert params.hue.device.type == "cuda"
        on_gpu = cj.apply(data.cuda(), params).cpu()
        assert torch.equal(on_gpu, cj((data.cuda(), lc), gen(0, "cuda"))[0].cpu())
        atol = 1 if data.dtype == torch.uint8 else 1e-5
        assert (on_gpu.double() - cj.apply(data, params.to("cpu")).double()).abs().max() <= atol
    gray_rg = RandomGrayscale(p=0.5)
    picked = gray_rg.draw(8, gen(0, "cuda"))
    assert torch.equal(gray_rg.apply(xc, picked).cpu(), gray_rg.apply(x, picked.cpu()))
    cutmix = CutMix(num_classes=3)
    params = cutmix.draw(8, H, W, gen(0, "cuda"))
    cpu_params = type(params)(*(t.cpu() for t in (params.drawn_lam, params.perm, params.center,
                                                    params.box, params.lam)))
    for got, want in zip(cutmix.apply(xc, lc, params), cutmix.apply(x, labels, cpu_params)):
        assert torch.allclose(got.cpu().double(), want.double())
    mixup = Mixup(num_classes=3)
    params = mixup.draw(8, gen(0, "cuda"))
    mixed = mixup.apply(normalise(x).cuda(), lc, params)
    want = mixup.apply(normalise(x), labels, type(params)(params.lam.cpu(), params.perm.cpu()))
    for got, ref in zip(mixed, want):
        assert torch.allclose(got.cpu(), ref, atol=1e-6)
