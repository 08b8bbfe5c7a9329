"""The streaming feature job: Kafka -> validation -> quarantine, raw events, online features.

One micro-batch query, read -> transform -> write::

    Kafka (native source, maxOffsetsPerTrigger)
      -> verdict per record (features.validation, stateless)
      -> dedup by (event_id, event_time) for a processing-time retention (RocksDB state;
         pipelines.streaming.dedup)
      -> foreachBatch(batch, batch_id):
           a. event-time clock of batch_id - 1 (checkpointed) splits valid events
              into on-time and late;
           b. online: tile deltas merged into Redis (idempotent per batch), features
              finalized as of the clock T and written in Feast's layout, top sellers
              replaced atomically, item metadata;
           c. raw events and quarantine (malformed + late) to Parquet, each batch
              replacing its own partition (batch_id) on a replay;
           d. at each slide boundary of T, a feature snapshot (the rows Redis holds for
              the entities touched in the slide, and the top lists) appended to the
              offline store beside the following batches.

Exactly once: Spark's offset and commit logs replay an unfinished batch with the
same offsets, the same batch timestamp, the same dedup state and the same
watermark; sinks a-c are idempotent for a replayed batch_id, so a crash (kill -9)
at any point neither loses nor doubles an event. A snapshot lost to a crash is
written by the next process (a done-marker per snapshot in the batch log).

Late events: Spark's stateful operators drop rows behind the watermark silently,
so the watermark here is on the ingest (processing) time, which never makes a row
late; event-time lateness is decided in foreachBatch against the checkpointed
clock (max accepted event time minus ``feature_allowed_lateness_seconds``), and
late rows go to the quarantine with reason ``late_event`` and into the metrics.

Run locally: ``shopstream stream`` (``--available-now`` or ``--until-idle 10`` to
stop once caught up). On a cluster::

    spark-submit --master spark://host:7077 \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<version> \\
        --py-files shopstream.zip -m pipelines.stream

with ``SHOPSTREAM_DATA_DIR=s3a://bucket/shopstream`` (checkpoints and the
offline store follow it) and the Kafka / Redis addresses in the environment.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from features.events import Reason
from features.validation import QUARANTINE_COLUMNS, with_verdict
from pipelines import offline_store
from pipelines.settings import Settings
from pipelines.signals import GracefulStop
from pipelines.spark import STREAM_POOL, inheriting, scheduler_pool
from pipelines.stream_metrics import BatchStats, MetricsRecorder, ProgressListener, caught_up_of
from pipelines.stream_state import BatchLog, BatchRecord, release, spilled_bytes
from pipelines.streaming.dedup import (
    NEW_LAYOUT,
    StateLayout,
    check_checkpoint,
    dedup_key,
    dedup_watermark_delay,
    deduplicated,
    stamped,
)

if TYPE_CHECKING:
    from concurrent.futures import Future

    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "QUERY_NAME",
    "RAW_COLUMNS",
    "PLAIN_EVENT_COLUMNS",
    "StreamOptions",
    "query_checkpoint",
    "read_kafka",
    "checked_records",
    "dedup_key",
    "dedup_watermark_delay",
    "batch_constants",
    "BatchProcessor",
    "start_stream",
    "run_stream",
    "stop_gracefully",
    "ship_code",
    "StreamFailed",
    "CheckpointTopicError",
    "check_checkpoint_topic",
    "is_redis_outage",
    "is_kafka_outage",
    "redis_outage_of",
]

log = logging.getLogger(__name__)

QUERY_NAME = "shopstream-events"
"""Name of the micro-batch query (and its checkpoint folder)."""
RAW_COLUMNS: tuple[str, ...] = ("key", "value", "topic", "partition", "offset", "timestamp")
BATCH_COLUMN = "batch_id"
"""Extra partition level of the raw events and quarantine written by the stream: a
replayed batch overwrites exactly its own files (dynamic partition overwrite)."""
DAEMON_MODULE = "pipelines.streaming.daemon"
"""Python daemon with the executors' imports preloaded (see that module)."""
_EVENT_COLUMNS: tuple[str, ...] = (
    "event_id", "event_type", "event_time", "user_id", "session_id", "item_id", "category_id",
    "region", "price", "quantity", "device",
)
PLAIN_EVENT_COLUMNS: tuple[str, ...] = ("event_id", "event_time", "session_id")
"""The raw events' columns written without a Parquet dictionary: nearly every value is new
within a batch (each event's id and time; a session has a few events), so Parquet hashed
each value into its dictionary only to drop it, at the end of the first page (the id, the
time) or once it outgrew its limit (the session: a drain's files held a third of their
rows' sessions as distinct values, their dictionary given up part way). The files read the
same and are no larger. Written alone, the drain's 2.94M events (alternating in one process,
eight rounds): the three plain 7.45 s of the JVM's CPU (median), the id alone 7.81 s,
lower in every round after the first, which warmed the JVM; before that, the id alone against none:
2.84-3.24 s against 2.97-3.42 s (6M rows of three text columns)."""
_BATCH_COLUMNS: tuple[str, ...] = (
    *RAW_COLUMNS, "ingest_time", "reason", "field", "event_id", "event_type", "event_time",
    "user_id", "session_id", "item_id", "category_id", "region", "price", "quantity", "device",
)


