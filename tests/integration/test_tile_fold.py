"""The micro-batch's tiles folded by shopstream's ``TileFold`` (in the JVM) against Spark's
aggregation of the same events (``features.tiles.keyed_tiles``), on a real Spark session."""

from __future__ import annotations

import os
import random
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytestmark = pytest.mark.integration

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

EVENT_SCHEMA = (
    "event_id string, event_type string, event_time timestamp, user_id string, "
    "session_id string, item_id string, category_id string, region string, price double, "
    "quantity int, device string"
)
T0 = datetime(2024, 6, 1, 11, 0, tzinfo=UTC)


def _events(n: int, seed: int) -> list[tuple]:
    """Events of few users, items, categories and regions over 15 tiles, with times drawn
    from few milliseconds so that many share a microsecond (ties for every max_by)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.choice(("view", "view", "view", "add_to_cart", "purchase"))
        when = T0 + timedelta(milliseconds=rnd.randrange(900_000) // 250 * 250)
        price = round(rnd.uniform(0.5, 80), 2) if kind != "view" or rnd.random() < 0.1 else None
        out.append((f"e{seed}-{i}", kind, when, f"u{rnd.randrange(12)}", "s",
                    f"i{rnd.randrange(30)}", f"c{rnd.randrange(5)}",
                    rnd.choice(("UK", "FR", "DE", "Côte d'Ivoire")), price, rnd.randrange(1, 5),
                    "web"))
    return out


def _edge_events() -> list[tuple]:
    tie = T0 + timedelta(seconds=60, microseconds=-1)
    before_1970 = datetime(1969, 12, 31, 23, 59, 30, 500, tzinfo=UTC)
    return [
        # one item's last events at one microsecond: each max_by takes the greater value
        ("t1", "view", tie, "u0", "s", "i1", "c1", "FR", 9.5, 2, "web"),
        ("t2", "add_to_cart", tie, "u1", "s", "i1", "c2", "UK", 3.25, 1, "web"),
        ("t3", "purchase", tie, "u1", "s", "i1", "c0", "DE", 12.0, 3, "web"),
        # one user's views of one item, the later one counting, more items than n
        *[(f"v{i}", "view", T0 + timedelta(seconds=i), "edge", "s", f"i{i % 5}", "c1", "UK",
           None, 1, "web") for i in range(12)],
        # a sales key Spark url-encodes, and a tile before 1970 (floor, not truncation)
        ("odd", "purchase", tie, "u2", "s", "i 2|x", "c/1", "Côte d'Ivoire", 1.5, 1, "web"),
        ("old", "purchase", before_1970, "u3", "s", "i3", "c3", "UK", 2.0, 2, "web"),
    ]


def _canonical(row: dict[str, Any], *, sort_lists: bool) -> dict[str, Any]:
    out = dict(row)
    if sort_lists:  # Spark's collect_set and weights' order is unspecified
        out["items_viewed"] = sorted(out["items_viewed"])
        out["category_weights"] = sorted(out["category_weights"], key=lambda c: c["category_id"])
    out["category_weights"] = [(c["category_id"], round(c["weight"], 9))
                               for c in out["category_weights"]]
    out["spend"] = round(out["spend"], 9)
    return out


def _by_tile(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    out = {(r["kind"], r["key"], r["tile_start"]): r for r in rows}
    assert len(out) == len(rows), "a tile came twice"
    return out


@pytest.mark.parametrize("last_items_n", [3, 0])
def test_the_jvm_fold_gives_the_rows_of_sparks_aggregation(spark: Any, last_items_n: int
                                                           ) -> None:
    """Every tile of keyed_tiles, once, with every column equal (doubles to 1e-9): the
    counts and sums, the set of items, the weights per category, the last items in their
    order, and the max_by values where times tie; the fold's lists come sorted."""
    from features.tiles import KEYED_TILE_COLUMNS, keyed_tiles
    from pipelines.streaming.tile_fold import folded_tiles, has_tile_fold

    assert has_tile_fold(spark), "the test session has shopstream's jar (make setup)"
    events = spark.createDataFrame(_events(3000, 7) + _edge_events(), EVENT_SCHEMA)
    want = _by_tile(keyed_tiles(events, slide_seconds=60, last_items_n=last_items_n,
                                partitions=3).toArrow().to_pylist())
    folded = folded_tiles(events, slide_seconds=60, last_items_n=last_items_n, partitions=3)
    assert tuple(folded.columns) == KEYED_TILE_COLUMNS
    got = _by_tile(folded.toArrow().to_pylist())
    assert got.keys() == want.keys()
    for at, row in want.items():
        assert _canonical(got[at], sort_lists=False) == _canonical(row, sort_lists=True), at
    first = int(T0.timestamp())
    item = got[("item", "i1", first)]
    assert (item["category_id"], item["region"], item["price"]) == ("c2", "UK", 12.0)
    sale = got[("sales", "i+2%7Cx|c%2F1|C%C3%B4te+d%27Ivoire", first)]
    assert (sale["item_id"], sale["units"], sale["spend"]) == ("i 2|x", 1, 1.5)
    assert ("sales", "i3|c3|UK", -60) in got
    viewed = got[("user", "edge", first)]["last_viewed"]
    if last_items_n:
        # i0..i4 viewed at seconds 0..11: the latest of each is 7, 8, 9, 10, 11 s
        assert [(e["item_id"], e["event_us"] // 1_000_000 - first) for e in viewed] == [
            ("i1", 11), ("i0", 10), ("i4", 9)]
    else:
        assert viewed == []


def test_the_jvm_fold_keeps_every_key_in_one_partition(spark: Any) -> None:
    """The per-key pass reads each key's tiles in one partition: the fold keeps the role
    rows' partitioning by (kind, key)."""
    from pyspark.sql import functions as F

    from pipelines.streaming.tile_fold import folded_tiles

    events = spark.createDataFrame(_events(2000, 3), EVENT_SCHEMA)
    folded = folded_tiles(events, slide_seconds=60, last_items_n=3, partitions=4)
    assert folded.rdd.getNumPartitions() == 4
    placed = folded.select("kind", "key", F.spark_partition_id().alias("p")).collect()
    partitions: dict[tuple[str, str], set[int]] = {}
    for row in placed:
        partitions.setdefault((row["kind"], row["key"]), set()).add(row["p"])
    assert all(len(found) == 1 for found in partitions.values())
    assert len({row["p"] for row in placed}) > 1


def test_the_jvm_fold_names_a_column_of_the_wrong_type(spark: Any) -> None:
    """Role rows whose price is text are refused with the column named, not folded."""
    from pyspark.errors import IllegalArgumentException
    from pyspark.sql import functions as F

    from pipelines.streaming.tile_fold import folded_tiles

    events = spark.createDataFrame(_events(10, 1), EVENT_SCHEMA).withColumn(
        "price", F.col("price").cast("string"))
    with pytest.raises(IllegalArgumentException, match="column price is string, not double"):
        folded_tiles(events, slide_seconds=60, last_items_n=3, partitions=2)
