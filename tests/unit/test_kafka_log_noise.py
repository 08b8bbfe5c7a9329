"""kafka-python 3's slow-loop-step warnings are dropped from our logs; its other warnings are not."""

from __future__ import annotations

import logging

import pytest

from pipelines.connections import _quiet_slow_loop_steps

SLOW_STEP = ("Task <kafka.net.selector.Task object at 0x7f130f5a1390> ran for 0.138s (>0.100s "
             "threshold). It is blocking the event loop -- likely a tight sync loop inside a "
             "coroutine. Other pollers will time out.")


def test_slow_loop_steps_are_dropped_and_other_warnings_kept(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("kafka.net.selector")
    caplog.set_level(logging.WARNING, logger="kafka.net.selector")
    _quiet_slow_loop_steps()
    _quiet_slow_loop_steps()  # every client made installs it: once is enough
    assert len(logger.filters) == len(set(map(id, logger.filters)))

    logger.warning(SLOW_STEP)  # as the client logs it: a preformatted message
    logger.warning("Task %s left RUNNING after step; demoting to UNSCHEDULED", "<task>")

    assert [r.getMessage() for r in caplog.records] == [
        "Task <task> left RUNNING after step; demoting to UNSCHEDULED"]

