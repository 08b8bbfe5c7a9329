"""GracefulStop: the first SIGTERM/SIGINT asks for a clean stop, a second one stops at once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pipelines.signals import GracefulStop


def _deliver(sig: signal.Signals) -> None:
    """Send ``sig`` to this process and give the main thread a moment to run its handler."""
    os.kill(os.getpid(), sig)
    time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_asks_for_a_stop_the_second_stops_at_once(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with GracefulStop("job") as stop:
        assert stop.installed
        _deliver(sig)
        assert stop.requested.is_set() and stop.signal_name == sig.name
        with pytest.raises(KeyboardInterrupt):
            _deliver(sig)
    assert signal.getsignal(sig) == before


def test_handlers_are_restored_when_the_job_ends_without_a_signal() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with GracefulStop("job") as stop:
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    assert not stop.requested.is_set()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_outside_the_main_thread_it_installs_nothing() -> None:
    seen: list[bool] = []

    def body() -> None:
        with GracefulStop("job") as stop:
            seen.append(stop.installed)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [False]


def test_the_parent_death_signal_asks_for_a_stop_however_often_it_comes() -> None:
    """The kernel repeats a parent-death signal as each thread of the dead parent exits;
    the repeats must not stop the job at once, as a second SIGTERM does."""
    from pipelines.signals import PARENT_DEATH_SIGNAL

    with GracefulStop("job") as stop:
        for _ in range(3):
            _deliver(PARENT_DEATH_SIGNAL)
        assert stop.requested.is_set() and stop.signal_name == "parent died"
        with pytest.raises(KeyboardInterrupt):  # a user's signal still stops it at once
            _deliver(signal.SIGTERM)
