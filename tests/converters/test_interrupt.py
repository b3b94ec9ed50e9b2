"""Ctrl-C while packing is held until the packing thread is between files (converters.packing.interrupt).

Real signals sent to this process. (An interrupted `fastload pack` end to end: tests/test_cli.py;
at 20 random points in a row: tests/reliability/test_pack_faults.py.)
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from fastload.converters.packing.interrupt import interrupt_between_files


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # many bytecodes: the interpreter has run its handler by the end
        pass


def test_ctrl_c_is_held_until_check_and_then_raised_there():
    with pytest.raises(KeyboardInterrupt):
        with interrupt_between_files() as check:
            ctrl_c()  # nothing raised here, where a lock might be held
            reached = True
            check()
            raise AssertionError("check() did not raise the held interrupt")
    assert reached
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_check_is_quiet_without_an_interrupt_and_the_handler_comes_back():
    with interrupt_between_files() as check:
        check()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()


def test_a_second_ctrl_c_does_not_wait_for_a_safe_point():
    with pytest.raises(KeyboardInterrupt), interrupt_between_files():
        ctrl_c()
        ctrl_c()
        raise AssertionError("the second Ctrl-C was held too")


def test_an_interrupt_after_the_last_check_is_raised_on_leaving():
    with pytest.raises(KeyboardInterrupt):
        with interrupt_between_files():
            ctrl_c()
        raise AssertionError("the held interrupt was dropped")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_original_handler_is_the_one_that_runs():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with interrupt_between_files() as check:
            ctrl_c()
            assert seen == []
            check()
            assert seen == [signal.SIGINT]
        assert seen == [signal.SIGINT]  # handled once, not again on leaving
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ignored_sigint_and_other_threads_are_left_alone():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt_between_files() as check:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            ctrl_c()
            check()
    finally:
        signal.signal(signal.SIGINT, previous)

    handlers = []

    def in_a_thread() -> None:
        with interrupt_between_files() as check:
            handlers.append(signal.getsignal(signal.SIGINT))
            check()

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert handlers == [signal.default_int_handler]
