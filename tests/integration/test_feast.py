"""Feast over shopstream's stores: `feast apply` from the repo, point-in-time training data,
and online reads of what a backfill materialized. Real Redis, real Parquet, real Feast."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from features.events import event_to_json
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2] / "feature_repo"
D = datetime(2024, 5, 6, tzinfo=UTC)


def at(hh: int, mm: int, ss: int = 0, us: int = 0) -> datetime:
    return D.replace(hour=hh, minute=mm, second=ss, microsecond=us)


def event(eid: str, kind: str, when: datetime, user: str, item: str, *, price: float | None = None,
          qty: int = 1) -> dict[str, Any]:
    doc = {"event_id": eid, "event_type": kind, "event_time": when, "user_id": user,
           "session_id": f"s-{user}", "item_id": item, "category_id": "c1", "region": "DE",
           "quantity": qty}
    if price is not None:
        doc["price"] = price
    return doc


EVENTS = [
    event("v1", "view", at(10, 5), "u1", "A"),
    event("v2", "view", at(10, 15), "u1", "B"),
    event("v3", "view", at(10, 25), "u1", "A"),
    event("p1", "purchase", at(10, 35), "u1", "A", price=4.0, qty=3),
    event("v4", "view", at(10, 50), "u2", "A"),
]


def write_replay_file(path: Path, events: list[dict[str, Any]]) -> Path:
    """The ``--output`` format of generate / replay, written by the producer's own sink."""
    from pipelines.producer import FileSink

    sink = FileSink(path)
    sink.send_batch([(e["user_id"].encode(), event_to_json(e)) for e in events])
    sink.close()
    return path


@pytest.fixture(scope="module")
def backfilled(make_settings: Callable[..., Settings], tmp_path_factory: pytest.TempPathFactory,
               spark: Any, redis_server: Any) -> Settings:
    """A backfill of EVENTS every 10 minutes from 10:00 to 11:00, materialized into Redis."""
    from pipelines.backfill import run_backfill
    from pipelines.connections import redis_client

    base = tmp_path_factory.mktemp("feast")
    settings = make_settings(data_dir=str(base / "data"))
    client = redis_client(settings, timeout_ms=2000)
    client.flushdb()
    client.close()
    source = write_replay_file(base / "events.jsonl", EVENTS)
    run_backfill(settings, since=at(10, 0), until=at(11, 0), step_seconds=600,
                 source=source, spark=spark)
    return settings


@pytest.fixture(scope="module")
def store(backfilled: Settings) -> Any:
    from pipelines.feast_store import feature_store

    return feature_store(backfilled, apply=False)


def historical(store: Any, rows: list[tuple[str, str, datetime]]) -> pd.DataFrame:
    from pipelines.feast_store import historical_features

    entity_df = pd.DataFrame(rows, columns=["user_id", "item_id", "event_timestamp"])
    df = historical_features(store, entity_df, "ranking_v1")
    assert len(df) == len(rows)  # one row per request, in order
    assert list(df.user_id) == [r[0] for r in rows] and list(df.item_id) == [r[1] for r in rows]
    return df


def value(df: pd.DataFrame, i: int, column: str) -> Any:
    v = df.loc[i, column]
    return None if v is None or (isinstance(v, float) and pd.isna(v)) else v


def test_get_historical_features_is_point_in_time_correct(store: Any) -> None:
    rows = [
        ("u1", "A", at(10, 9, 59)),  # only the 10:00 snapshot exists: u1 has no row yet
        ("u1", "A", at(10, 10)),  # snapshot 10:10: the 10:05 view
        ("u1", "A", at(10, 24, 59, 999_999)),  # snapshot 10:20; the 10:25 view must not leak
        ("u1", "A", at(10, 35)),  # snapshot 10:30: the purchase at 10:35 is not in it yet
        ("u1", "A", at(10, 40)),  # snapshot 10:40: the purchase is
        ("u2", "B", at(10, 40)),  # u2's first event is at 10:50; B was viewed at 10:15
        ("nobody", "Z", at(10, 40)),
        ("u1", "B", at(10, 40)),  # same user and time as row 4, another item
    ]
    df = historical(store, rows)
    views = [value(df, i, "user_activity__views_1h") for i in range(len(rows))]
    assert views == [None, 1, 2, 3, 3, None, None, 3]
    purchases = [value(df, i, "user_activity__purchases_1h") for i in range(len(rows))]
    assert purchases == [None, 0, 0, 0, 1, None, None, 1]
    assert value(df, 4, "user_activity__spend_1h") == 12.0
    assert list(df.loc[3, "user_activity__last_viewed_items"]) == ["A", "B"]
    # item A: viewed 10:05, 10:25, bought 10:35 (3 units)
    assert value(df, 2, "item_stats__views_1h") == 1
    assert value(df, 4, "item_stats__units_1h") == 3
    assert value(df, 4, "item_stats__conversion_rate_1h") == 0.5
    assert value(df, 5, "item_stats__views_24h") == 1  # B
    assert value(df, 7, "item_stats__views_24h") == 1  # B again, next to u1
    assert value(df, 6, "item_stats__views_1h") is None


