"""The snapshot layout written from Arrow (no Spark): what the stream's reader process stages."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from pipelines.offline_store import local_dir, write_snapshot_table

CREATED = datetime(2026, 11, 27, 8, 0, 1, 123456, tzinfo=UTC)
SCHEMA = pa.schema([("item_id", pa.string()), ("views_1h", pa.int64()),
                    ("last_items", pa.list_(pa.string())),
                    ("event_timestamp", pa.timestamp("us", tz="UTC"))])


def _table(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, row, strict=True)) for row in rows],
                                schema=SCHEMA)


@pytest.mark.parametrize(("uri", "want"), [
    ("/data/offline/features", Path("/data/offline/features")),
    ("file:///data/offline", Path("/data/offline")),
    ("file:/data/offline", Path("/data/offline")),
    ("s3a://bucket/offline", None),
    ("hdfs://nn:8020/offline", None),
])
def test_local_dir_tells_local_paths_from_remote_uris(uri: str, want: Path | None) -> None:
    assert local_dir(uri) == want


def test_rows_land_in_the_partition_of_their_utc_date_with_one_created(tmp_path: Path) -> None:
    late = datetime(2026, 11, 26, 23, 59, 59, 999999, tzinfo=UTC)
    early = datetime(2026, 11, 27, 0, 0, tzinfo=UTC)
    rows = [("i1", 3, ["a", "b"], late), ("i2", None, [], early), ("i3", 1, None, early)]
    path = tmp_path / "stage" / "item_stats"

    assert write_snapshot_table(_table(rows), str(path), CREATED) == 3

    assert sorted(p.name for p in path.iterdir()) == [
        "_SUCCESS", "event_date=2026-11-26", "event_date=2026-11-27"]
    files = sorted(path.rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["event_date=2026-11-26", "event_date=2026-11-27"]
    assert all(f.name.startswith("part-") and f.name.endswith(".snappy.parquet") for f in files)
    back = ds.dataset(path, format="parquet", partitioning="hive").to_table()
    got = sorted(back.to_pylist(), key=lambda r: r["item_id"])
    assert [(r["item_id"], r["views_1h"], r["last_items"], r["event_timestamp"], r["event_date"])
            for r in got] == [(*row, row[3].strftime("%Y-%m-%d")) for row in rows]
    assert {r["created"] for r in got} == {CREATED}
    assert back.schema.field("created").type == pa.timestamp("us", tz="UTC")


def test_a_second_write_replaces_what_a_stopped_one_left(tmp_path: Path) -> None:
    path = tmp_path / "user_activity"
    at = datetime(2026, 11, 27, 1, tzinfo=UTC)
    (path / "event_date=2026-01-01").mkdir(parents=True)
    (path / "event_date=2026-01-01" / "part-half-written.parquet").write_bytes(b"PAR1")

    write_snapshot_table(_table([("i1", 1, [], at)]), f"file://{path}", CREATED)

    files = list(path.rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["event_date=2026-11-27"]
    assert (path / "_SUCCESS").exists()


def test_an_empty_table_is_only_its_success_marker(tmp_path: Path) -> None:
    path = tmp_path / "top_items"
    assert write_snapshot_table(_table([]), str(path), CREATED) == 0
    assert [p.name for p in path.iterdir()] == ["_SUCCESS"]


def test_a_remote_uri_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="s3a://bucket/x"):
        write_snapshot_table(_table([]), "s3a://bucket/x", CREATED)
