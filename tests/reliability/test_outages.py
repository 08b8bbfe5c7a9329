"""Outages under a running stream: Redis restarted, the Kafka broker restarted.

Each test runs its own server (a redis-server or a Kafka broker on free ports and its
own run dir) so restarting it harms no other test, and the streaming query runs in
this process on the tests' Spark session (``run_stream``, stop: never), fed in two
chunks: the outage comes while the first chunk is being processed, the second chunk is
produced after the server is back. The job must still be the same running query at the
end (it resumed by itself), and the stores must be exact (raw offline store, quarantine,
online features vs the batch recomputation: ``check_stores`` of the stream's tests).

The API while Redis is down is tested in ``tests/integration/test_api_resilience.py``
(stopped, hung, down at start: degraded or 503 within its timeout, then recovery).

Default (CI): one outage per test. Full: three in a row.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.connections import redis_client
from pipelines.infra import KafkaBroker, RedisServer
from pipelines.settings import Settings
from tests.conftest import free_port
from tests.integration.test_stream import (
    check_stores,
    create_topic,
    expected_outcome,
    produce,
    stream_settings,
    wave1,
)
from tests.reliability.helpers import (
    CliProcess,
    StreamThread,
    committed_batches,
    size,
    stream_totals,
    topic_name,
    wait_for,
)

pytestmark = [pytest.mark.reliability, pytest.mark.integration]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

OUTAGES = size(1, 3)
DOWN_S = size(3.0, 6.0)
"""How long the server stays down after the outage began (Redis: after the next batch started
too). A batch that meets a Redis outage retries its (idempotent) online pass for
``stream_redis_outage_seconds``; one that outlasts that fails the job, which a restart then
resumes exactly (tested here); the 20 s test below rides an outage out without a restart."""
CATCH_UP_BOUND_S = 600.0


@pytest.fixture()
def own_redis(make_settings: Callable[..., Settings], kafka_broker: Any,
              tmp_path: Path) -> Iterator[tuple[Settings, RedisServer]]:
    topic = topic_name("redis-out", tmp_path)
    settings = stream_settings(
        make_settings, tmp_path, topic, redis_url=f"redis://127.0.0.1:{free_port()}/0",
        run_dir=str(tmp_path / "run"), stream_max_offsets_per_trigger=400,
        stream_trigger_seconds=0.5)
    server = RedisServer(settings)
    server.start()
    try:
        create_topic(settings, topic)
        yield settings, server
    finally:
        server.stop()


@pytest.fixture()
def own_broker(make_settings: Callable[..., Settings], redis_server: Any, redis_client: Any,
               tmp_path: Path) -> Iterator[tuple[Settings, KafkaBroker]]:
    topic = topic_name("kafka-out", tmp_path)
    settings = stream_settings(
        make_settings, tmp_path, topic, kafka_bootstrap_servers=f"127.0.0.1:{free_port()}",
        kafka_controller_port=free_port(), run_dir=str(tmp_path / "run"),
        stream_max_offsets_per_trigger=400, stream_trigger_seconds=0.5)
    # the broker creates its events topic with default retention; ours keeps 2024-dated records
    broker = KafkaBroker(settings.model_copy(update={"kafka_topic_events": "unused.events"}))
    try:
        broker.start()
        create_topic(settings, topic)
        yield settings, broker
    finally:
        broker.stop()


def _chunks() -> tuple[list[Any], list[Any]]:
    records = wave1()
    cut = int(len(records) * 0.7)
    return records[:cut], records[cut:]


def _planned(checkpoint: Path) -> int:
    offsets = checkpoint / "offsets"
    return sum(1 for p in offsets.iterdir() if p.name.isdigit()) if offsets.exists() else 0


def _run_with_outages(settings: Settings, spark: Any, stop: Callable[[], None],
                      start: Callable[[], None], totals: Callable[[], dict[str, int]], *,
                      meet_batch: bool, down_s: float = DOWN_S,
                      allow_failure: bool = False) -> tuple[list[str], list[BaseException]]:
    """The server goes down right after a batch commits and comes back ``DOWN_S`` later; with
    ``meet_batch`` it stays down until the next batch has started too (Redis: so that batch
    meets the outage; Kafka: no batch can be planned without the broker). With
    ``allow_failure`` a job that stopped on the outage is returned as failed (the caller
    restarts it, as a supervisor would) instead of failing the test."""
    from pipelines.stream import query_checkpoint

    first, second = _chunks()
    # the first chunk in two shares per outage: one before it, so there is a new batch to
    # wait for, and one while the server is down (Redis: a batch to meet the outage) or
    # right after (Kafka); sent all up front, it was drained before a third outage
    parts = 2 * OUTAGES
    shares = [first[len(first) * n // parts:len(first) * (n + 1) // parts] for n in range(parts)]
    checkpoint = Path(query_checkpoint(settings))
    job = StreamThread(settings, spark)
    log: list[str] = []
    sent = 0
    try:
        job.wait_started()
        for n in range(OUTAGES):
            done = committed_batches(checkpoint)
            produce(settings, shares[2 * n])
            sent = 2 * n + 1
            wait_for(lambda done=done: committed_batches(checkpoint) > done, timeout=CATCH_UP_BOUND_S,
                     what="a micro-batch before the outage", alive=job.active)
            t0 = time.monotonic()
            planned = _planned(checkpoint)
            stop()
            if meet_batch:
                produce(settings, shares[2 * n + 1])
                sent += 1
                # a batch meets the outage: one planned after the stop, or one already running
                # (planned, not committed: it retries its online pass until Redis is back)
                wait_for(lambda planned=planned: _planned(checkpoint) > planned
                         or _planned(checkpoint) > committed_batches(checkpoint)
                         or not job.active(),
                         timeout=CATCH_UP_BOUND_S, what="a micro-batch during the outage")
            time.sleep(down_s)
            start()
            if not meet_batch:
                produce(settings, shares[2 * n + 1])
                sent += 1
            log.append(f"outage {n + 1}: down after batch {done}, up again after "
                       f"{time.monotonic() - t0:.1f} s; batch {_planned(checkpoint) - 1} ran meanwhile")
            print(log[-1])
            if allow_failure and not job.active():
                break
        for share in shares[sent:]:
            produce(settings, share)
        produce(settings, second)
        if allow_failure and (not job.active() or job.failure):
            return log, job.failure
        total = len(first) + len(second)
        wait_for(lambda: totals().get("input_rows", 0) >= total and job.active(),
                 timeout=CATCH_UP_BOUND_S, what="caught up after the outage", alive=job.active)
        assert job.active() and not job.failure, job.failure
        assert job.queries[0].exception() is None
    finally:
        job.stop()
    assert not job.failure, f"the stream failed: {job.failure}"
    return log, []


def _totals(settings: Settings) -> dict[str, int]:
    client = redis_client(settings, timeout_ms=2000)
    try:
        return {k.removeprefix("total_"): v for k, v in stream_totals(client).items()}
    finally:
        client.close()


def test_a_redis_restart_under_the_stream_loses_nothing(own_redis: tuple[Settings, RedisServer],
                                                       spark: Any) -> None:
    """Redis goes down before a batch starts and comes back ``DOWN_S`` after: the batch either
    rides it out (redis-py's retries) or fails the job with a one-line error; then the job is
    restarted (as a supervisor would) and drains the topic. Nothing lost, nothing twice."""
    from pipelines.stream import StreamFailed, StreamOptions, run_stream

    settings, server = own_redis
    log, failure = _run_with_outages(settings, spark, server.stop, server.start,
                                     lambda: _totals(settings), meet_batch=True,
                                     allow_failure=True)
    if failure:
        assert isinstance(failure[0], StreamFailed) and "Connect" in str(failure[0]), failure
        print(f"the job stopped on the outage ({str(failure[0])[:160]}); restarted")
        run_stream(settings, StreamOptions(stop="available_now"), spark=spark)
    else:
        print("the job rode the outage out")
    first, second = _chunks()
    check_stores(spark, settings, expected_outcome(first + second))


def test_the_running_stream_rides_out_a_20_s_redis_outage_by_itself(
        own_redis: tuple[Settings, RedisServer], spark: Any) -> None:
    settings, server = own_redis
    _run_with_outages(settings, spark, server.stop, server.start, lambda: _totals(settings),
                      meet_batch=True, down_s=20.0)


def test_stream_resumes_after_a_kafka_broker_restart(own_broker: tuple[Settings, KafkaBroker],
                                                     redis_client: Any, spark: Any) -> None:
    settings, broker = own_broker

    log, _ = _run_with_outages(settings, spark, broker.stop, broker.start,
                               lambda: _totals(settings), meet_batch=False)
    assert len(log) == OUTAGES
    first, second = _chunks()
    check_stores(spark, settings, expected_outcome(first + second))


def test_a_stream_that_outlasts_its_kafka_attempts_stops_in_one_line_and_resumes(
        own_broker: tuple[Settings, KafkaBroker], redis_client: Any, spark: Any,
        tmp_path: Path) -> None:
    """Kafka down longer than the job waits: each failed attempt is one log line (Spark logged
    a 40-line stack trace for each, a minute apart), and the job stops naming Kafka's address
    and what to do; started again once Kafka is back, it resumes with nothing lost."""
    from pipelines.stream import query_checkpoint

    settings, broker = own_broker
    settings = settings.model_copy(update={"stream_kafka_attempts": 2,
                                           "stream_kafka_timeout_seconds": 2.0,
                                           "spark_log_level": "WARN"})  # the default's
    first, second = _chunks()
    produce(settings, first)
    checkpoint = Path(query_checkpoint(settings))
    log = tmp_path / "stream.log"
    job = CliProcess(settings, ["stream"], log)
    try:
        wait_for(lambda: committed_batches(checkpoint) >= 1, timeout=300, what="a first batch")
        broker.stop()
        assert job.wait(timeout=180) == 2
    finally:
        job.stop()
    lines = log.read_text().splitlines()
    attempts = [i for i, line in enumerate(lines) if "getting Kafka offsets:" in line]
    assert len(attempts) == 2, lines[-40:]
    for n, i in enumerate(attempts, start=1):
        assert f"Error in attempt {n} getting Kafka offsets: " in lines[i]
        assert "TimeoutException" in lines[i]
        assert "(of 2, SHOPSTREAM_STREAM_KAFKA_ATTEMPTS; then the query stops" in lines[i]
        assert not lines[i + 1].startswith(("\tat ", "java.", "Caused by")), lines[i:i + 3]
    host, port = settings.kafka_bootstrap[0]
    [error] = [line for line in lines if line.startswith("error: ")]
    assert error.startswith("error: the streaming query failed: "), error
    assert f"cannot reach Kafka at {host}:{port} (connection refused)" in error
    assert "SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS" in error

    broker.start()
    produce(settings, second)
    again = CliProcess(settings, ["stream", "--until-idle", "5"], tmp_path / "again.log")
    try:
        assert again.wait(timeout=600) == 0
    finally:
        again.stop()
    check_stores(spark, settings, expected_outcome(first + second))


def test_real_time_mode_rides_out_a_kafka_outage_while_tiles_flow(
        own_broker: tuple[Settings, KafkaBroker], redis_client: Any, spark: Any,
        tmp_path: Path) -> None:
    """Real-time Mode's tile feeds met a Kafka outage with their next offset commit and
    failed at once (KafkaConnectionError: 111 ECONNREFUSED), and the driver stopped with a
    traceback; the micro-batch job rides out the same outage. Now each feed waits as long
    as Spark's source does, says so, and replays from its last commit when Kafka is back.
    The events keep coming throughout (the producer holds them while the broker is down),
    so the feeds are writing tiles when it goes."""
    import signal
    import threading

    from pipelines.streaming.realtime import required_slots, rt_clock_key

    settings, broker = own_broker
    settings = settings.model_copy(update={
        "stream_mode": "realtime", "stream_realtime_checkpoint_seconds": 5,
        "stream_realtime_feeds": 2, "stream_realtime_offline_trigger_seconds": 10.0})
    settings = settings.model_copy(update={"spark_master": f"local[{required_slots(settings)}]"})
    first, second = _chunks()
    produce(settings, first[:200])
    rest = first[200:]

    def keep_sending() -> None:
        """About 8 events/s (some 85 s) through the outages: one producer, which holds what
        the broker cannot take and delivers it once back (idempotent: its retries add no
        copies). Each event changes a tile, so the feeds write (and commit) all along."""
        from kafka.partitioner.default import murmur2

        from pipelines.connections import kafka_producer

        producer = kafka_producer(settings)
        try:
            partitions = sorted(producer.partitions_for(settings.kafka_topic_events))
            for n, r in enumerate(rest, start=1):
                partition = (None if r.route is None
                             else partitions[(murmur2(r.route) & 0x7FFFFFFF) % len(partitions)])
                producer.send(settings.kafka_topic_events, key=r.key, value=r.value,
                              timestamp_ms=r.ts_ms, partition=partition)
                if n % 6 == 0:
                    time.sleep(0.75)
            producer.flush(timeout=240)
        finally:
            producer.close(timeout=10)

    log = tmp_path / "stream.log"
    job = CliProcess(settings, ["stream"], log)
    sender = threading.Thread(target=keep_sending, daemon=True)
    said = lambda: " ".join(log.read_text().split())  # noqa: E731 - the console wraps lines
    try:
        wait_for(lambda: redis_client.exists(rt_clock_key()), timeout=CATCH_UP_BOUND_S,
                 what="the feed's first tiles", alive=job.alive)
        sender.start()
        # A feed meets an outage in a commit when it has tiles to commit (an idle one notices
        # it by its check, with nothing to replay): the broker goes as the clock moves, while
        # the feeds write; at most three times, until one of them met it so
        for _ in range(3):
            clock = redis_client.get(rt_clock_key())
            wait_for(lambda clock=clock: redis_client.get(rt_clock_key()) != clock, timeout=120,
                     what="tiles moving the clock", alive=job.alive)
            broker.stop()
            time.sleep(DOWN_S + 12)
            assert job.alive(), log.read_text()[-3000:]
            broker.start()
            if "Kafka unreachable (KafkaConnectionError" in said():
                break
        wait_for(lambda: "Kafka is back after" in said(), timeout=120,
                 what="a feed back after the outage", alive=job.alive)
        sender.join(timeout=300)
        assert not sender.is_alive(), "the producer did not deliver the rest within 300 s"
        produce(settings, second)
        time.sleep(5)
        os.kill(job.pid, signal.SIGTERM)  # the driver only, as `kill <pid>` (its JVM stops with it)
        assert job.wait(timeout=300) == 0, said()[-3000:]
    finally:
        if job.alive():
            job.kill()
    logged = " ".join(log.read_text().split())
    assert "Kafka unreachable (KafkaConnectionError" in logged, logged[-3000:]
    assert "retrying for up to 183 s (SHOPSTREAM_STREAM_KAFKA_ATTEMPTS" in logged
    assert "tile feed failed" not in logged and "Traceback" not in logged, logged[-3000:]

    again = CliProcess(settings, ["stream", "--until-idle", "12"], tmp_path / "again.log")
    assert again.wait(timeout=900) == 0, (tmp_path / "again.log").read_text()[-3000:]
    check_stores(spark, settings, expected_outcome(first + second))
