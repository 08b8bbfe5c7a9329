"""The Parquet offline store's layout: one module that the stream and the backfill share.

Everything lives under ``settings.offline_path`` (``<data_dir>/offline``, or an
``s3a://`` URI)::

    events/event_date=yyyy-MM-dd/event_hour=H/part-*.parquet   validated events
    quarantine/ingest_date=yyyy-MM-dd/part-*.parquet           rejected records + reason
    features/user_activity/event_date=yyyy-MM-dd/...           Feast file source (user)
    features/item_stats/event_date=yyyy-MM-dd/...              Feast file source (item)
    features/top_items/event_date=yyyy-MM-dd/...               top sellers / trending history
    features/_stream_staging/<stage>/<table>/...               a stream snapshot being moved in

* Events: columns :data:`features.events.VALID_COLUMNS` plus the partition
  columns ``event_date`` (the UTC date of ``event_time``, in folders named
  ``yyyy-MM-dd``) and ``event_hour`` (int 0-23).
* Quarantine: :data:`features.validation.QUARANTINE_COLUMNS` plus
  ``ingest_date`` (``yyyy-MM-dd`` of ``ingest_time``; rejected records may have
  no valid event time).
* Feature snapshots: the finalize outputs of :mod:`features.windows`, with
  ``event_timestamp`` (the as-of time) and ``created`` (when computed), as
  Feast's file sources expect, partitioned by ``event_date`` of
  ``event_timestamp``. Snapshots are appended; a re-computed ``(entity,
  event_timestamp)`` row wins by its later ``created`` (Feast deduplicates on
  it), so a backfill can run again over a range the stream already covered.

Timestamps are written as Parquet ``TIMESTAMP_MICROS`` (UTC-adjusted), which
pyarrow, pandas and Feast read as ``datetime64[us, UTC]``.
"""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from features.events import VALID_COLUMNS
from features.validation import QUARANTINE_COLUMNS
from pipelines.settings import Settings

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "EVENTS",
    "QUARANTINE",
    "FEATURES",
    "SNAPSHOTS",
    "EVENT_PARTITION_COLUMNS",
    "QUARANTINE_PARTITION_COLUMNS",
    "SNAPSHOT_PARTITION_COLUMNS",
    "events_path",
    "quarantine_path",
    "snapshot_path",
    "utc_date",
    "utc_hour",
    "with_event_partitions",
    "with_quarantine_partitions",
    "with_snapshot_partitions",
    "write_events",
    "write_quarantine",
    "write_snapshots",
    "write_snapshot_table",
    "local_dir",
    "read_events",
    "NoEventsError",
    "configure_parquet",
]

EVENTS = "events"
QUARANTINE = "quarantine"
FEATURES = "features"
SNAPSHOTS: tuple[str, ...] = ("user_activity", "item_stats", "top_items")
"""Snapshot tables under ``features/`` (the first two are Feast file sources)."""
EVENT_PARTITION_COLUMNS: tuple[str, ...] = ("event_date", "event_hour")
QUARANTINE_PARTITION_COLUMNS: tuple[str, ...] = ("ingest_date",)
SNAPSHOT_PARTITION_COLUMNS: tuple[str, ...] = ("event_date",)
_MICROS_PER_DAY = 86_400_000_000
_MICROS_PER_HOUR = 3_600_000_000

Snapshot = Literal["user_activity", "item_stats", "top_items"]


def events_path(settings: Settings) -> str:
    return f"{settings.offline_path}/{EVENTS}"


def quarantine_path(settings: Settings) -> str:
    return f"{settings.offline_path}/{QUARANTINE}"


def snapshot_path(settings: Settings, name: Snapshot | str) -> str:
    if name not in SNAPSHOTS:
        raise ValueError(f"unknown snapshot {name!r}; one of {SNAPSHOTS}")
    return f"{settings.offline_path}/{FEATURES}/{name}"


def configure_parquet(spark: SparkSession) -> None:
    """Session options every offline-store writer relies on (idempotent)."""
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.conf.set("spark.sql.session.timeZone", "UTC")


def utc_date(timestamp: str) -> Column:
    """The UTC date of a timestamp column, as a ``date``: what ``to_date`` gives in a UTC session.

    From the timestamp's microseconds since the epoch, in whole numbers: ``date_format`` and
    ``hour`` turn every value into a ``ZonedDateTime`` and format it with a
    ``DateTimeFormatter``, 1.7 % of the executors' samples in a profile of a drain (the raw
    sink's partition columns, for every event). It stays a ``date``, not the ``yyyy-MM-dd``
    text, because as a partition column Spark's writer formats it once per directory
    (``event_date=2026-12-05``, the same name the text gives) where a cast to text formatted
    every row (``Iso8601DateFormatter``, 1.3 % of the samples), and its sort on the partition
    columns compares ints instead of strings."""
    from pyspark.sql import functions as F

    return F.date_from_unix_date(_whole(F.unix_micros(timestamp), _MICROS_PER_DAY))


def utc_hour(timestamp: str) -> Column:
    """The hour (0-23) of a timestamp column in UTC, as an int (see :func:`utc_date`)."""
    from pyspark.sql import functions as F

    return _whole(F.pmod(F.unix_micros(timestamp), F.lit(_MICROS_PER_DAY)), _MICROS_PER_HOUR)


def _whole(micros: Column, unit: int) -> Column:
    """How many whole ``unit``s ``micros`` holds, rounded down (before the epoch too), as an int."""
    from pyspark.sql import functions as F

    whole = micros - F.pmod(micros, F.lit(unit))  # a multiple of unit: div is exact
    return F.call_function("div", whole, F.lit(unit)).cast("int")


