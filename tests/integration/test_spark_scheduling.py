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


@pytest.mark.parametrize(("logger", "message", "logged"), [
    ("org.apache.spark.scheduler.DAGScheduler",
     "Failed to cancel job group 0cbbde1d-ded0-4b1a. Cannot find active jobs for it.", False),
    ("org.apache.spark.scheduler.DAGScheduler", "Job 3 failed: ExecutorLostFailure", True),
    ("org.apache.spark.scheduler.TaskSetManager",
     "[queryId = b3bbb] [batchId = 0] Lost task 2.0 in stage 0.0 (TID 2) (192.0.2.2 executor "
     "driver): TaskKilled (Stage cancelled: [SPARK_JOB_CANCELLED] Job 0 cancelled Query "
     "shopstream-online-rtm was stopped)", False),
    ("org.apache.spark.scheduler.TaskSetManager",
     "Lost task 1.0 in stage 3.0 (TID 9) (10.0.0.7 executor 1): ExecutorLostFailure (executor 1 "
     "exited caused by one of the running tasks)", True),
])
def test_a_deliberate_stop_s_warnings_are_dropped_and_a_lost_task_is_not(
        spark: Any, logger: str, message: str, logged: bool) -> None:
    """A stop of the Real-time job logged a warning per killed task of its epoch and one per
    job group with nothing to cancel (nine lines a stop, by hand). The session's log4j2
    configuration drops those, by message, and keeps a task lost for any other reason."""
    jvm = spark.sparkContext._jvm
    core = jvm.org.apache.logging.log4j.core
    config = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    event = (core.impl.Log4jLogEvent.newBuilder().setLoggerName(logger)
             .setLevel(jvm.org.apache.logging.log4j.Level.WARN)
             .setMessage(jvm.org.apache.logging.log4j.message.SimpleMessage(message)).build())
    verdict = config.getLoggerConfig(logger).getFilter()
    result = "NEUTRAL" if verdict is None else verdict.filter(event).toString()
    assert (result != "DENY") is logged, result

