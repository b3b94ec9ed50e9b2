"""Where an EpochSampler loader is, as ``state_dict()`` saves it, and the resume from such a state."""

from __future__ import annotations

from typing import Any

from fastload.sampling.epoch_sampler import EpochSampler


def epoch_state(sampler: EpochSampler, progress: dict[str, Any]) -> dict[str, Any]:
    """The loader's state: ``progress`` is its running iteration's (epoch, start, delivered,
    consumed), empty before the first or after ``set_epoch()``/``load_state_dict()`` chose the next."""
    if "epoch" in progress and not sampler.pinned:
        epoch, position = progress["epoch"], progress["start"] + progress["delivered"]
        consumed = progress["consumed"]
    else:  # no iteration yet, or set_epoch()/load_state_dict() chose the next one
        epoch, position = sampler.upcoming()
        consumed = sampler.consumed if epoch == sampler.epoch else 0
    state = {"epoch": epoch, "position": position, "consumed": consumed, "seed": sampler.seed,
             "num_samples": sampler.num_samples, "world_size": sampler.world_size,
             "rank": sampler.rank, "shuffle": sampler.shuffle, "drop_last": sampler.drop_last}
    if sampler.mix is not None:  # a MixedDataset's sources and counts
        state["mix"] = sampler.mix.signature()
    return state


def resume_epoch(sampler: EpochSampler, state: dict[str, Any]) -> None:
    """Point ``sampler`` at the first sample a loader saved as ``state`` had not delivered; the
    same dataset and settings are checked (any rank's state serves, on any number of ranks)."""
    if "seed" in state and not sampler.seed_given:
        sampler.seed = state["seed"]  # drawn from torch's RNG when saved: resume that run's order
    mix = None if sampler.mix is None else sampler.mix.signature()
    if state.get("mix") != mix:
        raise ValueError(f"load_state_dict: the state was saved from the mix {state.get('mix')} but this "
                         f"loader's is {mix}; resume with the same sources and shares")
    for name in ("seed", "num_samples", "shuffle", "drop_last"):
        if name in state and state[name] != getattr(sampler, name):
            raise ValueError(f"load_state_dict: the state has {name}={state[name]!r} but this loader "
                             f"has {getattr(sampler, name)!r}; resume with the same dataset and settings")
    epoch, position, consumed = int(state["epoch"]), int(state["position"]), int(state.get("consumed", 0))
    saved_world = int(state.get("world_size", sampler.world_size))
    if saved_world != sampler.world_size:  # elastic: from a prefix of the global order
        consumed, position = min(consumed + position * saved_world, sampler.num_samples), 0
    sampler.resume(epoch, 0, consumed)
    if position == len(sampler.share()):
        sampler.resume(epoch + 1, 0)  # that epoch was complete
    else:
        sampler.resume(epoch, position, consumed)