@dataclass(frozen=True)
class StreamOptions:
    """How to run the job (the settings say where and with what limits).

    Attributes
    ----------
    stop
        ``never`` (a service), ``available_now`` (process what is in the topic at
        start, in batches of ``maxOffsetsPerTrigger``, then stop) or ``idle``
        (stop after ``idle_seconds`` without new input; tests and demos).
    online
        Write features to Redis from this query (off when Real-time Mode does it).
    snapshots
        Write feature snapshots (this query's, or in Real-time Mode those the feed
        asks for).
    realtime_snapshots
        Beside this query, write the snapshots Real-time Mode's feed asks for (what
        its Parquet sinks' process does: :mod:`pipelines.streaming.rt_snapshots`).
    """

    stop: Literal["never", "available_now", "idle"] = "never"
    idle_seconds: float = 10.0
    online: bool = True
    snapshots: bool = True
    realtime_snapshots: bool = False
    timeout_seconds: float | None = None


class CheckpointTopicError(RuntimeError):
    """The checkpoint holds offsets of another topic than the one the job is set to read."""


def check_checkpoint_topic(spark: SparkSession, checkpoint: str, settings: Settings) -> None:
    """Refuse to start a query on a checkpoint written for another topic (say, after
    ``SHOPSTREAM_KAFKA_TOPIC_EVENTS`` changed): Spark would fail its first batch with
    ``UnknownTopicOrPartitionException: This server does not host this topic-partition``,
    which names neither the checkpoint nor the setting."""
    from pipelines.stream_state import BatchLog

    topics = BatchLog(spark, checkpoint).source_topics()
    if topics and topics != {settings.kafka_topic_events}:
        raise CheckpointTopicError(
            f"the checkpoint {checkpoint} holds offsets of the topic {', '.join(sorted(topics))}, "
            f"not of SHOPSTREAM_KAFKA_TOPIC_EVENTS={settings.kafka_topic_events}: set the topic "
            "back, or give the new topic a checkpoint of its own (SHOPSTREAM_CHECKPOINT_DIR)")


def query_checkpoint(settings: Settings, name: str = QUERY_NAME) -> str:
    """The checkpoint location of one query (a URI or a local path)."""
    return f"{settings.checkpoint_path.rstrip('/')}/{name}"


# ------------------------------------------------------------------- read
def read_kafka(spark: SparkSession, settings: Settings) -> DataFrame:
    """The events topic through Spark's native ``kafka`` source.

    ``startingOffsets`` only applies to a fresh checkpoint; later starts resume
    from the checkpoint's offsets. ``maxOffsetsPerTrigger`` bounds a batch, so a
    backlog is worked off at a steady pace (backpressure).
    """
    return (
        spark.readStream.format("kafka")
        .options(**settings.spark_kafka_source_options())
        .option("subscribe", settings.kafka_topic_events)
        .option("startingOffsets", settings.stream_starting_offsets)
        .option("maxOffsetsPerTrigger", str(settings.stream_max_offsets_per_trigger))
        .load()
    )


# -------------------------------------------------------------- transform
def checked_records(raw: DataFrame, settings: Settings,
                    dedup_layout: StateLayout = NEW_LAYOUT) -> DataFrame:
    """Raw Kafka rows -> one row per record with its verdict, deduplicated by (event_id, event_time).

    * the future-timestamp rule compares ``event_time`` with the record's Kafka
      timestamp (when it was produced): part of the data, so a replay gives the
      same verdict, and the same rule as the Real-time path's;
    * ``ingest_time``, the micro-batch's timestamp, is added by :class:`BatchProcessor`
      (:func:`batch_constants`); only Spark's dedup has it here, for its watermark
      (:func:`pipelines.streaming.dedup.stamped`);
    * valid records are deduplicated by ``event_id`` and ``event_time`` (a copy of an
      event carries both; invalid ones by their Kafka coordinates, i.e. never), for
      ``stream_dedup_retention_seconds`` of processing time, by the operator
      ``stream_dedup`` names (:mod:`pipelines.streaming.dedup`; ``dedup_layout``: the
      state layout the checkpoint holds, :func:`~pipelines.streaming.dedup.check_checkpoint`).
    """
    from pyspark.sql import functions as F

    checked = with_verdict(stamped(raw, settings, RAW_COLUMNS), now=F.col("timestamp"),
                           check_key=settings.stream_check_key)
    return deduplicated(checked, settings, dedup_layout)


