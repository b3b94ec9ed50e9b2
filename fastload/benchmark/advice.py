"""What to change, once the verdict has named the bottleneck: concrete advice, most effective first."""

from __future__ import annotations

from fastload.benchmark.capacity import StageLike, parallel_of
from fastload.benchmark.evidence import Evidence
from fastload.benchmark.explain import SHARED_SLOWDOWN, ms, slowed
from fastload.benchmark.pixel_row import pixel_cache_advice

MODEL_ADVICE = [
    "the loader is not the problem: a faster one would not speed up training",
    "speed up the step itself: mixed precision, channels_last, torch.compile, a larger batch per GPU",
]


def model_advice(e: Evidence) -> list[str]:
    """The step bounds training; if the loader's work slows the step, that is the loader's cost."""
    times = slowed(e)
    if times is None or times < SHARED_SLOWDOWN:
        return list(MODEL_ADVICE)
    gpu = gpu_decode_advice(e)
    return [f"the loop does not wait for data, but the step runs {times:.1f}x slower beside the loader "
            "than alone: the loader's decode competes with it for the CPU and the GIL",
            "leave the step cores: fewer loader workers or decode threads (num_workers=, or "
            "PackedDataset(decode_threads=)), or worker processes rather than threads"
            + (f"; or {gpu[0].lower()}{gpu[1:]}" if gpu else ""),
            MODEL_ADVICE[1]]


def more_workers(e: Evidence) -> str | None:
    cpu_par = max((parallel_of(s, e.cores) for s in e.stages if s.kind == "cpu"), default=1)
    return (f"use every core: num_workers={e.cores} (this loader runs {cpu_par} at a time)"
            if cpu_par < e.cores else None)


def advice(e: Evidence, group: str, worst: StageLike) -> list[str]:
    out: list[str | None]
    if group == "io" and e.store_bound:
        out = store_advice(e)
    elif group == "io":
        out = ["pack the files into shards: `fastload pack SRC`, then `fastload bench SRC --packed "
               "SRC.fl` shows the gain (one large file instead of an open/read/close per sample)"
               if e.source == "folder" else
               "re-pack smaller (`fastload pack SRC --max-side 500`): fewer bytes to read per sample",
               "put the data on a local disk (local NVMe, or enough RAM for the page cache) rather than "
               f"a network share: a read costs {ms(worst.seconds_per_sample)} here",
               "keep more reads in flight: more loader workers than cores help, since reads wait on "
               f"the disk, not the CPU (now {parallel_of(worst, e.cores)} at a time)"]
    elif group == "transfer":
        out = [None if e.pinned else "pin_memory=True: pinned pages copy asynchronously and faster",
               "ship uint8 and normalise on the GPU: fastload.DataLoader(..., device='cuda', mean=..., "
               "std=...) copies 4× fewer bytes than float32",
               "copy on a side stream one batch ahead (fastload.DataLoader(device='cuda'))"]
    elif worst.name.startswith("decode"):
        out = [more_workers(e), None if e.reduced_decode else reduced_advice(e),
               pixel_cache_advice(e.pixel_cache),
               "pre-resize at pack time: `fastload pack SRC --max-side 320` (smaller JPEGs decode faster; "
               "lossy, recorded in the manifest)",
               gpu_decode_advice(e)]
    else:
        out = [more_workers(e),
               f"{worst.name} costs {ms(worst.seconds_per_sample)} per sample: make it cheaper, or run "
               "augmentations on the GPU on uint8 batches"]
    return [a for a in out if a]


def gpu_decode_advice(e: Evidence) -> str | None:
    """GPU decode, where there is a GPU: nvImageCodec's when it imports here, else DALI's."""
    if not e.cuda:
        return None
    if e.nvimgcodec_installed:
        return ("decode on the GPU: fastload.DataLoader(..., backend='nvimgcodec', device='cuda') (the "
                "hardware JPEG engines where the GPU has them; same batches, order and labels)")
    return ("decode on the GPU with DALI: fastload.DataLoader(..., backend='dali')"
            + ("" if e.dali_installed else " (pip install nvidia-dali-cuda120)"))


def store_advice(e: Evidence) -> list[str | None]:
    """Far storage: what fixes reads that wait on round trips, or on the store's bandwidth."""
    from fastload.config import format_size

    wait = ms(e.store_latency_s or 0.0)
    room = f"cache_limit='{format_size(e.dataset_bytes * 1.1)}'" if e.dataset_bytes else "cache_limit="
    holds = e.cached and e.cache_limit is not None and e.dataset_bytes is not None and e.cache_limit >= e.dataset_bytes
    cache = None if holds else (f"give the node cache room for the whole dataset (PackedDataset(url, {room})): "
                                "epochs after the first read the local disk, not the store")
    if e.source == "folder":
        return [f"pack the objects into shards in the store: `fastload pack SRC -o SRC.fl`; a batch's "
                f"records then come in one round of ranged GETs (4 MiB pieces with the node cache) "
                f"instead of a {wait} round trip per object", cache,
                "until then, more requests in flight: more loader workers than cores (they wait on the "
                "network, not the CPU)" if e.store_bound == "latency" else None]
    if e.store_bound == "latency":
        return [None if e.cached else "turn the node cache on (the default: cache_limit=0 turns it off): "
                "records then come in 4 MiB pieces, dozens a request, not one round trip each",
                cache, f"run next to the store (same region or zone): a request waits {wait} here"]
    return [cache,  # (None when the cache holds the dataset already)
            f"the store delivers {e.store_mb_s or 0:.0f} MB/s here: re-pack smaller (`fastload pack SRC "
            "--max-side 500`) to move fewer bytes a sample",
            "run next to the store (same region or zone) or on a faster network"]


def reduced_advice(e: Evidence) -> str | None:
    text = ("decode at reduced scale: fastload.PackedDataset(path, image_size=224, train=True) lets libjpeg "
            "decode at 1/2–1/8 scale whenever the crop allows (pack first: `fastload pack SRC`)")
    if e.reduced_decode_s is None:
        return text
    now = sum(s.seconds_per_sample for s in e.stages
              if s.kind == "cpu" and (s.name.startswith("decode") or s.name == "transform"))
    if e.reduced_decode_s >= 0.9 * now:
        return None  # measured: these images are too small for a reduced decode to pay
    return text + f"; measured here: {ms(e.reduced_decode_s)} per sample against {ms(now)} now"
