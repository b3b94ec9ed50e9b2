"""tune's choice as a pure function: made-up runs → the settings it may pick, or auto's and why."""

from __future__ import annotations

from fastload.loading.settings import LoaderSettings
from fastload.loading.tune_choice import Measured, choose

MAIN = LoaderSettings(0, None, False, "main", 0)
THREADS = LoaderSettings(0, None, False, "threads", 2)  # auto's on 2 cores
ONE = LoaderSettings(1, 2, False, "processes", 0)
TWO = LoaderSettings(2, 4, False, "processes", 0)


def grid(**rates: list[float]) -> list[Measured]:
    settings = {"main": MAIN, "threads": THREADS, "one": ONE, "two": TWO}
    return [Measured(settings[name], {"name": name}, runs) for name, runs in rates.items()]


def test_a_candidate_every_run_of_which_beat_every_other_run_is_chosen():
    choice = choose(grid(threads=[400, 420, 410], one=[300, 310, 305], two=[600, 640, 620]), THREADS)
    assert choice.measured is not None and choice.measured.settings == TWO
    assert choice.why == ("processes/2w/pf4: every run of it faster than every run of the next fastest, "
                          "threads/0w/pfNone")


def test_runs_that_overlap_choose_nothing_and_keep_auto():
    """A tune that measured threads at 161/s one run and 958/s the next picked 2 processes."""
    choice = choose(grid(threads=[161, 958, 500], one=[300, 700, 400], two=[520, 610, 580]), THREADS)
    assert choice.measured is None
    assert choice.why.startswith("kept auto's settings (threads/0w/pfNone): ") and "overlap run for run" in choice.why
    # auto measured clearly slower than two that overlap each other: either beats it, the tie is said
    tie = choose(grid(threads=[100, 110, 105], one=[300, 390, 350], two=[320, 400, 380]), THREADS)
    assert tie.measured is not None and tie.measured.settings == TWO
    assert "too noisy to choose between them" in tie.why and "every run of each beat every run of auto's" in tie.why
    # auto not in the grid: too noisy, auto's kept
    unknown = choose(grid(one=[300, 390, 350], two=[320, 400, 380]), THREADS)
    assert unknown.measured is None and unknown.why.startswith("too noisy to choose: ")


def test_a_busy_machine_chooses_nothing_whatever_the_runs_say():
    choice = choose(grid(threads=[400, 420, 410], two=[900, 950, 920]), THREADS,
                    busy="other processes used 1.8 of the 2 cores this ran on (90%)")
    assert choice.measured is None
    assert choice.why.startswith("too noisy to choose: the machine was busy (other processes used 1.8 of the 2")
    assert "kept auto's settings; rerun tune on a quiet machine" in choice.why


def test_main_is_not_chosen_on_data_alone_and_a_candidate_that_delivered_nothing_is_not_chosen():
    runs = grid(main=[900, 950, 920], threads=[400, 420, 410], one=[0.0, 0.0, 0.0])
    assert choose(runs, THREADS, main_allowed=False).measured.settings == THREADS
    assert choose(runs, THREADS, main_allowed=True).measured.settings == MAIN
    assert choose(grid(one=[0.0]), THREADS).why == "kept auto's settings: no candidate delivered a batch"
