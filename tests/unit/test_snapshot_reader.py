"""The snapshot reader process: a reader that died is replaced, not left to fail the next stream."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipelines.streaming import snapshot


@pytest.fixture
def fresh_reader():
    snapshot._READER = None
    yield
    if snapshot._READER is not None:
        snapshot._READER.shutdown(wait=True, cancel_futures=True)
    snapshot._READER = None


def _kill_reader() -> int:
    pool = snapshot._READER
    assert pool is not None
    (pid,) = list(pool._processes)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not pool._broken and time.monotonic() < deadline:  # the pool notices on its own thread
        time.sleep(0.05)
    assert pool._broken, "the pool did not notice its reader was killed"
    return pid


def test_warm_reader_replaces_a_reader_that_was_killed(fresh_reader: None) -> None:
    snapshot.warm_reader()
    first = snapshot._in_reader(os.getpid)
    assert first != os.getpid()
    assert _kill_reader() == first

    snapshot.warm_reader()  # a second stream starting in the same process: no BrokenProcessPool

    second = snapshot._in_reader(os.getpid)
    assert second not in (first, os.getpid())


def test_a_snapshot_after_the_reader_died_fails_once_then_gets_a_new_reader(fresh_reader: None) -> None:
    first = snapshot._in_reader(os.getpid)
    _kill_reader()
    with pytest.raises(snapshot.BrokenProcessPool):
        snapshot._in_reader(os.getpid)
    assert snapshot._in_reader(os.getpid) not in (first, os.getpid())
