"""The streaming peer: Feast's own Spark Kafka processor writing user features to Redis.

This is what a Feast user would run instead of ``shopstream stream``:
``feast.infra.contrib.spark_kafka_processor.SparkKafkaProcessor`` with a
``StreamFeatureView`` over a ``KafkaSource`` (JSON), a Spark transformation,
and ``write_to_online_store`` into the same kind of Redis.

The transformation is deliberately cheaper than shopstream's features (per-user
running counters by event type, spend and last event time: no sliding windows,
no validation, no dedup, no quarantine, no offline sink), so the measured ratio
flatters the peer rather than shopstream.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["run_feast_spark_processor"]

FEAST_CHECKPOINT = Path("/tmp/checkpoint")
"""Where ``SparkKafkaProcessor`` checkpoints its query: hard-coded by Feast (not configurable).
A checkpoint left by an earlier run names another topic (of another broker), and the query
then waits for partition positions that never come; each run removes it before and after."""

JSON_SCHEMA = (
    "event_id STRING, event_type STRING, event_time TIMESTAMP, user_id STRING, "
    "session_id STRING, item_id STRING, category_id STRING, region STRING, "
    "price DOUBLE, quantity INT, device STRING"
)


def _feature_store(settings: Any, repo: Path) -> Any:
    from feast import FeatureStore, RepoConfig
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig

    host, port = settings.redis_address
    parts = [f"{host}:{port}", f"db={settings.redis_db}"]
    if settings.redis_secret():
        parts.append(f"password={settings.redis_secret()}")
    config = RepoConfig(
        project="shopstream_peer",
        provider="local",
        registry=str(repo / "registry.db"),
        online_store=RedisOnlineStoreConfig(connection_string=",".join(parts)),
        offline_store={"type": "file"},
        entity_key_serialization_version=3,
    )
    repo.mkdir(parents=True, exist_ok=True)
    return FeatureStore(config=config, repo_path=str(repo))


def _empty_batch_source(path: Path) -> None:
    """The StreamFeatureView's batch source: Feast's ``apply`` reads its schema, so it must exist."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("user_id", pa.string()), ("views", pa.int64()), ("add_to_carts", pa.int64()),
                        ("purchases", pa.int64()), ("spend", pa.float64()),
                        ("event_time", pa.timestamp("us", tz="UTC"))])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(schema.empty_table(), path)


def _transform(df: Any) -> Any:
    from pyspark.sql import functions as F

    spend = F.when(F.col("event_type") == "purchase", F.col("price") * F.col("quantity")).otherwise(0.0)
    # The least a Feast user must do with this backlog's malformed records: Feast's Redis
    # writer fails the whole batch on a null entity key or a null (NaT) event time.
    df = df.where(F.col("user_id").isNotNull() & F.col("event_time").isNotNull())
    return df.groupBy("user_id").agg(
        F.count_if(F.col("event_type") == "view").cast("long").alias("views"),
        F.count_if(F.col("event_type") == "add_to_cart").cast("long").alias("add_to_carts"),
        F.count_if(F.col("event_type") == "purchase").cast("long").alias("purchases"),
        F.sum(spend).alias("spend"),
        F.max("event_time").alias("event_time"),
    )


def run_feast_spark_processor(
    settings: Any, spark: Any, *, topic: str, expected_events: int, max_seconds: float, workdir: Path
) -> dict[str, Any]:
    """Drain ``expected_events`` from ``topic`` with Feast's processor; report events/s.

    Returns a dict with ``events``, ``seconds``, ``events_per_s``, per-batch
    ``(elapsed_s, rows_per_s)`` points for a throughput-over-time plot and per-batch
    ``(input rows, duration ms)`` in ``batches``.
    """
    import shutil

    from feast import Entity, Field, FileSource, KafkaSource
    from feast.data_format import JsonFormat, ParquetFormat
    from feast.infra.contrib.spark_kafka_processor import SparkKafkaProcessor, SparkProcessorConfig
    from feast.stream_feature_view import StreamFeatureView
    from feast.types import Float64, Int64

    shutil.rmtree(FEAST_CHECKPOINT, ignore_errors=True)
    store = _feature_store(settings, workdir / "feast_peer")
    _empty_batch_source(workdir / "peer_batch.parquet")
    user = Entity(name="user", join_keys=["user_id"])
    batch = FileSource(
        name="peer_batch", path=str(workdir / "peer_batch.parquet"),
        timestamp_field="event_time", file_format=ParquetFormat(),
    )
    source = KafkaSource(
        name="peer_clickstream",
        kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        topic=topic,
        timestamp_field="event_time",
        message_format=JsonFormat(schema_json=JSON_SCHEMA),
        batch_source=batch,
        watermark_delay_threshold=timedelta(minutes=10),
    )
    view = StreamFeatureView(
        name="peer_user_activity",
        entities=[user],
        ttl=timedelta(days=1),
        source=source,
        schema=[
            Field(name="views", dtype=Int64),
            Field(name="add_to_carts", dtype=Int64),
            Field(name="purchases", dtype=Int64),
            Field(name="spend", dtype=Float64),
        ],
        timestamp_field="event_time",
        mode="spark",
        udf=_transform,
        online=True,
    )
    store.apply([user, view])
    processor = SparkKafkaProcessor(
        fs=store,
        sfv=view,
        config=SparkProcessorConfig(
            mode="spark", source="kafka", spark_session=spark,
            processing_time="0 seconds", query_timeout=int(max_seconds),
        ),
        stream_source_options={
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(settings.stream_max_offsets_per_trigger),
            "failOnDataLoss": "false",
            # the consumer's default 60 s to find a partition's position is not enough on a
            # saturated machine (seen at load ~25: the peer's query failed)
            "kafka.default.api.timeout.ms": "300000",
        },
    )
    runner = threading.Thread(target=processor.ingest_stream_feature_view, daemon=True)
    started = time.monotonic()
    runner.start()
    points: list[tuple[float, float]] = []
    batches: list[tuple[int, float]] = []
    processed = 0
    busy_ms = 0.0
    seen_batches: set[int] = set()
    deadline = started + max_seconds
    error: str | None = None
    while time.monotonic() < deadline and processed < expected_events:
        time.sleep(0.5)
        if not runner.is_alive() and not spark.streams.active:
            error = "Feast's processor stopped (its query failed; see the log above)"
            break
        for query in spark.streams.active:
            for progress in query.recentProgress:
                batch_id = progress["batchId"]
                if batch_id in seen_batches or progress["numInputRows"] == 0:
                    continue
                seen_batches.add(batch_id)
                processed += progress["numInputRows"]
                busy_ms += float((progress.get("durationMs") or {}).get("triggerExecution", 0))
                batches.append((int(progress["numInputRows"]),
                                float((progress.get("durationMs") or {}).get("triggerExecution", 0))))
                points.append((time.monotonic() - started, progress.get("processedRowsPerSecond", 0.0)))
    elapsed = time.monotonic() - started
    for query in spark.streams.active:
        query.stop()
    runner.join(timeout=30)
    shutil.rmtree(FEAST_CHECKPOINT, ignore_errors=True)
    return {
        "events": processed,
        "seconds": elapsed,
        "events_per_s": processed / elapsed if elapsed else 0.0,
        "busy_s": busy_ms / 1000,
        "busy_events_per_s": processed / (busy_ms / 1000) if busy_ms else 0.0,
        "points": points,
        "batches": batches,
        "drained": processed >= expected_events,
        "error": error,
    }