def _epoch_us(ts: datetime) -> int:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    delta = ts.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def batch_constants(spark: SparkSession, cut_us: int, ingest_us: int) -> DataFrame:
    """The batch's own values as a one-row broadcast table, to cross-join: the late cut
    (epoch µs, ``_late_cut``) and the batch's timestamp (``ingest_time``).

    Not literals in the batch's projections: Spark writes number (and timestamp)
    literals into the generated code, so a stage holding one is compiled by Janino and
    then by the JIT again every batch. ``ingest_time`` was such a literal (Spark puts
    the batch's timestamp for ``current_timestamp()``) in the validation's stage, 4,500
    lines: at 2,000 events/s the driver's JIT threads took 0.4-0.7 of a core. And not
    ``lit(value)`` on the one-row side either: the optimizer propagates a literal
    column through the join (FoldablePropagation). An inline table (``VALUES``) is
    evaluated when the query is analyzed, into a local relation whose rows are data:
    its scan generates no code, so no stage of the batch is compiled again (the one-row
    stage of ``range(1)`` and ``id + value`` that was here was, twice a batch).
    """
    from pyspark.sql import functions as F

    return F.broadcast(spark.sql(
        "SELECT * FROM VALUES (:cut, timestamp_micros(:ingest)) AS batch(_late_cut, ingest_time)",
        args={"cut": int(cut_us), "ingest": int(ingest_us)}))


# ------------------------------------------------------------------ write
def _batch_literal(batch_id: int) -> Column:
    """The batch id as the partition value, a string literal: Spark writes a number
    literal into the generated code and so compiled the write's stage again every
    batch, where a string one is passed as a reference. The directory name
    (``batch_id=7``) and the type readers infer from it are the same."""
    from pyspark.sql import functions as F

    return F.lit(str(batch_id))


def write_events_batch(events: DataFrame, settings: Settings, batch_id: int) -> None:
    """Valid on-time events of one batch -> ``events/event_date=/event_hour=/batch_id=``.

    The columns of :data:`PLAIN_EVENT_COLUMNS` are written without a dictionary (see
    there); the others keep Parquet's."""
    offline_store.configure_parquet(events.sparkSession)
    rows = offline_store.with_event_partitions(events).withColumn(BATCH_COLUMN,
                                                                  _batch_literal(batch_id))
    writer = rows.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
    for column in PLAIN_EVENT_COLUMNS:
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    (writer.partitionBy(*offline_store.EVENT_PARTITION_COLUMNS, BATCH_COLUMN)
     .parquet(offline_store.events_path(settings)))


def write_quarantine_batch(rows: DataFrame, settings: Settings, batch_id: int) -> None:
    """Quarantine rows of one batch -> ``quarantine/ingest_date=/batch_id=``."""
    offline_store.configure_parquet(rows.sparkSession)
    out = offline_store.with_quarantine_partitions(rows).withColumn(BATCH_COLUMN,
                                                                    _batch_literal(batch_id))
    (out.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy(*offline_store.QUARANTINE_PARTITION_COLUMNS, BATCH_COLUMN)
     .parquet(offline_store.quarantine_path(settings)))


def quarantine_rows(checked: DataFrame) -> DataFrame:
    """Verdict rows (malformed, or valid but late) -> :data:`QUARANTINE_COLUMNS`."""
    from pyspark.sql import functions as F

    late = F.col("_late")
    return checked.select(
        F.when(late, F.lit(Reason.LATE_EVENT.value)).otherwise(F.col("reason")).alias("reason"),
        F.when(late, F.lit("event_time")).otherwise(F.col("field")).alias("field"),
        F.col("value").cast("binary").alias("raw_value"),
        F.col("key").cast("binary").alias("raw_key"),
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "ingest_time",
    ).select(*QUARANTINE_COLUMNS)


_REDIS_OUTAGE_MARKERS = (
    "redis.exceptions.ConnectionError", "redis.exceptions.TimeoutError",
    "redis.exceptions.BusyLoadingError", "ConnectionRefusedError", "ConnectionResetError",
)


def is_redis_outage(exc: BaseException) -> bool:
    """True when a failure (raised here or inside a Spark task) is Redis being unreachable."""
    import redis

    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | ConnectionError):
        return True
    text = str(exc)
    return any(marker in text for marker in _REDIS_OUTAGE_MARKERS)


def is_kafka_outage(exc: BaseException) -> bool:
    """True when a kafka-python client's failure is Kafka being unreachable or not ready
    (refused or lost connections, timeouts, no coordinator): errors worth a retry."""
    from kafka.errors import KafkaError

    return isinstance(exc, KafkaError) and exc.retriable


def redis_outage_of(future: Future[Any]) -> BaseException | None:
    """Wait for ``future`` (work beside the stream): ``None`` when it succeeded, its error
    when that was Redis being unreachable (the caller redoes the work later); any other
    error is raised here."""
    try:
        future.result()
    except Exception as exc:
        if not is_redis_outage(exc):
            raise
        return exc
    return None


def _ended(write: Callable[..., None]) -> Callable[..., float]:
    """``write``, returning when it ended (epoch s): the sinks' share of a batch."""

    def run(*args: Any, **kwargs: Any) -> float:
        write(*args, **kwargs)
        return time.time()

    return run


