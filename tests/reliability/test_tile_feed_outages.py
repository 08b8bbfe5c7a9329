"""Real-time Mode's tile feed under outages of both its servers, run as a feed alone.

The feed (a thread of the driver: Kafka in, Redis out) is tested here without a query:
Spark writes tiles to the tile topic as the query encodes them, then a :class:`TileFeed`
applies them while this test stops and starts its own redis-server and its own Kafka
broker. The whole job under a Kafka outage is in ``test_outages.py``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pipelines.infra import KafkaBroker, RedisServer
from pipelines.settings import Settings
from tests.conftest import free_port
from tests.integration.test_stream import create_topic
from tests.integration.test_stream_realtime import AS_OF, keyed_rows_of
from tests.integration.test_stream_state import EVENT_SCHEMA, _events
from tests.reliability.helpers import topic_name, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

CATCH_UP_S = 120.0
"""How long the feed may take to apply the tiles once both servers are back: its Kafka
client's reconnect backoff and its one-second retries, far below this."""


@pytest.fixture()
def own_servers(make_settings: Callable[..., Settings], tmp_path: Path,
                request: pytest.FixtureRequest,
                ) -> Iterator[tuple[Settings, RedisServer, KafkaBroker]]:
    """A redis-server and a Kafka broker of this test's own, free to stop. The feed takes
    the shape ``request.param`` names (``stream_realtime_shape``; whole tiles unless a test
    says, as the idle feed's checks do not depend on what the feed folds)."""
    from pipelines.streaming.realtime import feed_topic

    settings = make_settings(
        stream_realtime_shape=getattr(request, "param", "tiles"),
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        kafka_bootstrap_servers=f"127.0.0.1:{free_port()}", kafka_controller_port=free_port(),
        run_dir=str(tmp_path / "run"), kafka_topic_events="unused.events",
        kafka_topic_rt_tiles=topic_name("rt-tiles", tmp_path),
        # the feed's Kafka bound (attempts x (timeout + 1 s)) is 63 s here, not 183 s. Not
        # less: a broker restarted after ``kill -9`` serves once the controller has let its
        # earlier registration's session expire (broker.session.timeout.ms, 9 s) after its
        # own start, 15-20 s on a quiet hour here, and the feed ran out of a 33 s bound
        # (its outage counted from the feed's notice) on a slower machine
        stream_kafka_timeout_seconds=20.0)
    redis_server, broker = RedisServer(settings), KafkaBroker(settings)
    try:
        redis_server.start()
        broker.start()
        create_topic(settings, feed_topic(settings))
        yield settings, redis_server, broker
    finally:
        broker.stop()
        redis_server.stop()


def _send_tiles(spark: Any, settings: Settings, seed: int = 31) -> list[dict[str, Any]]:
    """Tiles of 20 minutes of events on the feed's topic, as the Real-time query sends them
    (whole tiles, or each event once per role with its source offset, in offset order, for
    the ``roles`` shape); returns the tile rows the feed must write."""
    from pyspark.sql import functions as F

    from features.tiles import keyed_tiles, role_events
    from pipelines.streaming.realtime import feed_topic, tile_messages

    events = spark.createDataFrame(_events(300, seed, start=AS_OF - timedelta(minutes=20),
                                           span_s=1200), EVENT_SCHEMA)
    if settings.stream_realtime_shape == "roles":
        numbered = (events.withColumn("source_partition", F.lit(0))
                    .withColumn("source_offset", F.monotonically_increasing_id()))
        sent = (role_events(numbered, slide_seconds=60,
                            carry=("source_partition", "source_offset"))
                .repartition(1).sortWithinPartitions("source_offset"))
    else:
        sent = keyed_tiles(events, slide_seconds=60, last_items_n=4)
    (tile_messages(sent).write.format("kafka").options(**settings.spark_kafka_options())
     .option("topic", feed_topic(settings)).save())
    return keyed_rows_of(spark, events)


