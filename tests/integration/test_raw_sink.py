"""The raw events sink writes a batch by partition without sorting it first, and a batch
spanning more partitions than it keeps writers open for still lands every event once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings

pytestmark = pytest.mark.integration

SCHEMA = ("event_id string, event_type string, event_time timestamp, user_id string, "
          "session_id string, item_id string, category_id string, region string, "
          "price double, quantity int, device string")
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)


def _events(spark: Any, n: int, step: timedelta) -> Any:
    rows = [(f"e{i}", "view", T0 + i * step, f"u{i % 3}", "s", f"i{i % 5}", "c1", "UK", None, 1,
             "web") for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA)


def _last_plan(spark: Any) -> str:
    """The physical plan of the session's last SQL execution (Spark's status store)."""
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    return str(executions.apply(executions.size() - 1).physicalPlanDescription())


def _written(spark: Any, settings: Settings) -> list[tuple[str, str, int]]:
    from pyspark.sql import functions as F

    from pipelines import offline_store

    rows = spark.read.parquet(offline_store.events_path(settings)).select(
        "event_id", F.date_format("event_time", "yyyy-MM-dd HH").alias("when"),
        F.concat_ws(" ", F.col("event_date").cast("string"),
                    F.lpad(F.col("event_hour").cast("string"), 2, "0")).alias("partition"))
    return sorted((r["event_id"], r["when"], r["partition"]) for r in rows.collect())


def test_a_batch_is_written_by_partition_without_a_sort(
        spark: Any, make_settings: Any, tmp_path: Path) -> None:
    """Six events in two hours: written by a writer per partition (no sort in the write's
    plan), each in its own date and hour."""
    from pipelines.spark import CONCURRENT_OUTPUT_WRITERS
    from pipelines.stream import write_events_batch

    assert int(spark.conf.get("spark.sql.maxConcurrentOutputFileWriters")) == (
        CONCURRENT_OUTPUT_WRITERS)
    settings: Settings = make_settings(data_dir=str(tmp_path / "data"))
    write_events_batch(_events(spark, 6, timedelta(minutes=20)), settings, 1)
    plan = _last_plan(spark)
    assert "WriteFiles" in plan and "Sort [" not in plan, plan
    written = _written(spark, settings)
    assert [w[0] for w in written] == [f"e{i}" for i in range(6)]
    assert all(when == partition for _, when, partition in written), written


def test_a_batch_over_more_partitions_than_writers_lands_every_event_once(
        spark: Any, make_settings: Any, tmp_path: Path) -> None:
    """40 events 37 minutes apart span 25 hours, far more partitions than the writers a
    task keeps open: the rest are sorted and written as before, every event once, in its
    own date and hour."""
    from pipelines.spark import CONCURRENT_OUTPUT_WRITERS
    from pipelines.stream import write_events_batch

    settings: Settings = make_settings(data_dir=str(tmp_path / "data"))
    events = _events(spark, 40, timedelta(minutes=37))
    write_events_batch(events, settings, 1)
    written = _written(spark, settings)
    assert sorted(w[0] for w in written) == sorted(f"e{i}" for i in range(40))
    assert all(when == partition for _, when, partition in written), written
    assert len({w[2] for w in written}) > 2 * CONCURRENT_OUTPUT_WRITERS


def test_the_ids_times_and_sessions_are_written_without_a_dictionary(
        spark: Any, make_settings: Any, tmp_path: Path) -> None:
    """The columns whose values are nearly all new in a batch are written plain (no
    dictionary page); the others keep their dictionary; every value reads back as written."""
    import pyarrow.parquet as pq

    from pipelines.stream import PLAIN_EVENT_COLUMNS, write_events_batch

    settings: Settings = make_settings(data_dir=str(tmp_path / "data"))
    rows = [(f"e{i}", "view", T0 + timedelta(seconds=i), f"u{i % 7}", f"s{i // 3}", f"i{i % 5}",
             "c1", "UK", 2.5, 1, "web") for i in range(600)]
    events = spark.createDataFrame(rows, SCHEMA)
    write_events_batch(events, settings, 1)
    files = sorted(Path(settings.data_dir).rglob("*.parquet"))
    assert files
    dictionary: dict[str, set[bool]] = {}
    for file in files:
        group = pq.ParquetFile(file).metadata.row_group(0)
        for i in range(group.num_columns):
            column = group.column(i)
            dictionary.setdefault(column.path_in_schema, set()).add(column.has_dictionary_page)
    assert {name: dictionary[name] for name in PLAIN_EVENT_COLUMNS} == {
        name: {False} for name in PLAIN_EVENT_COLUMNS}
    assert set(PLAIN_EVENT_COLUMNS) == {"event_id", "event_time", "session_id"}
    for name in ("user_id", "item_id", "event_type", "region", "device"):
        assert dictionary[name] == {True}, name
    from pyspark.sql import functions as F

    from pipelines import offline_store

    back = spark.read.parquet(offline_store.events_path(settings)).select(
        "event_id", F.unix_micros("event_time"), "session_id", "user_id", "price")
    t0 = int(T0.timestamp()) * 1_000_000
    assert sorted(tuple(r) for r in back.collect()) == sorted(
        (f"e{i}", t0 + i * 1_000_000, f"s{i // 3}", f"u{i % 7}", 2.5) for i in range(600))
