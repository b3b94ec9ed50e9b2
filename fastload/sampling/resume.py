"""Resume for any sampler: what decided a pass's order, and how many of its items were delivered.

torch's DataLoader draws each pass from its index sampler (the batch sampler, or the sampler when
it does not batch). :class:`ResumableSampler` wraps that sampler. Torch's own samplers hold no
position, so a pass is saved as what decided its order (the state of every ``torch.Generator`` the
samplers hold, torch's global RNG, the ``epoch`` of samplers with ``set_epoch``) and the number of
items delivered; a resume draws that order again, with the user's global RNG left as it was, and
drops what was delivered without loading any data. A sampler with ``state_dict()`` /
``load_state_dict()`` is trusted instead, as torchdata's StatefulDataLoader trusts it: its
``state_dict()`` right after it yielded the last delivered item is saved, ``load_state_dict()``
must make its next ``__iter__`` yield the rest of that pass (a new pass when it was complete), and
nothing is skipped.

Counting delivered items is exact with any ``num_workers``, also changed between save and load,
as long as batches arrive in sampler order (``in_order=True``, torch's default).
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from fastload.sampling.sampler_state import (
    decide,
    generators_of,
    global_rng,
    is_stateful,
    length_of,
    samplers_of,
)

_NOTHING = object()


class ResumableSampler:
    """A loader's index sampler whose pass in progress can be saved and resumed.

    Args:
        base: the sampler or batch sampler torch's iterators would draw from.
        lookahead: how many items a stateful sampler may be read ahead of delivery (workers and
            prefetching read ahead) for its state at delivery to still be known.
    """

    def __init__(self, base: Any, *, lookahead: int = 1024) -> None:
        self.base = base
        self.lookahead = lookahead
        self._samplers = samplers_of(base)
        self._stateful = next((s for s in self._samplers if is_stateful(s)), None)
        self._pass: _Pass | None = None  # the pass begun last
        self._pending: dict[str, Any] | None = None  # what the next pass restores, from load()

    def __getstate__(self) -> dict[str, Any]:
        # A pass in progress belongs to the iterator drawing it (a live iterator and a lock): a
        # pickled or copied loader draws its next pass anew, as the original's next iter() does.
        return {**self.__dict__, "_pass": None}

    @property
    def kind(self) -> str:
        """``"stateful"`` (the sampler saves itself) or ``"replay"`` (its order is drawn again)."""
        return "replay" if self._stateful is None else "stateful"

    def __iter__(self) -> Iterator[Any]:
        # A pending resume is used up by the first pass that draws: torch's multi-process iterator
        # calls iter() twice as it starts, and draws from the second.
        self._pass = _Pass(self, self._pending)
        return self._pass

    def __len__(self) -> int:
        """Items of a whole pass, as torch's ``len(sampler)``: a resumed pass yields only the rest,
        and trainers that resume count the items they ran before the checkpoint themselves."""
        return len(self.base)

    def state(self, delivered: int) -> dict[str, Any]:
        """The pass in progress and the ``delivered`` items of it the loader handed out.

        Plain values (RNG states as base64 text), except what a stateful sampler's own
        ``state_dict()`` holds. ``"pass": None`` when no pass has begun.
        """
        state: dict[str, Any] = {"kind": self.kind, "samplers": self._names(), "pass": None}
        running = self._pass
        if self._pending is not None:  # loaded, and not begun yet: still the saved pass
            pending = self._pending
            state["pass"] = {"length": pending["length"], "delivered": pending["skip"],
                             "complete": False, "at_iter": pending["at_iter"],
                             "at_first": pending["at_first"]}
        elif self._stateful is not None:
            state["pass"] = {"sampler": self._stateful.state_dict() if running is None
                             else running.snapshot(delivered)}
        elif running is not None:
            draws = running.draws()  # the order is decided now if the first item was not drawn yet
            done = running.skip + delivered
            length = length_of(self.base)
            if delivered < 0 or (length is not None and done > length):
                raise ValueError(f"state: delivered={delivered} with {running.skip} skipped is not "
                                 f"within this pass of {length} items; count the batches the "
                                 "loader handed out")
            complete = ((length is not None and done == length)
                        or (running.exhausted and delivered >= running.pulled))
            state["pass"] = {"length": length, "delivered": done, "complete": complete, **draws}
        return state

    def load(self, state: dict[str, Any]) -> None:
        """Make the next pass resume the saved one: the rest of it, or the pass after a complete one."""
        kind, names = state.get("kind"), state.get("samplers")
        if kind != self.kind or names != self._names():
            raise ValueError(f"load: the state was saved from {names} ({kind}); this loader samples "
                             f"with {self._names()} ({self.kind}); resume with the same sampler")
        saved, self._pending, self._pass = state.get("pass"), None, None
        if saved is None:
            return  # saved before any pass began: the next one is a fresh one
        if self._stateful is not None:
            self._stateful.load_state_dict(saved["sampler"])
            return
        length = length_of(self.base)
        if saved["length"] != length:
            raise ValueError(f"load: the saved pass has {saved['length']} items, this sampler's has "
                             f"{length}; resume with the same dataset and sampler settings")
        found, used = len(saved["at_iter"]["generators"]), len(generators_of(self._samplers))
        if found != used:
            raise ValueError(f"load: the state holds {found} generator states, this sampler uses "
                             f"{used}; resume with the same sampler (and its generator=...)")
        if saved["complete"]:  # generators go where that pass left them: the next pass follows it
            deque(_Pass(self, {**saved, "skip": 0}), maxlen=0)
        else:
            self._pending = {**saved, "skip": int(saved["delivered"])}

    def _names(self) -> list[str]:
        return [type(s).__name__ for s in self._samplers]


class _Pass:
    """One pass of the base sampler: what decided its order, and its items as they are drawn."""

    def __init__(self, owner: ResumableSampler, restore: dict[str, Any] | None) -> None:
        self._owner, self._restore = owner, restore
        self.skip = 0 if restore is None else restore["skip"]
        self.pulled, self.exhausted = 0, False
        self._lock = threading.Lock()  # a prefetch thread may draw while the loop saves a state
        self._snapshots: deque[tuple[int, Any]] = deque(maxlen=owner.lookahead + 1)
        self._first: Any = _NOTHING
        self._drawn = False
        samplers = owner._samplers
        self._at_iter = decide(samplers, None if restore is None else restore["at_iter"])
        with global_rng(self._at_iter, restore is not None):
            self._it = iter(owner.base)  # DistributedSampler draws here, RandomSampler at next()
        self._at_first: dict[str, Any] | None = None
        if owner._stateful is not None:
            self._snapshots.append((0, copy.deepcopy(owner._stateful.state_dict())))

    def draws(self) -> dict[str, Any]:
        """What decided this pass's order, drawing its first item now if that has not happened."""
        with self._lock:
            self._draw_first()
        return {"at_iter": self._at_iter, "at_first": self._at_first}

    def snapshot(self, delivered: int) -> Any:
        """A stateful sampler's state right after it yielded this pass's ``delivered``-th item."""
        with self._lock:
            for position, state in self._snapshots:
                if position == delivered:
                    return copy.deepcopy(state)
        raise ValueError(f"state: delivered={delivered}, but the sampler's states kept cover items "
                         f"{self._snapshots[0][0]}..{self._snapshots[-1][0]}; more than lookahead="
                         f"{self._owner.lookahead} items were read ahead, raise it")

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> Any:
        with self._lock:
            self._draw_first()
            if self._first is not _NOTHING:
                item, self._first = self._first, _NOTHING
            else:
                item = next(self._it, _NOTHING)
            if item is _NOTHING:
                self.exhausted = True
                raise StopIteration
            self.pulled += 1
            if self._owner._stateful is not None:
                state = copy.deepcopy(self._owner._stateful.state_dict())
                self._snapshots.append((self.pulled, state))
            return item

    def _draw_first(self) -> None:
        # The first item is where lazy samplers (RandomSampler, SubsetRandomSampler, ...) draw the
        # order; on a resume, the items already delivered are dropped right after it.
        if self._drawn:
            return
        self._drawn = True
        restore = self._restore
        if restore is not None and self._owner._pending is restore:
            self._owner._pending = None
        samplers = self._owner._samplers
        self._at_first = decide(samplers, None if restore is None else restore["at_first"])
        with global_rng(self._at_first, restore is not None):
            self._first = next(self._it, _NOTHING)
            for _ in range(self.skip):
                if self._first is _NOTHING:
                    break
                self._first = next(self._it, _NOTHING)
