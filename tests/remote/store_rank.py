"""One torchrun rank of the far-storage test (test_remote_ranks.py): read a dataset in an object
store for some epochs, phase after phase, and write the record ids it got. Each rank talks to the
store through a proxy of its own, so the test can tell the ranks' requests apart; a marker request
through that proxy separates the epochs in its log. A phase may leave a rank out of an epoch."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import torch.distributed as dist

import fastload


def mark(endpoint: str, name: str) -> None:
    """A request the proxy logs between the rank's epochs (the store answers it with a 404)."""
    try:
        with urllib.request.urlopen(f"{endpoint}/fastload-marker/{name}", timeout=10) as response:
            response.read()
    except urllib.error.HTTPError:
        pass


def settle(dataset: fastload.PackedDataset) -> None:
    """Wait for this process's cache filler: the epoch's requests are then all in the log."""
    filler = getattr(dataset.reader.remote, "_filler", None)
    if filler is not None:
        filler.join(timeout=60)
        if filler.is_alive():
            raise RuntimeError("the cache filler was still fetching after 60 s")


def run_phase(phase: dict, config: dict, rank: int) -> list[list[int]]:
    options = phase["storage_options"][rank]
    endpoint = options["endpoint_url"]
    dataset = fastload.PackedDataset(config["url"], storage_options=options, image_size=16,
                                     train=False, cache_dir=phase["cache_dirs"][rank],
                                     cache_limit=phase["cache_limit"])
    if phase["open_shards_first"]:  # each shard's B-tree walked before the counted epochs
        for shard in range(len(dataset.manifest.shards)):
            dataset.reader.handle(shard)
    loader = fastload.DataLoader(dataset, batch_size=config["batch_size"], shuffle=True,
                                 num_workers=0, seed=config["seed"])
    sampler, world = loader.epoch_sampler, dist.get_world_size()
    if sampler is None or (sampler.rank, sampler.world_size) != (rank, world):
        raise RuntimeError(f"rank {rank}: the loader is not sharded over the {world} ranks")
    epochs = []
    for epoch, readers in enumerate(phase["readers"]):
        dist.barrier()  # the other rank's epoch (and fill) is over too
        mark(endpoint, f"epoch-{epoch}")
        loader.set_epoch(epoch)
        read = rank in readers  # else this rank waits for the others at the next barrier
        epochs.append([i for _, labels in loader for i in labels.tolist()] if read else [])
        settle(dataset)
    dist.barrier()
    mark(endpoint, "end")
    return epochs


def main(config_file: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(config_file) as f:
        config = json.load(f)
    got = {phase["name"]: run_phase(phase, config, rank) for phase in config["phases"]}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(got, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