# ----------------------------------------------------------- foreachBatch
@dataclass(frozen=True)
class _BatchColumns:
    """Column expressions of :class:`BatchProcessor`'s late split and batch figures."""

    checked: tuple[Any, ...]
    figures: tuple[Any, ...]
    on_time: Any
    events: tuple[Any, ...]

    @classmethod
    def build(cls) -> _BatchColumns:
        """Column objects, names included: PySpark turns each name it is given into a
        column with three calls into the JVM (``functions.col`` looked up, then called),
        every batch; with the keyed tiles' names that was about 0.1 s of a batch."""
        from pyspark.sql import functions as F

        valid = F.col("reason").isNull()
        is_late = valid & (F.unix_micros("event_time") < F.col("_late_cut"))
        late = F.col("_late")
        on_time = valid & ~late
        et = F.when(on_time, F.unix_micros("event_time"))
        return cls(
            checked=(*map(F.col, _BATCH_COLUMNS), is_late.alias("_late")),
            figures=(
                F.count(F.lit(1)).alias("rows"),
                F.sum(F.when(~valid, 1).otherwise(0)).alias("invalid"),
                F.sum(F.when(late, 1).otherwise(0)).alias("late"),
                F.sum(F.when(on_time & (F.col("event_type") == "purchase"), 1).otherwise(0)).alias(
                    "purchases"),
                F.max(et).alias("max_us"),
                F.min(et).alias("min_us"),
                F.percentile_approx(et, [0.01, 0.5], 1000).alias("pct_us"),
            ),
            on_time=on_time,
            events=tuple(map(F.col, _EVENT_COLUMNS)),
        )


