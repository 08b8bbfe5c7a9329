"""`shopstream backfill`: offline-store and replay-file sources, quarantine, dedup, lineage."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from features.events import event_to_json
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

T0 = datetime(2024, 7, 1, 9, 0, tzinfo=UTC)


def event(eid: str, minutes: float, user: str, item: str, kind: str = "view",
          price: float | None = None) -> dict[str, Any]:
    doc = {"event_id": eid, "event_type": kind, "event_time": T0 + timedelta(minutes=minutes),
           "user_id": user, "session_id": "s", "item_id": item, "category_id": "c",
           "region": "NL", "quantity": 1}
    if price is not None:
        doc["price"] = price
    return doc


EVENTS = [
    event("a", 5, "u1", "i1"),
    event("b", 20, "u1", "i2"),
    event("c", 30, "u2", "i1", "purchase", 9.5),
    event("d", 65, "u2", "i2", "add_to_cart", 2.0),
    event("e", 90, "u3", "i3"),
]
BAD = [
    (b"u1", b"{not json"),  # invalid_json
    (b"u9", event_to_json({**EVENTS[0], "event_id": "x", "event_type": "purchase"})),  # missing_price
]


def write_jsonl(path: Path, events: list[dict[str, Any]], extra: list[tuple[bytes, bytes]]) -> Path:
    from pipelines.producer import FileSink

    sink = FileSink(path)
    sink.send_batch([(e["user_id"].encode(), event_to_json(e)) for e in events] + extra)
    sink.close()
    return path


@pytest.fixture()
def run_settings(make_settings: Callable[..., Settings], tmp_path: Path,
                 redis_server: Any) -> Settings:
    return make_settings(data_dir=str(tmp_path / "data"))


def snapshot_table(settings: Settings, name: str) -> pd.DataFrame:
    from pipelines.offline_store import snapshot_path

    df = pd.read_parquet(snapshot_path(settings, name)).drop(columns=["created", "event_date"])
    key = "user_id" if name == "user_activity" else "item_id"
    return df.sort_values([key, "event_timestamp"]).reset_index(drop=True)


def test_backfill_replay_file_quarantines_dedups_and_records_lineage(
    run_settings: Settings, spark: Any, tmp_path: Path
) -> None:
    from pipelines.backfill import run_backfill
    from pipelines.lineage import list_manifests, read_manifest
    from pipelines.offline_store import quarantine_path

    # "b" twice (a copy); the id "a" again at another time and for another user: another
    # event (an event's identity is its id and its time, as in the stream's dedup)
    reused = event("a", 40, "u3", "i3")
    source = write_jsonl(tmp_path / "replay.jsonl", EVENTS + [EVENTS[1], reused], BAD)
    result = run_backfill(run_settings, source=source, since=T0, until=T0 + timedelta(hours=2),
                          step_seconds=1800, materialize=False, spark=spark)
    assert result.as_of_count == 5
    assert result.rows["events_read"] == 9
    assert result.rows["events_quarantined"] == 2
    assert result.rows["events_duplicates"] == 1 and result.rows["events_used"] == 6
    quarantine = pd.read_parquet(quarantine_path(run_settings))
    assert sorted(zip(quarantine.reason, quarantine.field.fillna(""), strict=True)) == [
        ("invalid_json", ""), ("missing_price", "price")]
    assert bytes(quarantine[quarantine.reason == "invalid_json"].raw_value.iloc[0]) == b"{not json"

    users = snapshot_table(run_settings, "user_activity")
    assert len(users) == result.rows["user_activity"]
    u1 = users[users.user_id == "u1"].set_index("event_timestamp")
    assert u1.loc[pd.Timestamp(T0 + timedelta(minutes=30)), "views_1h"] == 2  # "b" counted once
    u3 = users[users.user_id == "u3"].set_index("event_timestamp")
    assert u3.loc[pd.Timestamp(T0 + timedelta(minutes=60)), "views_1h"] == 1  # the reused "a"

    [path] = list_manifests(run_settings)
    manifest = read_manifest(path)
    assert manifest["run_id"] == result.run_id and str(path) == result.manifest_path
    assert manifest["inputs"]["source"] == "file"
    assert manifest["inputs"]["files"][0]["path"] == str(source)
    assert len(manifest["inputs"]["files"][0]["sha256"]) == 64
    assert manifest["inputs"]["rows"] == {"read": 9, "quarantined": 2, "in_range": 7,
                                          "duplicates": 1, "used": 6}
    assert manifest["inputs"]["digest"].startswith("xxhash64-sum:")
    assert manifest["parameters"]["step_seconds"] == 1800
    assert manifest["outputs"]["user_activity"]["rows"] == result.rows["user_activity"]
    assert manifest["outputs"]["user_activity"]["as_of"] == [
        "2024-07-01T09:00:00Z", "2024-07-01T11:00:00Z"]


def test_backfill_from_offline_store_equals_replay_file(
    make_settings: Callable[..., Settings], run_settings: Settings, spark: Any, tmp_path: Path
) -> None:
    """The offline-store layout the stream writes gives the same snapshots and digest."""
    from pipelines.backfill import run_backfill
    from pipelines.lineage import read_manifest
    from pipelines.offline_store import events_path, write_events

    source = write_jsonl(tmp_path / "replay.jsonl", EVENTS, [])
    window = {"since": T0, "until": T0 + timedelta(hours=2), "step_seconds": 900,
              "materialize": False, "spark": spark}
    from_file = run_backfill(run_settings, source=source, **window)

    other = make_settings(data_dir=str(tmp_path / "other"))
    from features.events import VALID_COLUMNS

    schema = ("event_id string, event_type string, event_time timestamp, user_id string, "
              "session_id string, item_id string, category_id string, region string, "
              "price double, quantity int, device string")
    frame = spark.createDataFrame([tuple(e.get(c) for c in VALID_COLUMNS) for e in EVENTS], schema)
    write_events(frame, other)
    assert Path(events_path(other), "event_date=2024-07-01", "event_hour=9").is_dir()
    from_store = run_backfill(other, **window)

    for name in ("user_activity", "item_stats"):
        pd.testing.assert_frame_equal(snapshot_table(run_settings, name), snapshot_table(other, name))
    a, b = read_manifest(from_file.manifest_path), read_manifest(from_store.manifest_path)
    assert b["inputs"]["source"] == "offline_store"
    assert a["inputs"]["digest"] == b["inputs"]["digest"]


def test_backfill_cli(run_settings: Settings, spark: Any, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    source = write_jsonl(tmp_path / "replay.jsonl", EVENTS, BAD)
    for name, value in {"DATA_DIR": run_settings.data_dir, "REDIS_URL": run_settings.redis_url,
                        "RUN_DIR": str(run_settings.run_path), "SPARK_LOG_LEVEL": "ERROR"}.items():
        monkeypatch.setenv(f"SHOPSTREAM_{name}", value)
    runner = CliRunner()
    result = runner.invoke(app, ["backfill", "--source", str(source), "--since",
                                 "2024-07-01T09:00:00Z", "--until", "2024-07-01T10:30",
                                 "--every", "30"])
    assert result.exit_code == 0, result.output
    assert "as-of times" in result.output and "4 (2024-07-01 09:00" in result.output
    assert "events_quarantined" in result.output
    assert "redis item_stats" in result.output  # materialized by default

    bad = runner.invoke(app, ["backfill", "--source", str(tmp_path / "missing.jsonl")])
    assert bad.exit_code != 0 and "no such file" in str(bad.exception or bad.output)