def _assert_applied(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Every user and item tile is in Redis as sent, and the feed committed every offset."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer, redis_client
    from pipelines.streaming.pyfeatures import TILE_OF_ROW
    from pipelines.streaming.realtime import FEED_GROUP, _decode_tile, feed_topic, rt_tiles_key

    client = redis_client(settings)
    checked = 0
    for row in rows:
        if row["kind"] == "sales":
            continue
        stored = client.hget(rt_tiles_key(row["kind"], row["key"]), str(row["tile_start"]))
        assert stored is not None, (row["kind"], row["key"], row["tile_start"])
        assert _unordered(_decode_tile(stored)) == _unordered(TILE_OF_ROW[row["kind"]](row)), \
            (row["kind"], row["key"])
        checked += 1
    assert checked > 100
    consumer = kafka_consumer(settings, group_id=FEED_GROUP)
    try:
        topic = feed_topic(settings)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = consumer.end_offsets(tps)
        assert {tp: consumer.committed(tp) or 0 for tp in tps} == ends
    finally:
        consumer.close()


def _unordered(tile: dict[str, Any]) -> dict[str, Any]:
    """A tile with its unordered lists sorted and its doubles to 1e-9 (a fold of role rows
    and Spark's aggregation give the same sets in other orders, and sums in other orders)."""
    def plain(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 9)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    out = plain(tile)
    for name in ("items_viewed", "category_weights"):
        if out.get(name) is not None:
            out[name] = sorted(out[name], key=repr)
    return out


def _said(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def _feed_meeting_a_redis_outage(settings: Settings, redis_server: RedisServer,
                                 caplog: pytest.LogCaptureFixture) -> Any:
    """A tile feed started with Redis away and tiles to write: every second it reconnects
    and seeks back to its last commit, asking Kafka for it."""
    from pipelines.stream import StreamFailed
    from pipelines.streaming.realtime import TileFeed

    caplog.set_level(logging.INFO, logger="pipelines.streaming.realtime")
    redis_server.stop()
    feed = TileFeed(settings)
    feed.start()
    try:
        wait_for(lambda: "Redis unreachable" in _said(caplog), timeout=60,
                 what="the feed meeting the Redis outage")
    except AssertionError:
        with contextlib.suppress(StreamFailed):
            feed.stop(timeout_s=10)
        raise
    return feed


@pytest.mark.parametrize("own_servers", ["tiles", "roles"], indirect=True)
def test_a_tile_feed_rides_out_kafka_going_while_redis_is_away(
        own_servers: tuple[Settings, RedisServer, KafkaBroker], spark: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """Redis is away when the feed starts, so each cycle it reconnects and replays from its
    last commit; then Kafka goes too. That seek asked Kafka for the last commit outside the
    feed's handling of a Kafka outage, so the feed failed (KafkaConnectionError: 111
    ECONNREFUSED), and with no timeout on the call it could as well have waited for ever.
    Now the feed waits out both, says so, and writes every tile once they are back."""
    settings, redis_server, broker = own_servers
    rows = _send_tiles(spark, settings)
    feed = _feed_meeting_a_redis_outage(settings, redis_server, caplog)
    try:
        time.sleep(3)  # a few of its one-second retries
        broker.stop()
        wait_for(lambda: "Kafka unreachable" in _said(caplog), timeout=60,
                 what="the feed noticing the Kafka outage too")
        time.sleep(5)
        feed.check()
        broker.start()
        wait_for(lambda: "Kafka is back after" in _said(caplog), timeout=60,
                 what="the feed back on Kafka")
        feed.check()
        redis_server.start()
        deadline = time.monotonic() + CATCH_UP_S
        while not feed.caught_up():
            assert time.monotonic() < deadline, f"not caught up within {CATCH_UP_S:.0f} s"
            time.sleep(0.2)
    finally:
        feed.stop(timeout_s=60)
    _assert_applied(settings, rows)
    said = _said(caplog)
    # one Redis outage all along (its retries each second are not each said), told as it
    # began and as it ended
    assert said.count("Redis unreachable (") == 1, said
    assert "retrying for up to 120 s (SHOPSTREAM_STREAM_REDIS_OUTAGE_SECONDS)" in said
    assert "real-time tile feed #0: Redis is back after" in said
    assert "tile feed failed" not in said


@pytest.mark.parametrize("own_servers", ["tiles", "roles"], indirect=True)
def test_a_tile_feed_outlasted_by_a_kafka_outage_fails_in_one_line_then_resumes(
        own_servers: tuple[Settings, RedisServer, KafkaBroker], spark: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """Past its bound (attempts x (timeout + 1 s), as Spark's source) the feed gives up with
    one error naming how long Kafka was away; a feed started once both servers are back
    writes every tile exactly. (Redis is away first, as above, so that the feed asks Kafka
    for its offsets every second, from the outage's first second.)"""
    from pipelines.stream import StreamFailed
    from pipelines.streaming.realtime import TileFeed

    settings, redis_server, broker = own_servers
    settings = settings.model_copy(update={"stream_kafka_attempts": 1,
                                           "stream_kafka_timeout_seconds": 4.0})
    assert settings.kafka_outage_seconds == 5.0
    rows = _send_tiles(spark, settings)
    feed = _feed_meeting_a_redis_outage(settings, redis_server, caplog)
    try:
        broker.stop()
        started = time.monotonic()
        with pytest.raises(StreamFailed) as failed:
            while time.monotonic() - started < 60:
                feed.check()
                time.sleep(0.2)
        assert time.monotonic() - started < 30, "the feed gave up long after its bound"
    finally:
        with contextlib.suppress(StreamFailed):
            feed.stop(timeout_s=60)
    message = str(failed.value)
    assert message.startswith("real-time tile feed failed: ")
    assert "Kafka unreachable for" in message and "\n" not in message, message
    assert "retrying for up to 5 s" in _said(caplog)

    broker.start()
    redis_server.start()
    again = TileFeed(settings)
    again.start()
    try:
        wait_for(again.caught_up, timeout=CATCH_UP_S, what="a new feed caught up")
    finally:
        again.stop(timeout_s=60)
    _assert_applied(settings, rows)


def _idle_feed(spark: Any, settings: Settings) -> Any:
    """A started feed that wrote every tile of one send, then stayed idle past a check."""
    from pipelines.streaming.realtime import KAFKA_IDLE_CHECK_S, TileFeed

    _send_tiles(spark, settings)
    feed = TileFeed(settings)
    feed.start()
    try:
        wait_for(feed.caught_up, timeout=CATCH_UP_S, what="the feed caught up")
        time.sleep(KAFKA_IDLE_CHECK_S + 1)  # idle for longer than its check's period
    except BaseException:
        feed.stop(timeout_s=60)
        raise
    return feed


def _back_and_reading_on(spark: Any, settings: Settings, broker: KafkaBroker,
                         caplog: pytest.LogCaptureFixture, *, seed: int,
                         timeout_s: float) -> None:
    """The broker started again: the feed says Kafka is back within ``timeout_s``, stays
    idle past a check (which must not tell a second outage: the callers count the lines),
    then writes every new tile of other events (other values) and commits every offset."""
    from pipelines.streaming.realtime import KAFKA_IDLE_CHECK_S

    broker.start()
    wait_for(lambda: "Kafka is back after" in _said(caplog), timeout=timeout_s,
             what="the feed back on Kafka")
    time.sleep(KAFKA_IDLE_CHECK_S + 2)
    rows = _send_tiles(spark, settings, seed=seed)
    deadline = time.monotonic() + CATCH_UP_S
    while True:
        try:
            _assert_applied(settings, rows)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_an_idle_tile_feed_notices_a_kafka_outage_and_reads_on_after_it(
        own_servers: tuple[Settings, RedisServer, KafkaBroker], spark: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """A broker that crashes (``kill -9``) tells its clients nothing: a feed that has
    written and committed every tile polls and finds nothing, outage or not (kafka-python
    retries quietly), so the outage went unsaid and unbounded (a broker stopped cleanly
    hands its partitions' leadership over, and the feed's position check fails on that).
    Now such a feed checks the broker every few seconds: it says the outage began and
    ended, and reads on after it."""
    from pipelines.streaming.realtime import KAFKA_IDLE_CHECK_S

    settings, _, broker = own_servers
    caplog.set_level(logging.INFO, logger="pipelines.streaming.realtime")
    feed = _idle_feed(spark, settings)
    try:
        broker.process.kill()
        stopped = time.monotonic()
        wait_for(lambda: "Kafka unreachable" in _said(caplog), timeout=30,
                 what="the idle feed noticing the Kafka outage")
        assert time.monotonic() - stopped < KAFKA_IDLE_CHECK_S + 10
        feed.check()
        _back_and_reading_on(spark, settings, broker, caplog, seed=32, timeout_s=90)
    finally:
        feed.stop(timeout_s=60)
    said = _said(caplog)
    assert said.count("Kafka unreachable (") == 1, said
    assert "Kafka unreachable (cannot reach Kafka at 127.0.0.1:" in said
    assert "(SHOPSTREAM_STREAM_KAFKA_ATTEMPTS x (SHOPSTREAM_STREAM_KAFKA_TIMEOUT_SECONDS" in said
    assert "tile feed failed" not in said


@contextlib.contextmanager
def _silent_server(port: int) -> Iterator[None]:
    """A server on ``port`` that accepts every connection and never answers: a broker hung,
    or a load balancer with no broker behind it. Its connections close on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 30
    while True:  # the killed broker's port frees once its process is gone
        try:
            sock.bind(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    sock.listen(64)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


def test_an_idle_tile_feed_notices_a_broker_that_takes_connections_but_does_not_answer(
        own_servers: tuple[Settings, RedisServer, KafkaBroker], spark: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """A TCP connect is not a broker serving: with a server on the broker's port that takes
    connections and says nothing (a hung broker, a proxy with no broker behind it), the idle
    feed's connect check passed, and its empty polls went on with the outage unsaid. Now the
    idle feed also asks its partitions' leaders for their end offsets: it says the outage
    (as a broker that does not answer), and reads on once the broker is back."""
    from pipelines.streaming.realtime import KAFKA_CALL_MS, KAFKA_IDLE_CHECK_S

    settings, _, broker = own_servers
    host, port = settings.kafka_bootstrap[0]
    caplog.set_level(logging.INFO, logger="pipelines.streaming.realtime")
    feed = _idle_feed(spark, settings)
    try:
        broker.process.kill()
        with _silent_server(port):
            hung = time.monotonic()
            wait_for(lambda: "Kafka unreachable" in _said(caplog), timeout=60,
                     what="the idle feed noticing a broker that does not answer")
            # a check's period, then its call's timeout
            assert time.monotonic() - hung < KAFKA_IDLE_CHECK_S + KAFKA_CALL_MS / 1000 + 10
            feed.check()
        _back_and_reading_on(spark, settings, broker, caplog, seed=33, timeout_s=90)
    finally:
        feed.stop(timeout_s=60)
    said = _said(caplog)
    assert said.count("Kafka unreachable (") == 1, said
    assert (f"Kafka unreachable (Kafka at {host}:{port} accepts connections but did not answer "
            "in time (") in said, said
    assert "tile feed failed" not in said
