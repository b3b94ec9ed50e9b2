"""One torchrun rank of the elastic-resume test: read part of an epoch and save the state, or
load a state saved on another number of ranks and read the rest. Writes what it delivered."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

import fastload


def main(dataset: str, phase: str, batches: int, state_file: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = fastload.DataLoader(fastload.PackedDataset(dataset, image_size=16, train=True), batch_size=2, shuffle=True,
                                 drop_last=True, num_workers=0, seed=7)
    assert loader.epoch_sampler.world_size == dist.get_world_size()
    if phase == "resume":
        with open(state_file) as f:
            loader.load_state_dict(json.load(f))
    delivered, it = [], iter(loader)
    for _ in range(batches) if phase == "save" else iter(int, 1):  # save: k batches; resume: the rest
        try:
            delivered += next(it)[1].tolist()
        except StopIteration:
            break
    if phase == "save" and rank == 0:
        with open(state_file, "w") as f:
            json.dump(loader.state_dict(), f)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(delivered, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
