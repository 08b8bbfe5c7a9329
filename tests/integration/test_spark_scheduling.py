"""The driver's scheduler pools (the stream has first claim on free task slots) and its JVM."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _started_at(i: int) -> tuple[int, float]:
    """A task that notes when it started and holds its slot for a moment."""
    import time as _time

    started = _time.time()
    _time.sleep(0.4)
    return i, started


def test_a_stream_job_gets_the_next_free_slot_before_queued_background_tasks(spark: Any) -> None:
    """A snapshot (background pool) with many tasks queued must not make the next
    micro-batch (stream pool) wait for all of them: once a running task frees its slot,
    the stream's tasks start, and the rest of the background tasks after them. Without
    the pools (one FIFO queue) the stream job would start after every background task."""
    from pipelines.spark import STREAM_POOL, detached, scheduler_pool

    sc = spark.sparkContext
    slots = sc.defaultParallelism
    background: list[tuple[int, float]] = []

    def run_background() -> None:
        background.extend(sc.parallelize(range(4 * slots), 4 * slots).map(_started_at).collect())

    worker = threading.Thread(target=detached(spark, run_background, "test-background"))
    worker.start()
    deadline = time.monotonic() + 60
    while not sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sc.statusTracker().getActiveJobsIds(), "the background job did not start"
    with scheduler_pool(spark, STREAM_POOL):
        stream = sc.parallelize(range(slots), slots).map(_started_at).collect()
    worker.join(120)
    assert len(background) == 4 * slots and len(stream) == slots

    stream_started = min(t for _, t in stream)
    after = sorted(t for _, t in background if t > stream_started)
    # at most one round of background tasks ran before the stream's (those already
    # holding the slots when it arrived, and any started before it was submitted)
    assert len(after) >= 2 * slots, (stream_started, sorted(t for _, t in background))
    assert sc.getLocalProperty("spark.scheduler.pool") is None  # the block restored it


def test_the_pools_are_configured_as_documented(spark: Any) -> None:
    """The stream's pool is always 'needy' (its minimum share exceeds any slot count),
    the background pool never is; both come from the packaged allocation file."""
    from pipelines.spark import BACKGROUND_POOL, STREAM_POOL

    sc = spark.sparkContext
    assert spark.conf.get("spark.scheduler.mode") == "FAIR"
    jsc = sc._jsc.sc()  # type: ignore[union-attr]
    stream = jsc.getPoolForName(STREAM_POOL).get()
    background = jsc.getPoolForName(BACKGROUND_POOL).get()
    assert stream.minShare() > 10_000 and stream.weight() > background.weight()
    assert background.minShare() == 0


def test_the_session_jvm_runs_the_throughput_collector(spark: Any) -> None:
    """The project's collector flag reaches the JVM it starts: a throughput session (the
    tests', like the micro-batch stream's) collects with Parallel, not HotSpot's default G1."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
