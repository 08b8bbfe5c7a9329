"""The dedup's key: one per event (its id and its time), ordered by event time whatever the id.

The streaming job keeps every id of the retention in RocksDB, whose keys sort by their
bytes. Random ids (UUIDv4) as keys scatter each batch's inserts and each batch's expiries
over the whole state; with the event time first they sit together, as sequential ids do
(docs/streaming-performance.md, "The dedup's key").
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytestmark = pytest.mark.integration

T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def _keys(spark: Any, rows: list[tuple[str, datetime]]) -> list[str]:
    from pipelines.stream import dedup_key

    df = spark.createDataFrame(rows, "event_id string, event_time timestamp")
    return [r["k"] for r in df.select(dedup_key().alias("k")).collect()]


def test_a_copy_has_the_same_key_and_another_time_another(spark: Any) -> None:
    a, copy, later, other = _keys(spark, [("e-1", T0), ("e-1", T0), ("e-1", T0 + timedelta(
        microseconds=1)), ("e-2", T0)])
    assert a == copy
    assert len({a, later, other}) == 3


def test_keys_sort_by_event_time_whatever_the_ids(spark: Any) -> None:
    """Random ids, times a microsecond to years apart (1970 to 9000, the contract's range):
    the keys' text order is the events' time order."""
    times = [datetime(1970, 1, 2, tzinfo=UTC), T0 - timedelta(days=400), T0,
             T0 + timedelta(microseconds=1), T0 + timedelta(seconds=1),
             datetime(9000, 1, 1, tzinfo=UTC)]
    rows = [(str(uuid.uuid4()), t) for t in times for _ in range(3)]
    keys = _keys(spark, rows)
    by_key = [t for _, t in sorted(zip(keys, (t for _, t in rows), strict=True))]
    assert by_key == sorted(t for _, t in rows)
    assert all(k.startswith("e:") and k[18] == "/" for k in keys)  # 16 hex digits of time