@dataclass
class BatchProcessor:
    """The ``foreachBatch`` function: clock, late split, sinks, metrics (runs on the driver).

    Every step is idempotent for a replayed ``batch_id`` (see the module docstring).
    """

    settings: Settings
    checkpoint: str
    recorder: MetricsRecorder
    online: bool = True
    snapshots: bool = True
    _batch_log: BatchLog | None = field(default=None, init=False, repr=False)
    _online: Any = field(default=None, init=False, repr=False)
    _cols: _BatchColumns | None = field(default=None, init=False, repr=False)
    stopping: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    """Set by :func:`stop_gracefully`: the next batch to end holds (:meth:`hold_if_stopping`)."""
    holding: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    """Set while a complete batch holds the stream thread, waiting for ``query.stop()``."""
    query: Any = field(default=None, init=False, repr=False)
    """The query running this processor (set by :func:`start_stream`)."""

    def hold_if_stopping(self, batch_id: int) -> None:
        """At the end of a complete batch, while a stop is under way: keep the stream
        thread here until the query is stopped.

        Spark starts the next batch at once when it is behind, and ``query.stop()``
        interrupts whatever batch runs, cancelling its Spark jobs half way (safe, the
        batch is replayed on restart, but Spark 4.3 can fail while checking that
        interruption, :func:`stop_gracefully`). Held here, no next batch starts and
        nothing is cancelled: stop() marks the query stopped, this returns, and the
        query ends. Spark does not mark a batch done once stop() was called (seen on
        4.3: no commit file), so the next start runs this one again; its sinks are
        idempotent per batch, so that rewrites the same values.
        """
        if not self.stopping.is_set() or self.query is None:
            return
        self.holding.set()
        log.info("stream: batch %d complete; stopping", batch_id)
        deadline = time.monotonic() + self.settings.stream_stop_grace_seconds + 60
        with contextlib.suppress(Exception):  # the JVM going away ends the wait as well
            while self.query.isActive and time.monotonic() < deadline:
                time.sleep(0.05)

    def _log(self, spark: SparkSession) -> BatchLog:
        if self._batch_log is None:
            self._batch_log = BatchLog(spark, self.checkpoint,
                                       retain=self.settings.stream_batch_log_retain)
        return self._batch_log

    def _columns(self) -> _BatchColumns:
        """The batch's column expressions, built once per processor: they do not change
        from batch to batch (the late cut arrives as data), and building them is a
        round trip into the JVM each."""
        if self._cols is None:
            self._cols = _BatchColumns.build()
        return self._cols

    def _online_writer(self) -> Any:
        if self._online is None:
            from pipelines.streaming.online import OnlineFeatures

            self._online = OnlineFeatures(self.settings)
        return self._online

    def close(self) -> None:
        """After the query stopped: let the last batch's top lists finish."""
        if self._online is not None:
            self._online.close()

    def _redis_retrying(self, batch_id: int, write: Callable[[], Any]) -> Any:
        """``write()``, again while Redis is unreachable, for ``stream_redis_outage_seconds``.

        redis-py's own retries span seconds; a Redis restart or failover takes longer.
        The online pass is idempotent per batch (tile markers, full values), so running
        it again after a partial write is safe; any other error fails the batch at once.
        """
        budget = self.settings.stream_redis_outage_seconds
        deadline: float | None = None  # counted from the first failure, not the first try
        delay, attempt = 0.5, 0
        while True:
            try:
                return write()
            except Exception as exc:
                if not is_redis_outage(exc):
                    raise
                deadline = deadline if deadline is not None else time.monotonic() + budget
                if time.monotonic() >= deadline:
                    raise
                attempt += 1
                log.warning("stream: batch %d: Redis unreachable (attempt %d), retrying in %.1f s "
                            "(gives up %.0f s after the first failure)", batch_id, attempt, delay,
                            budget)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from pyspark.sql import Observation

        started = time.time()
        spark = batch.sparkSession
        batch_log = self._log(spark)
        previous = batch_log.latest_before(batch_id)
        prev_clock = previous.clock_us if previous else None
        lateness_us = self.settings.feature_allowed_lateness_seconds * 1_000_000

        # a. late split against the clock of the batch before (deterministic on replay).
        # localCheckpoint materializes the batch once (the Observation collects its
        # figures in the same job) and cuts the large validation plan out of the
        # lineage, so the many small plans below stay cheap to analyze.
        cut = -(2**63) if prev_clock is None else prev_clock - lateness_us
        # the batch's timestamp as current_timestamp() has it in the batch's plan
        constants = batch_constants(spark, cut, batch_log.batch_timestamp_ms(batch_id) * 1000)
        cols = self._columns()
        observation = Observation("shopstream_batch")  # a fixed name: generated code is reused
        checked = batch.drop("ingest_time").crossJoin(constants).select(*cols.checked).observe(
            observation, *cols.figures).localCheckpoint(eager=True)
        stats = observation.get
        read_s = time.time() - started
        spilled = _spilled(checked)
        rows = int(stats.get("rows") or 0)
        invalid = int(stats.get("invalid") or 0)
        n_late = int(stats.get("late") or 0)
        n_on_time = rows - invalid - n_late
        clock = prev_clock
        if stats.get("max_us") is not None:
            clock = max(prev_clock or stats["max_us"], stats["max_us"])
        snapshot = previous.snapshot if previous else None

        online_done: float | None = None
        online_s: float | None = None
        offline_s: float | None = None
        try:
            if rows:
                events = checked.where(cols.on_time).select(*cols.events)
                # c. the Parquet sinks run beside the online path (independent jobs),
                # each batch replacing its own files on a replay
                with ThreadPoolExecutor(max_workers=2, thread_name_prefix="sink") as pool:
                    sinks = []
                    sinks_from = time.time()
                    if n_on_time:
                        sinks.append(pool.submit(inheriting(spark, _ended(write_events_batch)),
                                                 events, self.settings, batch_id))
                    if invalid or n_late:
                        sinks.append(pool.submit(
                            inheriting(spark, _ended(write_quarantine_batch)),
                            quarantine_rows(checked.where(~cols.on_time)), self.settings, batch_id))
                    # b. online: tiles -> features -> Redis (the latency-sensitive path)
                    if self.online and clock is not None:
                        before = snapshot
                        online_from = time.time()
                        snapshot = self._redis_retrying(batch_id, lambda: self._online_writer().apply(
                            spark, events, batch_id=batch_id, as_of_us=clock,
                            prev_as_of_us=prev_clock, has_events=n_on_time > 0,
                            has_purchases=int(stats.get("purchases") or 0) > 0,
                            snapshot=before, snapshots=self.snapshots, batch_log=batch_log))
                        online_done = time.time()
                        online_s = online_done - online_from
                    ends = [sink.result() for sink in sinks]
                    if ends:
                        offline_s = max(ends) - sinks_from
            batch_log.write(BatchRecord(batch_id, clock, snapshot))
        finally:
            release(checked)

        freshness = None
        if online_done is not None and stats.get("max_us") is not None:
            done_us = int(online_done * 1_000_000)
            p01, p50 = stats["pct_us"]
            freshness = ((done_us - p50) / 1e6, (done_us - p01) / 1e6,
                         (done_us - stats["min_us"]) / 1e6)
        self.recorder.record_batch(BatchStats(
            batch_id=batch_id, rows=rows, valid=rows - invalid, quarantined=invalid + n_late,
            late=n_late, on_time=n_on_time, clock_us=clock, freshness_s=freshness,
            foreach_seconds=time.time() - started, read_seconds=read_s, online_seconds=online_s,
            offline_seconds=offline_s, spilled_bytes=spilled,
        ))
        self.hold_if_stopping(batch_id)


def _spilled(checked: DataFrame) -> int:
    """:func:`~pipelines.stream_state.spilled_bytes` of the batch's copy; 0 when Spark
    cannot say (a figure for the batch's line, never a reason to fail the batch)."""
    try:
        return spilled_bytes(checked)
    except Exception as exc:  # noqa: BLE001 - py4j errors of a stopping context, say
        log.debug("could not read the batch's storage: %s", exc)
        return 0


# ------------------------------------------------------------------- run
def _spark_for(settings: Settings, *, latency: bool = False) -> SparkSession:
    import os
    import sys

    from pipelines.spark import spark_session

    # Python workers must be this interpreter (the venv with redis, feast, ...);
    # pyspark only looks at PYSPARK_PYTHON, read when the SparkContext starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # workers forked from a daemon that has the online writer imported already
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                          f"--conf spark.python.daemon.module={DAEMON_MODULE} pyspark-shell")
    spark = spark_session(settings, app_name="shopstream-stream", latency=latency)
    if not spark.sparkContext.master.startswith("local"):
        ship_code(spark)
    return spark


