"""The machine's load while a measurement runs: how much of the CPU went to anyone else.

``bench``, ``doctor`` and ``tune`` watch the CPUs this process may run on from start to end:
the busy time in ``/proc/stat`` (theirs), less the CPU time of this process and every process
it started (``/proc/self`` and its descendants, and the children it reaped), is what other
processes used; ``steal`` is what the hypervisor gave to other machines. With the load average
against the cores, it says whether the numbers were measured on a busy machine. Linux only:
elsewhere nothing is measured (``None``).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BUSY_SHARE = 0.25
"""Others (other processes, or the hypervisor's steal) using this share of our cores or more
during a measurement make the machine busy: the numbers then move from run to run."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class MachineLoad:
    """What else ran on this process's cores during a measurement.

    Attributes:
        cores: the CPUs this process may run on (those watched).
        seconds: how long it was watched.
        others_cores: cores' worth of CPU other processes used on them, on average.
        steal_cores: cores' worth stolen by the hypervisor (a virtual machine's neighbours).
        own_cores: cores' worth this process and the processes it started used.
        load_average: the 1-minute load average at the end (the whole machine's run queue).
        machine_cores: the CPUs the load average is of (every CPU of the machine).
    """

    cores: int
    seconds: float
    others_cores: float
    steal_cores: float
    own_cores: float
    load_average: float
    machine_cores: int

    @property
    def busy(self) -> bool:
        return self.others_cores + self.steal_cores >= BUSY_SHARE * self.cores

    def others(self) -> str:
        """``other processes used 1.2 of the 2 cores this ran on (60%)``, and the steal if any."""
        stolen = f", {self.steal_cores / self.cores:.0%} stolen by the hypervisor" if self.steal_cores >= 0.005 else ""
        return (f"other processes used {self.others_cores:.1f} of the {self.cores} cores this ran on "
                f"({self.others_cores / self.cores:.0%}){stolen}")

    def __str__(self) -> str:
        return f"machine load: {self.text()}"

    def text(self) -> str:
        """What else ran, the load average, and whether that makes the machine busy."""
        text = (f"{self.others()} during the {self.seconds:.0f} s measured; load average "
                f"{self.load_average:.1f} on {self.machine_cores} cores")
        if self.busy:
            text += ": a busy machine, so the numbers move from run to run; rerun on a quiet machine"
        return text

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "busy": self.busy}


class LoadWatch:
    """``watch = LoadWatch()`` at the start, ``watch.stop()`` at the end → :class:`MachineLoad`
    (None where ``/proc`` is not there to read)."""

    def __init__(self) -> None:
        self.cpus = _cpus()
        self.started = time.perf_counter()
        self.stat = _cpu_ticks(self.cpus)
        self.own = own_cpu_seconds()

    def stop(self) -> MachineLoad | None:
        stat, own = _cpu_ticks(self.cpus), own_cpu_seconds()
        seconds = time.perf_counter() - self.started
        if stat is None or self.stat is None or own is None or self.own is None or seconds <= 0:
            return None
        busy, steal = (stat[0] - self.stat[0]) / _TICK, (stat[1] - self.stat[1]) / _TICK
        mine = own - self.own
        return MachineLoad(cores=len(self.cpus), seconds=seconds,
                           others_cores=max(0.0, busy - mine) / seconds, steal_cores=max(0.0, steal) / seconds,
                           own_cores=mine / seconds, load_average=_load_average(),
                           machine_cores=os.cpu_count() or len(self.cpus))


def _cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def _cpu_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """Busy ticks (user, nice, system, irq, softirq; guest time is inside user) and steal ticks,
    summed over ``cpus``, from /proc/stat."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = steal = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()]
        busy += v[0] + v[1] + v[2] + v[5] + v[6]
        steal += v[7] if len(v) > 7 else 0
    return busy, steal


def own_cpu_seconds() -> float | None:
    """CPU seconds used so far by this process, the processes it started that still run (and
    theirs), and the children it has reaped (as the kernel sums them for ``os.times``)."""
    if not Path("/proc/self/stat").exists():
        return None
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    return total + sum(_stat_seconds(pid) for pid in descendants(os.getpid()))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...), from /proc."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(p) for p in task.read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _stat_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and cutime + cstime of the children it reaped (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK  # fields 14-17 of proc(5), after pid and comm


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0
