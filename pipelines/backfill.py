"""Batch backfill: events -> feature snapshots at a series of as-of times (+ Redis).

Usage::

    shopstream backfill --since 2010-12-01T00:00 --until 2011-01-31T00:00 --every 60
    shopstream backfill --source replay.jsonl            # a replay / generator file
    spark-submit -m pipelines.cli backfill ...           # same job on a cluster

The job is read -> transform -> write:

1. **Read** validated events for ``[since - 24h, until]``, either from the
   offline store (:func:`pipelines.offline_store.read_events`, pruned to the
   days in range) or from a replay file (JSON lines of raw records, as written
   by ``shopstream generate/replay --output``; or CSV / Parquet with the
   contract's field names) pushed through the contract
   (:func:`features.validation.validate_events`): rejected rows go to the
   quarantine with their reason, as in the stream. Events are deduplicated by
   ``event_id`` and ``event_time``, as in the stream (a copy of an event carries both).
2. **Transform** with :func:`features.windows.features_over_time`: the same tile
   and finalize functions as the stream, at ``T_j = since + j * step`` for every
   ``T_j <= until``. Batch has no arrival order, so "late" does not exist here:
   every event counts in every window it falls in.
3. **Write** the snapshots (``user_activity``, ``item_stats``, ``top_items``) to
   the offline store (:func:`pipelines.offline_store.write_snapshots`), all rows
   of one run with one ``created`` value; optionally **materialize** the values
   as of the last ``T_j`` into Redis (entity features in Feast's layout, top
   sellers / trending lists, item metadata) through
   :mod:`pipelines.online_writer`, after ``feast apply``; and record a lineage
   manifest (:mod:`pipelines.lineage`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from features.events import EVENT_IDENTITY, FIELDS, VALID_COLUMNS
from features.feast_layout import ITEM_STATS, USER_ACTIVITY
from features.windows import LONG_WINDOW, WINDOW_SECONDS, features_over_time
from pipelines import lineage, offline_store
from pipelines.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SourceFormat",
    "BackfillResult",
    "read_replay_file",
    "as_of_series",
    "default_range",
    "run_backfill",
]

logger = logging.getLogger(__name__)

SourceFormat = Literal["jsonl", "csv", "parquet"]
_SUFFIXES: dict[str, SourceFormat] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv", ".parquet": "parquet", ".pq": "parquet",
}


@dataclass
class BackfillResult:
    """What a backfill did; also recorded in its lineage manifest."""

    run_id: str
    since: datetime
    until: datetime
    step_seconds: int
    as_of_count: int
    rows: dict[str, int] = field(default_factory=dict)
    online: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    manifest_path: str = ""
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


def _format_of(path: str, fmt: SourceFormat | None) -> SourceFormat:
    if fmt is not None:
        return fmt
    suffix = Path(path.rstrip("/")).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    raise ValueError(f"cannot tell the format of {path!r}; pass jsonl, csv or parquet")


def read_replay_file(
    spark: SparkSession,
    path: str,
    fmt: SourceFormat | None = None,
    *,
    preset: str | None = None,
    mapping: Sequence[str] = (),
) -> DataFrame:
    """Raw records (``key``, ``value`` binary) from a replay file, ready for ``validate_events``.

    ``jsonl``: the ``--output`` format of ``shopstream generate`` / ``replay``, read
    by :func:`pipelines.producer.read_records` (``{"key": .., "value": base64}``
    per line, byte for byte what would travel on the topic). ``csv`` / ``parquet``:
    mapped to records by :func:`pipelines.replay.plan_replay` -- with ``preset``
    (e.g. ``online-retail``) and ``--map`` style ``mapping`` overrides, or, with
    neither, columns named like the contract's fields -- exactly as ``shopstream
    replay`` would send them.
    """
    fmt = _format_of(path, fmt)
    if fmt == "jsonl":
        from pipelines.producer import read_records

        keys, values = [], []
        for key, value in read_records(Path(path)):
            keys.append(key)
            values.append(value)
        return _records_frame(spark, keys, values)
    from pipelines.replay import PRESETS, Source, load_table, parse_mapping, plan_replay

    table = load_table(Path(path))
    overrides = parse_mapping(mapping)
    chosen = None
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
        chosen = PRESETS[preset]
    elif not overrides:
        overrides = {f.name: Source(column=f.name) for f in FIELDS if f.name in table.columns}
    plan = plan_replay(table, Path(path), preset=chosen, overrides=overrides)
    return _records_frame(spark, plan.keys, plan.values)


def _records_frame(spark: SparkSession, keys: list[bytes | None], values: list[bytes]) -> DataFrame:
    """``key``/``value`` binary rows, shipped to the JVM as one Arrow table (not row by row)."""
    import pyarrow as pa

    table = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())})
    return spark.createDataFrame(table)


def _floor(ts: datetime, step: int) -> datetime:
    epoch = int(ts.timestamp())
    return datetime.fromtimestamp(epoch - epoch % step, tz=UTC)


def _ceil(ts: datetime, step: int) -> datetime:
    floored = _floor(ts, step)
    return floored if floored == ts else floored + timedelta(seconds=step)


def default_range(first: datetime, last: datetime, step_seconds: int,
                  now: datetime) -> tuple[datetime, datetime]:
    """The as-of range when none is given: the events' span rounded out to the step, but
    never past ``now`` (or the last event, if that is later: the contract allows a little
    future). A later last as-of would be a future feature timestamp, and the online
    store keeps the newest timestamp, so the stream's writes would be skipped until the
    wall clock caught up with it."""
    until = _ceil(last, step_seconds)
    return _floor(first, step_seconds), min(until, max(last, now))


def as_of_series(since: datetime, until: datetime, step_seconds: int) -> tuple[datetime, int]:
    """``(start, count)`` of ``T_j = since + j * step <= until``."""
    if until < since:
        raise ValueError(f"--until ({until}) is before --since ({since})")
    count = int((until - since).total_seconds() // step_seconds) + 1
    return since, count


def _utc(ts: datetime | None) -> datetime | None:
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _read(
    spark: SparkSession, settings: Settings, source: str | None, fmt: SourceFormat | None,
    since: datetime | None, until: datetime | None, manifest: lineage.Manifest,
    preset: str | None = None, mapping: Sequence[str] = (),
) -> tuple[DataFrame, dict[str, int]]:
    """Validated, deduplicated events (``VALID_COLUMNS``) and row counts."""
    from pyspark.sql import functions as F

    from features.validation import validate_events, with_verdict

    read_from = since - timedelta(seconds=WINDOW_SECONDS[LONG_WINDOW]) if since else None
    counts: dict[str, int] = {}
    if source is None:
        events = offline_store.read_events(spark, settings, read_from, until)
        files = events.inputFiles()
        manifest.inputs.update(source="offline_store", path=offline_store.events_path(settings),
                               format="parquet")
    else:
        fmt = _format_of(source, fmt)
        raw = read_replay_file(spark, source, fmt, preset=preset, mapping=mapping)
        files = [source]
        # Validate once: persist the verdicts; validate_events(raw, same now) then reads
        # them from the cache (Spark matches the identical plan) instead of re-validating.
        for name, typ in (("key", "binary"), ("topic", "string"), ("partition", "int"),
                          ("offset", "bigint"), ("timestamp", "timestamp")):
            raw = raw.withColumn(name, F.lit(None).cast(typ))
        now = datetime.now(UTC)
        checked = with_verdict(raw, now=now).persist()
        verdicts = {r["reason"]: r["n"] for r in
                    checked.groupBy("reason").agg(F.count(F.lit(1)).alias("n")).collect()}
        counts["read"] = sum(verdicts.values())
        counts["quarantined"] = counts["read"] - verdicts.get(None, 0)
        valid, quarantine = validate_events(raw, now=now)
        if counts["quarantined"]:
            offline_store.write_quarantine(quarantine, settings)
            manifest.inputs["quarantine_reasons"] = dict(
                sorted((k, v) for k, v in verdicts.items() if k is not None))
        events = valid.select(*VALID_COLUMNS)
        if read_from is not None:
            events = events.where(F.col("event_time") >= F.lit(read_from))
        if until is not None:
            events = events.where(F.col("event_time") <= F.lit(until))
        manifest.inputs.update(source="file", path=source, format=fmt, preset=preset,
                               mapping=list(mapping))
    manifest.inputs["files"] = [vars(f) for f in lineage.file_fingerprints(files)]

    events = events.persist()
    total = events.count()
    events_unique = events.dropDuplicates(list(EVENT_IDENTITY)).persist()
    counts["in_range"] = total
    counts["used"], digest = lineage.dataframe_digest(events_unique, VALID_COLUMNS)
    counts["duplicates"] = total - counts["used"]
    events.unpersist()
    if source is not None:
        checked.unpersist()
    manifest.inputs["digest"] = digest
    return events_unique, counts


def run_backfill(
    settings: Settings,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    step_seconds: int | None = None,
    source: str | Path | None = None,
    source_format: SourceFormat | None = None,
    preset: str | None = None,
    mapping: Sequence[str] = (),
    materialize: bool = True,
    spark: SparkSession | None = None,
) -> BackfillResult:
    """Run one backfill; see the module docstring.

    Parameters
    ----------
    settings
        Paths, Redis, the slide, top N, last-items N, and the default step.
    since, until
        The as-of range (UTC; naive means UTC). Default: the events' first and last
        times, rounded out to the step, never past now (:func:`default_range`).
    step_seconds
        Snapshot cadence (default ``settings.backfill_step_seconds``).
    source, source_format, preset, mapping
        A replay file instead of the offline store (see :func:`read_replay_file`).
    materialize
        Also write the values as of the last as-of time to Redis.
    spark
        A session (default: :func:`pipelines.spark.spark_session` without Kafka jars).

    Returns
    -------
    BackfillResult
    """
    from pyspark.sql import functions as F

    from pipelines.spark import spark_session

    started = time.monotonic()
    started_at = datetime.now(UTC)
    created = started_at.replace(microsecond=0)
    run_id = lineage.new_run_id(started_at)
    step = int(step_seconds or settings.backfill_step_seconds)
    since, until = _utc(since), _utc(until)
    spark = spark or spark_session(settings, app_name="shopstream-backfill", kafka=False)
    offline_store.configure_parquet(spark)
    manifest = lineage.Manifest(kind="backfill", run_id=run_id, started_at=lineage.iso(started_at))

    # --- read: validated, deduplicated events -------------------------------
    source_text = str(source) if source is not None else None
    events, counts = _read(spark, settings, source_text, source_format, since, until, manifest,
                           preset, mapping)
    timings = {"read": round(time.monotonic() - started, 3)}
    if since is None or until is None:
        bounds = events.agg(F.min("event_time"), F.max("event_time")).first()
        if bounds is None or bounds[0] is None:
            raise ValueError("no events to backfill (empty source or range)")
        first, last = default_range(bounds[0].replace(tzinfo=UTC), bounds[1].replace(tzinfo=UTC),
                                    step, started_at)
        since, until = since or first, until or last
    start, count = as_of_series(since, until, step)
    last_as_of = start + timedelta(seconds=step * (count - 1))
    manifest.inputs["time_range"] = {
        "since": lineage.iso(since - timedelta(seconds=WINDOW_SECONDS[LONG_WINDOW])),
        "until": lineage.iso(until),
    }
    manifest.inputs["rows"] = counts
    manifest.parameters = {
        "since": lineage.iso(since), "until": lineage.iso(until), "step_seconds": step,
        "as_of_count": count, "last_as_of": lineage.iso(last_as_of),
        "slide_seconds": settings.feature_slide_seconds, "top_n": settings.feature_top_n,
        "last_items_n": settings.feature_last_items_n, "materialize": materialize,
    }
    logger.info("backfill %s: %d events, %d as-of times %s .. %s every %ds",
                run_id, counts["used"], count, since, last_as_of, step)

    # --- transform: the shared tile + finalize functions --------------------
    frames = features_over_time(
        events, start=start, step_seconds=step, count=count,
        slide_seconds=settings.feature_slide_seconds,
        last_items_n=settings.feature_last_items_n, top_n=settings.feature_top_n,
        created=created,
    )

    # --- write: snapshots, then the online store, then the manifest ---------
    result = BackfillResult(run_id, since, until, step, count, timings=timings)
    for name, rows in (("user_activity", frames.users), ("item_stats", frames.items),
                       ("top_items", frames.top_items)):
        path = offline_store.write_snapshots(rows, settings, name)
        written = (spark.read.parquet(path)
                   .where(F.col("created") == F.lit(created))
                   .where(F.col("event_date").between(f"{start:%Y-%m-%d}", f"{last_as_of:%Y-%m-%d}"))
                   .count())
        result.rows[name] = written
        result.outputs[name] = path
        manifest.outputs[name] = {
            "path": path, "rows": written, "created": lineage.iso(created),
            "as_of": [lineage.iso(start), lineage.iso(last_as_of)],
        }
        timings[name] = round(time.monotonic() - started - sum(timings.values()), 3)
    if materialize:
        result.online = materialize_latest(settings, events, last_as_of, created)
        manifest.online = dict(result.online)
        timings["materialize"] = round(time.monotonic() - started - sum(timings.values()), 3)
    result.rows.update({f"events_{k}": v for k, v in counts.items()})
    events.unpersist()

    result.seconds = round(time.monotonic() - started, 3)
    manifest.finished_at = lineage.iso(datetime.now(UTC))
    manifest.parameters["seconds"] = result.seconds
    manifest.parameters["timings"] = timings
    result.manifest_path = lineage.write_manifest(settings, manifest)
    logger.info("backfill %s done in %.1fs: %s", run_id, result.seconds, result.rows)
    return result


def snapshot_rows(spark: SparkSession, settings: Settings, name: str, as_of: datetime,
                  created: datetime) -> DataFrame:
    """The rows one run wrote to a snapshot table for one as-of time (partition-pruned)."""
    from pyspark.sql import functions as F

    return (spark.read.parquet(offline_store.snapshot_path(settings, name))
            .where(F.col("event_date") == F.lit(f"{as_of:%Y-%m-%d}"))
            .where(F.col("event_timestamp") == F.lit(as_of))
            .where(F.col("created") == F.lit(created))
            .drop("event_date"))


def materialize_latest(
    settings: Settings, events: DataFrame, as_of: datetime, created: datetime
) -> dict[str, int]:
    """Write the snapshot rows as of ``as_of`` to Redis: entity features, top lists, item metadata.

    The rows are read back from this run's snapshots, so Redis holds exactly
    what the offline store holds for that time.
    """
    from pyspark.sql import functions as F

    from features.tiles import item_metadata
    from pipelines.connections import redis_client
    from pipelines.feast_store import feature_store
    from pipelines.online_writer import write_entity_rows, write_item_metadata, write_top_items

    spark = events.sparkSession
    feature_store(settings, apply=True)  # registry in place for get_online_features readers
    client = redis_client(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 5000))
    counts: dict[str, int] = {}
    try:
        # the rows of one as-of time (entities active in 24h) stream through the driver,
        # partition by partition, in pipelined batches: no Python workers to start
        for spec in (USER_ACTIVITY, ITEM_STATS):
            rows = snapshot_rows(spark, settings, spec.name, as_of, created).select(
                spec.join_key, *spec.feature_names, "event_timestamp")
            counts[spec.name] = write_entity_rows(
                client, spec, rows.toLocalIterator(), ttl_seconds=settings.online_ttl_seconds)
        top = snapshot_rows(spark, settings, "top_items", as_of, created)
        counts["top_lists"] = write_top_items(client, top.toLocalIterator(),
                                              top_n=settings.feature_top_n, prune=True)
        metadata = item_metadata(events.where(F.col("event_time") <= F.lit(as_of)))
        counts["item_metadata"] = write_item_metadata(
            client, metadata.toLocalIterator(), ttl_seconds=settings.online_ttl_seconds)
    finally:
        client.close()
    return counts