def ship_code(spark: SparkSession) -> str:
    """Zip the ``features`` and ``pipelines`` packages and add them to every executor's path.

    What ``spark-submit --py-files`` does; needed when executors run elsewhere
    (standalone, YARN, Kubernetes), harmless when they share this machine.
    """
    import tempfile
    import zipfile
    from pathlib import Path

    import features
    import pipelines

    out = Path(tempfile.mkdtemp(prefix="shopstream-code-")) / "shopstream.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in (features, pipelines):
            root = Path(package.__file__).resolve().parent
            for path in root.rglob("*.py"):
                zf.write(path, path.relative_to(root.parent).as_posix())
    spark.sparkContext.addPyFile(str(out))
    return str(out)


def start_stream(spark: SparkSession, settings: Settings, options: StreamOptions,
                 recorder: MetricsRecorder,
                 processor: BatchProcessor | None = None,
                 trigger_seconds: float | None = None) -> StreamingQuery:
    """Build and start the micro-batch query (returns at once).

    ``processor``: the ``foreachBatch`` function (default: a new one); the caller
    :meth:`BatchProcessor.close` s it once the query has stopped. ``trigger_seconds``:
    default ``stream_trigger_seconds`` (:func:`trigger_seconds_of`).
    """
    checkpoint = query_checkpoint(settings)
    check_checkpoint_topic(spark, checkpoint, settings)
    dedup_layout = check_checkpoint(spark, checkpoint, settings)
    records = checked_records(read_kafka(spark, settings), settings, dedup_layout)
    if processor is None:
        processor = BatchProcessor(settings, checkpoint, recorder, online=options.online,
                                   snapshots=options.snapshots)
    if options.online and options.snapshots:
        from pipelines.streaming.snapshot import warm_reader

        warm_reader()
    writer = (
        records.writeStream.queryName(QUERY_NAME)
        .option("checkpointLocation", checkpoint)
        .foreachBatch(processor)
    )
    if options.stop == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        seconds = settings.stream_trigger_seconds if trigger_seconds is None else trigger_seconds
        writer = writer.trigger(processingTime=f"{seconds} seconds")
    with scheduler_pool(spark, STREAM_POOL):
        query = writer.start()
    processor.query = query  # its batches hold for a graceful stop (stop_gracefully)
    return query


def trigger_seconds_of(settings: Settings, realtime: bool) -> float:
    """The micro-batch query's trigger interval: ``stream_trigger_seconds``, or, beside a
    Real-time query (which serves the online features), the longer
    ``stream_realtime_offline_trigger_seconds`` for the Parquet sinks alone."""
    return (settings.stream_realtime_offline_trigger_seconds if realtime
            else settings.stream_trigger_seconds)


def idle_wait_seconds(idle_seconds: float, trigger_seconds: float) -> float:
    """How long the job must look idle before ``--until-idle`` stops it: the query learns
    of new input only when it triggers, so a wait shorter than a trigger interval could
    stop it with input waiting (processed by the next start, but not "idle")."""
    return max(idle_seconds, trigger_seconds + IDLE_MARGIN_SECONDS)


IDLE_MARGIN_SECONDS = 2.0
"""Beyond one trigger interval: time for the trigger's check of Kafka to complete."""


def _caught_up(query: StreamingQuery) -> bool:
    """True when no batch is running, no new data is waiting, and a batch has completed."""
    status = query.status
    if status.get("isDataAvailable") or status.get("isTriggerActive"):
        return False
    return query.lastProgress is not None


