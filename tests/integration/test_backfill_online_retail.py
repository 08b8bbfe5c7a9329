"""The Online Retail file through the replay preset, the contract and a backfill; top sellers
per country checked against an independent pandas computation over the same CSV."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from features import online_keys
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "online_retail_2010-12_2011-01.csv"
SINCE = datetime(2010, 12, 6, 9, 37, 30, tzinfo=UTC)  # not on a tile boundary
STEP = timedelta(hours=7)
COUNT = 13
UNTIL = SINCE + STEP * (COUNT - 1)
TOP = 10


def pandas_sales() -> pd.DataFrame:
    """The CSV's rows the contract accepts, written from the data set's description only."""
    raw = pd.read_csv(CSV, dtype=str, keep_default_na=False)
    quantity = pd.to_numeric(raw["Quantity"], errors="coerce")
    price = pd.to_numeric(raw["UnitPrice"], errors="coerce")
    when = pd.to_datetime(raw["InvoiceDate"], format="%Y-%m-%d %H:%M:%S", errors="coerce", utc=True)
    ok = (
        (quantity >= 1) & (quantity % 1 == 0) & (price >= 0) & when.notna()
        & (raw["StockCode"].str.strip() != "") & (raw["Country"].str.strip() != "")
        & (raw["StockCode"].str.len() <= 64) & (raw["Country"].str.len() <= 64)
    )
    return pd.DataFrame({
        "item": raw["StockCode"].str.strip(), "country": raw["Country"].str.strip(),
        "units": quantity, "time": when, "ok": ok,
    })


def pandas_top(sales: pd.DataFrame, as_of: datetime) -> dict[str, list[tuple[str, int]]]:
    """Top items by units per country over the 24h window as of ``as_of`` (60 s tiles)."""
    tile = pd.Timestamp(as_of).floor("60s")
    window = sales[sales.ok & (sales.time > tile - pd.Timedelta(hours=24))
                   & (sales.time <= pd.Timestamp(as_of))]
    units = window.groupby(["country", "item"], as_index=False)["units"].sum()
    units = units.sort_values(["country", "units", "item"], ascending=[True, False, True])
    return {country: [(r.item, int(r.units)) for r in g.head(TOP).itertuples()]
            for country, g in units.groupby("country")}


@pytest.fixture(scope="module")
def backfill(make_settings: Callable[..., Settings], tmp_path_factory: pytest.TempPathFactory,
             spark: Any, redis_server: Any) -> tuple[Settings, Any]:
    from pipelines.backfill import run_backfill
    from pipelines.connections import redis_client

    settings = make_settings(data_dir=str(tmp_path_factory.mktemp("retail") / "data"))
    client = redis_client(settings, timeout_ms=2000)
    client.flushdb()
    client.close()
    result = run_backfill(settings, source=CSV, preset="online-retail", since=SINCE, until=UNTIL,
                          step_seconds=int(STEP.total_seconds()), spark=spark)
    return settings, result


def test_rejected_rows_go_to_the_quarantine_with_a_reason(backfill: tuple[Settings, Any]) -> None:
    from pipelines.lineage import read_manifest
    from pipelines.offline_store import quarantine_path

    settings, result = backfill
    sales = pandas_sales()
    manifest = read_manifest(result.manifest_path)
    assert manifest["inputs"]["rows"]["read"] == len(sales) == 70_051
    assert manifest["inputs"]["rows"]["quarantined"] == int((~sales.ok).sum()) == 1_287
    assert manifest["inputs"]["quarantine_reasons"] == {"invalid_quantity": 1_287}
    quarantine = pd.read_parquet(quarantine_path(settings))
    assert len(quarantine) == 1_287 and set(quarantine.reason) == {"invalid_quantity"}
    assert manifest["inputs"]["preset"] == "online-retail"
    assert manifest["inputs"]["files"][0]["sha256"]
    assert manifest["outputs"]["top_items"]["rows"] == result.rows["top_items"] > 0


def test_top_sellers_per_country_match_pandas_at_every_as_of(backfill: tuple[Settings, Any]) -> None:
    from pipelines.offline_store import snapshot_path

    settings, result = backfill
    assert result.as_of_count == COUNT
    top = pd.read_parquet(snapshot_path(settings, "top_items"))
    top = top[(top.kind == "top") & (top.window == "24h") & top.category_id.isna()
              & top.region.notna() & (top["rank"] <= TOP)]
    sales = pandas_sales()
    checked = 0
    for j in range(COUNT):
        as_of = SINCE + STEP * j
        expected = pandas_top(sales, as_of)
        rows = top[top.event_timestamp == pd.Timestamp(as_of)].sort_values(["region", "rank"])
        got = {country: [(r.item_id, int(r.score)) for r in g.itertuples()]
               for country, g in rows.groupby("region")}
        assert got == expected, as_of
        checked += len(expected)
    assert checked > 3 * COUNT  # several countries at every as-of time


def test_redis_holds_the_last_lists(backfill: tuple[Settings, Any]) -> None:
    """Materialized top-seller ZSETs equal pandas for every country as of the last time."""
    from pipelines.connections import redis_client as make_client

    settings, result = backfill
    redis_client = make_client(settings, timeout_ms=2000)  # not the fixture: it flushes the db
    expected = pandas_top(pandas_sales(), UNTIL)
    assert result.online["top_lists"] > len(expected)
    for country, items in expected.items():
        key = online_keys.top_sellers_key("24h", online_keys.scope_for(region=country))
        reply = redis_client.zrevrange(key, 0, -1, withscores=True)
        # ties are ordered by item id ascending, as in the snapshots
        ranked = sorted(((m.decode(), int(s)) for m, s in reply), key=lambda p: (-p[1], p[0]))
        assert ranked[:TOP] == items, country
    meta = redis_client.hgetall(online_keys.top_meta_key())
    field = online_keys.top_meta_field("top", "24h", online_keys.scope_for(region="France"))
    assert int(meta[field.encode()]) == int(UNTIL.timestamp() * 1000)
    redis_client.close()


def test_online_item_stats_match_pandas(backfill: tuple[Settings, Any]) -> None:
    from pipelines.feast_store import feature_store

    settings, _ = backfill
    sales = pandas_sales()
    tile = pd.Timestamp(UNTIL).floor("60s")
    day = sales[sales.ok & (sales.time > tile - pd.Timedelta(hours=24))
                & (sales.time <= pd.Timestamp(UNTIL))]
    units = day.groupby("item")["units"].sum().sort_values(ascending=False).head(20)
    store = feature_store(settings, apply=False)
    got = store.get_online_features(
        features=["item_stats:units_24h"], entity_rows=[{"item_id": i} for i in units.index],
    ).to_dict()
    assert got["units_24h"] == [int(u) for u in units]