def with_event_partitions(events: DataFrame) -> DataFrame:
    """Validated events -> :data:`VALID_COLUMNS` + ``event_date``, ``event_hour``."""
    return events.select(
        *VALID_COLUMNS,
        utc_date("event_time").alias("event_date"),
        utc_hour("event_time").alias("event_hour"),
    )


def with_quarantine_partitions(quarantine: DataFrame) -> DataFrame:
    """Quarantine rows -> :data:`QUARANTINE_COLUMNS` + ``ingest_date``."""
    return quarantine.select(*QUARANTINE_COLUMNS, utc_date("ingest_time").alias("ingest_date"))


def with_snapshot_partitions(snapshots: DataFrame) -> DataFrame:
    """Feature rows -> the same columns + ``event_date`` of ``event_timestamp``."""
    return snapshots.withColumn("event_date", utc_date("event_timestamp"))


def write_events(events: DataFrame, settings: Settings) -> None:
    """Append validated events (batch DataFrame; the stream calls it from foreachBatch)."""
    configure_parquet(events.sparkSession)
    (with_event_partitions(events).write.mode("append")
     .partitionBy(*EVENT_PARTITION_COLUMNS).parquet(events_path(settings)))


def write_quarantine(quarantine: DataFrame, settings: Settings) -> None:
    """Append quarantine rows (batch DataFrame)."""
    configure_parquet(quarantine.sparkSession)
    (with_quarantine_partitions(quarantine).write.mode("append")
     .partitionBy(*QUARANTINE_PARTITION_COLUMNS).parquet(quarantine_path(settings)))


def write_snapshots(rows: DataFrame, settings: Settings, name: Snapshot | str, *,
                    path: str | None = None, mode: Literal["append", "overwrite"] = "append") -> str:
    """Append feature rows to a snapshot table; returns its path.

    ``path`` writes the table's layout elsewhere (the stream stages a snapshot there
    before it moves the files in), ``mode`` replaces what is there instead.
    """
    path = path or snapshot_path(settings, name)
    configure_parquet(rows.sparkSession)
    (with_snapshot_partitions(rows).write.mode(mode)
     .partitionBy(*SNAPSHOT_PARTITION_COLUMNS).parquet(path))
    return path


def local_dir(uri: str) -> Path | None:
    """The local folder of a store path (a plain path or ``file:``), else ``None``."""
    if uri.startswith("file:"):
        return Path(uri.removeprefix("file:").removeprefix("//"))
    return None if "://" in uri else Path(uri)


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def write_snapshot_table(table: pa.Table, path: str, created: datetime) -> int:
    """Write Arrow snapshot rows in :func:`write_snapshots`' layout, replacing ``path``;
    returns the rows written. Local paths only (:func:`local_dir`).

    Why without Spark: the stream writes a snapshot beside its micro-batches, and a
    Spark write is a task on the slots they need (a batch beside it ran +0.1-1.4 s
    longer). Files, partition folders, Parquet types and the closing ``_SUCCESS``
    are what Spark writes, so Spark, pyarrow and Feast read both alike.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = local_dir(path)
    if root is None:
        raise ValueError(f"not a local path: {path}")
    if root.exists():
        shutil.rmtree(root)  # a run that stopped part way
    root.mkdir(parents=True)
    stamp = pa.scalar(created, type=pa.timestamp("us", tz="UTC"))
    table = table.append_column("created", pa.array([stamp.as_py()] * table.num_rows, stamp.type))
    dates = pc.fill_null(pc.strftime(table["event_timestamp"], format="%Y-%m-%d"), _HIVE_NULL)
    name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
    for date in sorted(pc.unique(dates).to_pylist()):
        folder = root / f"{SNAPSHOT_PARTITION_COLUMNS[0]}={date}"
        folder.mkdir()
        pq.write_table(table.filter(pc.equal(dates, date)), folder / name, compression="snappy")
    (root / "_SUCCESS").touch()
    return table.num_rows


def _dates(since: datetime, until: datetime) -> list[str]:
    day = since.astimezone(UTC).date()
    last = until.astimezone(UTC).date()
    out = []
    while day <= last:
        out.append(day.isoformat())
        day += timedelta(days=1)
    return out


class NoEventsError(FileNotFoundError):
    """The offline store has no events yet (a fresh data dir): a one-line CLI error, not
    Spark's ``PATH_NOT_FOUND`` traceback."""


def read_events(
    spark: SparkSession,
    settings: Settings,
    since: datetime | None = None,
    until: datetime | None = None,
) -> DataFrame:
    """Validated events with ``since <= event_time <= until`` (either bound optional).

    Partition pruning on ``event_date`` keeps the read to the days in range.
    Returns :data:`VALID_COLUMNS` only.
    """
    from pyspark.sql import functions as F

    from pipelines.spark import uri_exists

    path = events_path(settings)
    if not uri_exists(spark, path):
        raise NoEventsError(f"no events in the offline store at {path}: run `shopstream stream` "
                            "or `shopstream replay` first")
    df = spark.read.schema(_event_schema()).parquet(path)
    cond = F.lit(True)
    if since is not None and until is not None:
        cond = cond & F.col("event_date").isin(*_dates(since, until))
    if since is not None:
        cond = cond & (F.col("event_time") >= F.lit(since))
    if until is not None:
        cond = cond & (F.col("event_time") <= F.lit(until))
    return df.where(cond).select(*VALID_COLUMNS)


def _event_schema() -> str:
    return (
        "event_id string, event_type string, event_time timestamp, user_id string, "
        "session_id string, item_id string, category_id string, region string, "
        "price double, quantity int, device string, event_date string, event_hour int"
    )