def run_stream(settings: Settings, options: StreamOptions | None = None,
               spark: SparkSession | None = None,
               on_started: Callable[[StreamingQuery], None] | None = None,
               stop_session: bool = False, stop_on_signals: bool = False) -> MetricsRecorder:
    """Run the streaming job until it is stopped (or caught up, per ``options``).

    Parameters
    ----------
    spark
        A session with the Kafka connector (default: one from settings).
    on_started
        Called with the micro-batch query once it runs (tests, benchmarks).
    stop_session
        Stop the Spark session at the end (the CLI; lets the listener bus drain).
    stop_on_signals
        SIGTERM or SIGINT (from the main thread) stops the job after its running
        batch, as the end of ``--until-idle`` does; a second one at once
        (:class:`pipelines.signals.GracefulStop`; the CLI).

    Returns
    -------
    MetricsRecorder
        Per-batch figures and totals of this run.
    """
    options = options or StreamOptions()
    spark = spark or _spark_for(settings, latency=settings.stream_mode == "realtime" and options.online)
    recorder = MetricsRecorder(settings)
    pulse = None
    if not options.online:  # Real-time Mode's Parquet sinks' process: its driver watches it
        from pipelines.streaming.offline_process import pulse_from_env

        pulse = pulse_from_env(settings.stream_trigger_seconds)
    listener = ProgressListener(recorder, on_event=pulse)
    spark.streams.addListener(listener)
    graceful = GracefulStop("stream")
    state: str | None = None  # what `shopstream status` shows once the query started
    try:
        if stop_on_signals:
            graceful.__enter__()  # after the session: PySpark installs its own SIGINT handler
        if settings.stream_mode == "realtime" and options.online:
            from pipelines.streaming.offline_process import OfflineSinksProcess
            from pipelines.streaming.realtime import check_slots, start_realtime

            check_slots(spark, settings)
            rtm = start_realtime(spark, settings, snapshots=options.snapshots)
            # the Parquet sinks' micro-batch query: a process of its own, at a lower priority
            sinks = OfflineSinksProcess(settings, stop=options.stop,
                                        idle_seconds=options.idle_seconds,
                                        snapshots=options.snapshots)
            sinks.start()
            recorder.publish_state("running")
            state = "failed"
            try:
                why = _wait_realtime(rtm, sinks, options, stop_requested=graceful.requested,
                                     grace_seconds=settings.stream_stop_grace_seconds,
                                     recorder=recorder)
            except BaseException as exc:
                state = _failed_state(exc)
                raise
            state = f"stopped: {graceful.signal_name}" if why == "signal" else f"stopped: {why}"
            return recorder
        processor = BatchProcessor(settings, query_checkpoint(settings), recorder,
                                   online=options.online, snapshots=options.snapshots)
        trigger_seconds = settings.stream_trigger_seconds
        query = start_stream(spark, settings, options, recorder, processor, trigger_seconds)
        log.info("stream %s started: topic %s, checkpoint %s, trigger %s", QUERY_NAME,
                 settings.kafka_topic_events, query_checkpoint(settings),
                 "availableNow" if options.stop == "available_now"
                 else f"{trigger_seconds}s" + (" (Parquet sinks only)" if not options.online
                                               else ""))
        if options.stop == "idle":
            options = replace(options, idle_seconds=idle_wait_seconds(options.idle_seconds,
                                                                      trigger_seconds))
        recorder.publish_state("running")
        state = "failed"
        poller = None
        if options.realtime_snapshots:
            from pipelines.streaming.rt_snapshots import SnapshotPoller

            poller = SnapshotPoller(settings, spark)
            poller.start()
        if on_started is not None:
            on_started(query)
        try:
            why = _wait(query, options, stop_requested=graceful.requested,
                        grace_seconds=settings.stream_stop_grace_seconds, processor=processor,
                        beside=poller.check if poller is not None else None,
                        # the Parquet sinks' process beside a Real-time driver is not the job
                        recorder=recorder if options.online else None)
        except BaseException as exc:
            state = _failed_state(exc)
            with contextlib.suppress(Exception):  # the query's own failure is the one to report
                processor.close()
            if poller is not None:
                with contextlib.suppress(Exception):
                    poller.stop(drain=False)
            raise
        processor.close()
        if not listener.wait_terminated(str(query.id)):
            log.warning("stream: the end of query %s did not reach its listener within 10 s; "
                        "the last batches' figures may be missing", query.id)
        if poller is not None:
            try:
                poller.stop()  # the snapshots asked for by now are written first
            except RuntimeError as exc:
                state = _failed_state(exc)
                raise StreamFailed(str(exc)) from exc
        state = f"stopped: {graceful.signal_name}" if why == "signal" else f"stopped: {why}"
    finally:
        graceful.__exit__(None, None, None)
        if state is not None:
            recorder.publish_state(state)
        if stop_session:
            spark.stop()
        else:
            spark.streams.removeListener(listener)
        recorder.flush()
    return recorder


