"""Training datasets: readers, cleaning, weights, matrices and splits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from training.data import (
    content_digest,
    interactions_from_events,
    make_split,
    make_training_data,
    read_interactions_file,
    read_offline_events,
    time_split,
    user_random_split,
    validation_split,
)
from training.sample import sample_events, write_offline_events

WEIGHTS = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}

RETAIL_CSV = """InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country
536365,85123A,HEART,6,2010-12-01 08:26:00,2.55,17850,United Kingdom
536365,71053,LANTERN,6,2010-12-01 08:26:00,3.39,17850,United Kingdom
536366,22633,HAND WARMER,6,2010-12-01 08:28:00,1.85,,United Kingdom
C536379,D,Discount,-1,2010-12-01 09:41:00,27.5,14527,United Kingdom
536380,22961,JAM MAKING SET,0,2010-12-01 09:45:00,1.45,12583,France
536381,22961,JAM MAKING SET,24,2010-12-02 10:00:00,1.45,12583,France
"""


def _events(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["user_id", "item_id", "event_time", "event_type"]).assign(
        event_time=lambda f: pd.to_datetime(f["event_time"], utc=True), region="UK")


def test_read_online_retail_csv_drops_guests_and_cancellations(tmp_path: Path) -> None:
    path = tmp_path / "retail.csv"
    path.write_text(RETAIL_CSV)
    inter = read_interactions_file(path, weights=WEIGHTS)
    f = inter.frame
    assert sorted(zip(f["user_id"], f["item_id"], strict=True)) == [
        ("12583", "22961"), ("17850", "71053"), ("17850", "85123A")]
    assert set(f["event_type"]) == {"purchase"} and set(f["weight"]) == {5.0}
    assert set(f["region"]) == {"United Kingdom", "France"}
    assert str(f["event_time"].dt.tz) == "UTC"
    assert inter.source.rows_read == 6
    assert dict(inter.source.rows_dropped) == {"quantity_below_1": 2, "empty_user_or_item": 1}
    assert inter.source.kind == "file" and len(inter.source.digest) == 16


def test_read_json_lines_keeps_rows_without_quantity(tmp_path: Path) -> None:
    # the event contract's default quantity is 1: views carry no quantity at all
    path = tmp_path / "events.jsonl"
    rows = [
        {"event_type": "view", "event_time": "2026-11-01T00:00:00.000Z", "user_id": "u1", "item_id": "i1", "region": "X"},
        {"event_type": "purchase", "event_time": "2026-11-01T00:00:01.000Z", "user_id": "u1", "item_id": "i1",
         "region": "X", "quantity": 2, "price": 3.5},
        {"event_type": "teleport", "event_time": "2026-11-01T00:00:02.000Z", "user_id": "u2", "item_id": "i1", "region": "X"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    inter = read_interactions_file(path, weights=WEIGHTS)
    assert inter.frame["event_type"].tolist() == ["view", "purchase"]
    assert inter.frame["weight"].tolist() == [1.0, 5.0]
    assert dict(inter.source.rows_dropped) == {"unknown_event_type_or_weight": 1}


def test_read_kafka_record_file_applies_the_event_contract(tmp_path: Path) -> None:
    # what `shopstream generate/replay --output` writes: {"key", "value": base64(raw payload)}
    import base64

    good = {"event_id": "e1", "event_type": "purchase", "event_time": "2026-11-01T00:00:00Z", "user_id": "u1",
            "session_id": "s1", "item_id": "i1", "category_id": "c1", "region": "X", "price": 2.5}
    view = {**good, "event_id": "e2", "event_type": "view", "item_id": "i2"}
    del view["price"]
    no_price = {**good, "event_id": "e3"}
    del no_price["price"]
    reused = {**good, "event_time": "2026-11-01T00:01:00Z"}  # the id again, later: another event
    payloads = [json.dumps(good).encode(), json.dumps(view).encode(), json.dumps(good).encode(),  # duplicate
                b"{not json", b"\xff\xfe", json.dumps(no_price).encode(), json.dumps(reused).encode()]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"key": "u1", "value": base64.b64encode(p).decode()}) + "\n"
                            for p in payloads))
    inter = read_interactions_file(path, weights=WEIGHTS)
    assert inter.frame[["item_id", "event_type", "weight"]].values.tolist() == [["i1", "purchase", 5.0],
                                                                                 ["i2", "view", 1.0],
                                                                                 ["i1", "purchase", 5.0]]
    assert inter.source.rows_read == 7
    assert dict(inter.source.rows_dropped) == {
        "contract:invalid_json": 1, "contract:invalid_encoding": 1, "contract:missing_price:price": 1,
        "duplicate_event_id": 1}
    assert "category_id" in inter.frame.columns


def test_read_weighted_parquet_with_time_range(tmp_path: Path) -> None:
    path = tmp_path / "ratings.parquet"
    pd.DataFrame({
        "user": ["a", "a", "b", "b"],
        "item": ["x", "y", "x", "z"],
        "timestamp": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"], utc=True),
        "weight": [2.0, 0.0, 1.5, 4.0],
    }).to_parquet(path)
    inter = read_interactions_file(path, weights=WEIGHTS, since="2024-01-01", until="2024-01-04")
    assert inter.frame[["user_id", "item_id", "weight"]].values.tolist() == [["a", "x", 2.0], ["b", "x", 1.5]]
    assert dict(inter.source.rows_dropped) == {"outside_time_range": 1, "unknown_event_type_or_weight": 1}


def test_read_file_without_user_column_names_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("sku,when\n1,2024-01-01\n")
    with pytest.raises(ValueError, match="user_id"):
        read_interactions_file(path, weights=WEIGHTS)


def test_offline_store_read_prunes_partitions_and_bounds_time(tmp_path: Path) -> None:
    events = sample_events(users=40, items=20, events=600, days=3.0, start="2026-10-01T00:00:00Z")
    files = write_offline_events(events, tmp_path / "events")
    inter = read_offline_events(str(tmp_path / "events"), "2026-10-02T06:00:00Z", "2026-10-03T00:00:00Z",
                                weights=WEIGHTS)
    times = inter.frame["event_time"]
    assert times.min() >= pd.Timestamp("2026-10-02T06:00:00Z") and times.max() < pd.Timestamp("2026-10-03T00:00:00Z")
    expected = events[(events["event_time"] >= "2026-10-02T06:00:00Z") & (events["event_time"] < "2026-10-03T00:00:00Z")]
    assert inter.rows == len(expected)
    # only the 2026-10-02 partitions were opened
    assert inter.source.files and all("event_date=2026-10-02" in f for f in inter.source.files)
    assert len(inter.source.files) < len(files)
    assert inter.source.since == "2026-10-02T06:00:00+00:00"
    assert inter.source.rows_dropped["outside_time_range"] == inter.source.rows_read - inter.rows
    assert "category_id" in inter.frame.columns


def test_content_digest_ignores_row_order_but_not_content() -> None:
    frame, _ = interactions_from_events(_events([("u", "a", "2024-01-01", "view"), ("u", "b", "2024-01-02", "purchase")]), WEIGHTS)
    shuffled = frame.iloc[::-1].reset_index(drop=True)
    assert content_digest(frame) == content_digest(shuffled)
    changed = frame.assign(weight=frame["weight"] * 2)
    assert content_digest(frame) != content_digest(changed)


def test_matrix_sums_weights_per_pair_with_log1p() -> None:
    frame, _ = interactions_from_events(_events([
        ("u1", "a", "2024-01-01", "view"), ("u1", "a", "2024-01-02", "add_to_cart"),
        ("u1", "b", "2024-01-02", "purchase"), ("u2", "b", "2024-01-03", "view"),
    ]), WEIGHTS)
    data = make_training_data(frame)
    assert data.user_ids.tolist() == ["u1", "u2"] and data.item_ids.tolist() == ["a", "b"]
    np.testing.assert_allclose(data.matrix.toarray(), np.log1p([[4.0, 5.0], [0.0, 1.0]]), rtol=1e-6)


def test_time_split_trains_on_the_past_and_excludes_seen_items() -> None:
    frame, _ = interactions_from_events(_events([
        ("u1", "a", "2024-01-01", "view"), ("u1", "b", "2024-01-02", "view"),
        ("u2", "a", "2024-01-03", "view"), ("u2", "c", "2024-01-04", "view"),
        ("u1", "a", "2024-01-05", "view"),   # seen in training: not a new relevant item
        ("u1", "c", "2024-01-06", "view"),   # relevant
        ("u2", "new", "2024-01-07", "view"), # unknown to the catalog: cannot be recommended
        ("u3", "a", "2024-01-08", "view"),   # cold user
    ]), WEIGHTS)
    split = time_split(frame, test_days=3.5)
    assert split.cutoff == pd.Timestamp("2024-01-04 12:00", tz="UTC")
    assert split.train.frame["event_time"].max() < split.cutoff <= split.test_frame["event_time"].min()
    users, items = split.train.user_ids.tolist(), split.train.item_ids.tolist()
    assert users == ["u1", "u2"] and items == ["a", "b", "c"]
    relevant = {(users[u], items[i]) for u, i in zip(*split.test.nonzero(), strict=True)}
    assert relevant == {("u1", "c")}
    assert split.eval_users.tolist() == [0]
    stats = split.stats()
    assert stats["cold_test_users"] == 1 and stats["test_relevant_pairs"] == 1


def test_time_split_by_fraction_holds_out_the_latest_rows() -> None:
    events = sample_events(users=50, items=30, events=1000, days=5.0)
    frame, _ = interactions_from_events(events, WEIGHTS)
    split = make_split(frame, "time", test_fraction=0.25)
    assert len(split.test_frame) == pytest.approx(0.25 * len(frame), abs=2)
    val = validation_split(split, test_fraction=0.25)
    assert val.cutoff < split.cutoff
    assert val.train.frame["event_time"].max() < val.cutoff
    assert len(val.train.frame) + len(val.test_frame) == len(split.train.frame)


def test_user_random_split_holds_out_whole_pairs_per_user() -> None:
    events = sample_events(users=60, items=40, events=2000, days=5.0)
    frame, _ = interactions_from_events(events, WEIGHTS)
    split = user_random_split(frame, test_fraction=0.2, seed=3)
    train_pairs = set(zip(split.train.frame["user_id"], split.train.frame["item_id"], strict=True))
    test_pairs = set(zip(split.test_frame["user_id"], split.test_frame["item_id"], strict=True))
    assert train_pairs.isdisjoint(test_pairs)
    per_user = frame.drop_duplicates(["user_id", "item_id"]).groupby("user_id").size()
    held = split.test_frame.drop_duplicates(["user_id", "item_id"]).groupby("user_id").size()
    for user, n in held.items():
        assert n == max(1, int(np.floor(per_user[user] * 0.2)))
    again = user_random_split(frame, test_fraction=0.2, seed=3)
    assert content_digest(again.test_frame) == content_digest(split.test_frame)
