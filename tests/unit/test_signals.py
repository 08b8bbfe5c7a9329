"""GracefulStop: the first SIGTERM/SIGINT asks for a clean stop, a second one stops at once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pipelines.signals import PARENT_DEATH_SIGNAL, GracefulStop


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


@pytest.mark.parametrize("sig", [signal.SIGTERM, PARENT_DEATH_SIGNAL])
def test_a_signal_that_arrives_inside_the_handlers_stop_request_is_a_repeat(
        sig: signal.Signals) -> None:
    """The kernel repeats the parent-death signal in a burst, and a signal can interrupt a
    handler anywhere, also inside ``requested.set()`` while it holds the Event's lock. The
    handler that runs there must take it as a repeat and leave the Event alone: calling
    ``set()`` again waited for that lock forever, and the sinks' process outlived its
    killed driver."""
    stop = GracefulStop("sinks")
    calls: list[str] = []

    class Interrupted(threading.Event):
        def set(self) -> None:
            calls.append("set")
            if len(calls) == 1:  # the signal arrives while the first stop request is made
                try:
                    stop._handle(sig, None)
                except KeyboardInterrupt:  # a second SIGTERM: a stop at once, as documented
                    calls.append("stopped at once")
            super().set()

    stop.requested = Interrupted()
    stop._handle(sig, None)
    assert stop.requested.is_set()
    assert stop.signal_name == ("parent died" if sig == PARENT_DEATH_SIGNAL else sig.name)
    assert calls == (["set"] if sig == PARENT_DEATH_SIGNAL else ["set", "stopped at once"])