def _failed_state(exc: BaseException) -> str:
    """What ``shopstream status`` shows for a job that ended with ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return "stopped: interrupted"
    return f"failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"


def _wait_realtime(rtm: Any, sinks: Any, options: StreamOptions,
                   stop_requested: threading.Event, grace_seconds: float = 120.0,
                   recorder: MetricsRecorder | None = None) -> str:
    """:func:`_wait` for Real-time Mode: the Real-time query and its feed here, the Parquet
    sinks in their process (:class:`pipelines.streaming.offline_process.OfflineSinksProcess`,
    started with the same stop condition). Stops both; raises :class:`StreamFailed` if
    either failed."""
    deadline = time.monotonic() + options.timeout_seconds if options.timeout_seconds else None
    idle_since: float | None = None
    why = "caught up"
    try:
        while True:
            if stop_requested.is_set():
                why = "signal"
                break
            if _query_ended(rtm.query, 0.5):
                break
            try:
                rtm.check()
            except RuntimeError as exc:  # a tile feed failed: its tiles would wait unapplied
                raise StreamFailed(str(exc)) from exc
            if recorder is not None:
                # whether input waits is not known here: the query reports progress once
                # an epoch ends (every stream_realtime_checkpoint_seconds); its freshness is
                # in the feed's rt_ figures
                recorder.heartbeat(None)
            escalations = sinks.escalations
            try:
                sinks_done = sinks.check()
            except RuntimeError as exc:  # the sinks' process failed: so does the job
                raise StreamFailed(str(exc)) from exc
            if sinks.escalations != escalations and recorder is not None:  # it had stalled
                recorder.publish_sinks_escalation(sinks.escalation_why)
            if deadline is not None and time.monotonic() > deadline:
                log.warning("stream: timeout after %.0f s, stopping", options.timeout_seconds)
                why = "timeout"
                break
            if options.stop == "never":
                if sinks_done:
                    raise StreamFailed("the Parquet sinks' process (shopstream stream "
                                       "--offline-only) stopped by itself")
            elif sinks_done and rtm.caught_up():
                # the sinks stopped by the same rule (idle, or all that was there at start)
                idle_since = idle_since or time.monotonic()
                if options.stop == "available_now" or (
                        time.monotonic() - idle_since >= options.idle_seconds):
                    why = "idle" if options.stop == "idle" else "caught up"
                    if why == "idle":
                        log.info("stream: no new input for %.0f s, stopping", options.idle_seconds)
                    break
            else:
                idle_since = None
    finally:
        try:
            sinks.stop(grace_seconds)
        finally:
            rtm.stop()
    exc = rtm.query.exception()
    if exc is not None:
        raise StreamFailed(_summarize(exc)) from exc
    try:
        sinks.check()
    except RuntimeError as exc:
        raise StreamFailed(str(exc)) from exc
    return why


def _query_ended(query: StreamingQuery, seconds: float) -> bool:
    """Whether ``query`` has ended, waiting up to ``seconds``: by itself, or by a failure,
    which ``awaitTermination`` raises (the caller then reads it from ``query.exception()``,
    summarized; raised here, it escaped as a traceback whenever the query failed during
    the wait rather than between two)."""
    from pyspark.errors import StreamingQueryException

    try:
        return bool(query.awaitTermination(seconds))
    except StreamingQueryException:
        return True


def _wait(query: StreamingQuery, options: StreamOptions,
          stop_requested: threading.Event | None = None, grace_seconds: float = 120.0,
          processor: BatchProcessor | None = None,
          beside: Callable[[], None] | None = None,
          recorder: MetricsRecorder | None = None) -> str:
    """Until the query ends or a stop condition holds; then stop it.

    Returns why: ``signal``, ``timeout``, ``idle`` or ``caught up`` (it ended by itself,
    as an available-now run does); raises :class:`StreamFailed` if it failed, or if
    ``beside`` (the check of work running beside the query) raised.
    """
    deadline = time.monotonic() + options.timeout_seconds if options.timeout_seconds else None
    idle_since: float | None = None
    why = "caught up"
    try:
        while query.isActive:
            if stop_requested is not None and stop_requested.is_set():
                why = "signal"  # the running batch finishes below (stop_gracefully)
                break
            if _query_ended(query, 0.5):
                break
            if recorder is not None:  # `shopstream status` tells a dead job by its silence
                recorder.heartbeat(lambda: caught_up_of(query.lastProgress))
            if beside is not None:
                try:
                    beside()
                except RuntimeError as exc:
                    raise StreamFailed(str(exc)) from exc
            if deadline is not None and time.monotonic() > deadline:
                log.warning("stream: timeout after %.0f s, stopping", options.timeout_seconds)
                why = "timeout"
                break
            if options.stop == "idle":
                if _caught_up(query):
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since >= options.idle_seconds:
                        log.info("stream: no new input for %.0f s, stopping", options.idle_seconds)
                        why = "idle"
                        break
                else:
                    idle_since = None
    finally:
        if query.isActive:
            stop_gracefully(query, wait_seconds=grace_seconds, processor=processor)
    exc = query.exception()
    if exc is not None:
        raise StreamFailed(_summarize(exc)) from exc
    return why


def stop_gracefully(query: StreamingQuery, wait_seconds: float = 120.0,
                    processor: BatchProcessor | None = None) -> None:
    """Let a running micro-batch finish, then stop.

    Interrupting a batch is safe (it is replayed on restart), but its work is lost,
    and Spark 4.3 then checks the interruption with a regular expression over the
    whole error text, which includes the (large) plan, and can overflow the stream
    thread's stack. With the query's ``processor``, the batch that ends next holds
    the stream thread until the stop (:meth:`BatchProcessor.hold_if_stopping`), so
    no next batch starts in between, which a query that is behind would do at once;
    without it, between two batches is the moment polled for. After ``wait_seconds``
    the query is stopped wherever it is.
    """
    if processor is not None:
        processor.stopping.set()
    deadline = time.monotonic() + wait_seconds
    while query.isActive and time.monotonic() < deadline:
        if processor is not None and processor.holding.is_set():
            break
        if not query.status.get("isTriggerActive"):
            break
        time.sleep(0.05)
    query.stop()


class StreamFailed(RuntimeError):
    """The query stopped with an error; the message is its gist, not the plan dump."""


def _summarize(exc: BaseException) -> str:
    """The error class and the innermost Python/Java error line of a query failure."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = lines[0][:300] if lines else type(exc).__name__
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    cause = causes[-1][:300] if causes else ""
    return f"{head} -- {cause}" if cause and cause not in head else head