def test_get_historical_features_never_reads_a_later_snapshot(store: Any, backfilled: Settings) -> None:
    """For every snapshot time, one microsecond earlier must see the previous snapshot."""
    from pipelines.offline_store import snapshot_path

    snaps = pd.read_parquet(snapshot_path(backfilled, "user_activity"))
    snaps = snaps[snaps.user_id == "u1"].sort_values("event_timestamp")
    times = list(snaps.event_timestamp)
    rows = [("u1", "A", t.to_pydatetime() - timedelta(microseconds=1)) for t in times[1:]]
    df = historical(store, rows)
    expected = list(snaps.views_24h)[:-1]
    assert [value(df, i, "user_activity__views_24h") for i in range(len(rows))] == expected


def test_feast_reads_stream_snapshots_beside_the_backfills(
    backfilled: Settings, make_settings: Callable[..., Settings], tmp_path: Path,
) -> None:
    """The stream's reader process writes its snapshots with pyarrow, into the tables the
    backfill writes with Spark. Feast's point-in-time join reads both: a stream row at
    10:45 is what a request at 10:45 gets, and the backfill's 10:40 row before it."""
    import shutil

    import pyarrow as pa

    from features.feast_layout import USER_ACTIVITY
    from pipelines.feast_store import feature_store
    from pipelines.offline_store import snapshot_path, write_snapshot_table
    from pipelines.streaming.snapshot import arrow_schema, view_schema

    settings = make_settings(data_dir=str(tmp_path / "data"))
    shutil.copytree(backfilled.offline_path, settings.offline_path)
    table = pd.read_parquet(snapshot_path(settings, USER_ACTIVITY.name))
    row = table[(table.user_id == "u1") & (table.event_timestamp == at(10, 40))]
    assert len(row) == 1
    streamed = row.drop(columns=["created", "event_date"]).assign(
        event_timestamp=at(10, 45), views_1h=41)
    schema = arrow_schema(view_schema(USER_ACTIVITY))
    stage = tmp_path / "stage"
    write_snapshot_table(pa.Table.from_pandas(streamed[schema.names], schema=schema,
                                              preserve_index=False),
                         str(stage), datetime.now(UTC))
    for part in stage.rglob("*.parquet"):  # moved in as the stream moves its staged files
        target = Path(snapshot_path(settings, USER_ACTIVITY.name)) / part.relative_to(stage)
        target.parent.mkdir(parents=True, exist_ok=True)
        part.rename(target)

    df = historical(feature_store(settings), [("u1", "A", at(10, 44, 59)), ("u1", "A", at(10, 45))])
    assert [value(df, i, "user_activity__views_1h") for i in range(2)] == [3, 41]
    assert value(df, 1, "user_activity__purchases_1h") == 1  # the rest of the row, as written


def test_get_online_features_returns_materialized_values(store: Any, backfilled: Settings) -> None:
    from pipelines.offline_store import snapshot_path

    snaps = pd.read_parquet(snapshot_path(backfilled, "item_stats"))
    last = snaps[snaps.event_timestamp == snaps.event_timestamp.max()].set_index("item_id")
    got = store.get_online_features(
        features=["item_stats:views_1h", "item_stats:units_1h", "item_stats:trending_score",
                  "user_activity:views_1h", "user_activity:last_viewed_items"],
        entity_rows=[{"item_id": "A", "user_id": "u1"}, {"item_id": "B", "user_id": "u2"}],
        full_feature_names=True,
    ).to_dict()
    assert got["item_stats__views_1h"] == [last.loc["A", "views_1h"], last.loc["B", "views_1h"]]
    assert got["item_stats__units_1h"] == [3, 0]
    assert got["item_stats__trending_score"] == [last.loc["A", "trending_score"],
                                                 last.loc["B", "trending_score"]]
    # as of 11:00 the 1h window is the tiles 10:01 .. 11:00: u1's views at 10:05/10:15/10:25
    assert got["user_activity__views_1h"] == [3, 1]
    assert got["user_activity__last_viewed_items"] == [["A", "B"], ["A"]]


def test_feast_cli_apply_from_the_repo(backfilled: Settings) -> None:
    """`feast apply` with the variables `python -m pipelines.feast_store env` prints."""
    from pipelines.feast_store import cli_environment

    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOPSTREAM_")}
    env.update(cli_environment(backfilled))
    feast = str(Path(sys.executable).with_name("feast"))
    printed = subprocess.run([sys.executable, "-m", "pipelines.feast_store", "env"], env=env,
                             capture_output=True, text=True, check=True,
                             cwd=REPO.parent).stdout
    assert "FEAST_SHOPSTREAM_REDIS=" in printed
    applied = subprocess.run([feast, "apply"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
    assert applied.returncode == 0, applied.stderr[-2000:]
    listed = subprocess.run([feast, "feature-views", "list"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "user_activity" in listed.stdout and "item_stats" in listed.stdout
    services = subprocess.run([feast, "feature-services", "list"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
    assert "ranking_v1" in services.stdout
