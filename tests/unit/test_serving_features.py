"""Decoding a user's ``user_activity`` row from Feast's Redis layout (no Redis needed)."""

from __future__ import annotations

from datetime import UTC, datetime

from features.feast_layout import USER_ACTIVITY, ViewSpec
from serving.features import FeastUserFeatures

AS_OF = datetime(2024, 6, 1, 12, 0, 5, tzinfo=UTC)
ROW = {
    "user_id": "u123",
    "views_1h": 4, "views_24h": 9, "carts_1h": 1, "carts_24h": 2, "purchases_1h": 0,
    "purchases_24h": 1, "spend_1h": 0.0, "spend_24h": 12.5, "distinct_items_viewed_1h": 3,
    "last_event_time": datetime(2024, 6, 1, 11, 59, 0, tzinfo=UTC),
    "top_category": "hats",
    "category_affinity_ids": ["hats", "bags"],
    "category_affinity_weights": [7.0, 1.0],
    "last_viewed_items": ["85123A", "71053"],
    "event_timestamp": AS_OF,
}


def _hmget(reader: FeastUserFeatures, mapping: dict[bytes, bytes], user: str) -> list[bytes | None]:
    name, _key, *fields = reader.command(user)
    assert name == "HMGET"
    return [mapping.get(f) for f in fields]


def test_decode_reads_what_the_writer_encodes() -> None:
    reader = FeastUserFeatures()
    key, mapping = USER_ACTIVITY.encode(ROW)
    assert reader.command("u123")[1] == key
    features = reader.decode(_hmget(reader, mapping, "u123"))
    assert features is not None
    assert features.as_of_ms == int(AS_OF.timestamp() * 1000)
    assert features.last_event_time_ms == int(ROW["last_event_time"].timestamp() * 1000)
    assert features.events_1h == 5
    assert features.top_category == "hats"
    assert features.category_affinity == (("hats", 7.0), ("bags", 1.0))
    assert features.last_items_viewed == ("85123A", "71053")
    assert features.recent_purchases == ()
    assert features.region is None


def test_decode_of_a_user_without_a_row_is_none() -> None:
    reader = FeastUserFeatures()
    assert reader.decode([None] * (len(reader.command("nobody")) - 2)) is None
    assert reader.decode(None) is None


def test_decode_handles_nulls_written_as_empty_values() -> None:
    reader = FeastUserFeatures()
    row = dict(ROW, top_category=None, last_event_time=None, category_affinity_ids=[],
               category_affinity_weights=[], last_viewed_items=[])
    _, mapping = USER_ACTIVITY.encode(row)
    features = reader.decode(_hmget(reader, mapping, "u123"))
    assert features is not None
    assert features.top_category is None and features.last_event_time_ms is None
    assert features.category_affinity == () and features.last_items_viewed == ()


def test_optional_purchases_and_region_are_read_when_the_view_has_them() -> None:
    extended = ViewSpec(
        name=USER_ACTIVITY.name, entity=USER_ACTIVITY.entity, join_key=USER_ACTIVITY.join_key,
        features=USER_ACTIVITY.features + (("region", "string"),),
    )
    reader = FeastUserFeatures(spec=extended)
    _, mapping = extended.encode(dict(ROW, last_purchased_items=["22423"], region="United Kingdom"))
    features = reader.decode(_hmget(reader, mapping, "u123"))
    assert features is not None
    assert features.recent_purchases == ("22423",)
    assert features.region == "United Kingdom"


def test_default_reader_reads_last_purchased_items() -> None:
    reader = FeastUserFeatures()
    _, mapping = USER_ACTIVITY.encode(dict(ROW, last_purchased_items=["22423", "85123A"]))
    features = reader.decode(_hmget(reader, mapping, "u123"))
    assert features is not None
    assert features.recent_purchases == ("22423", "85123A")
