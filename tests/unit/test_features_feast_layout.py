"""The pure Feast Redis encoding against Feast's own functions (no Redis, no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pytest
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import _mmh3, _redis_key
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from feast.type_map import python_values_to_proto_values
from feast.value_type import ValueType

from features.feast_layout import (
    ITEM_STATS,
    PROJECT,
    USER_ACTIVITY,
    VIEWS,
    decode_timestamp,
    decode_value,
    encode_timestamp,
    encode_value,
    entity_key,
    feature_field,
    timestamp_field,
)
from features.windows import ITEM_FEATURE_COLUMNS, USER_FEATURE_COLUMNS

FEAST_TYPES = {
    "int64": ValueType.INT64,
    "double": ValueType.DOUBLE,
    "string": ValueType.STRING,
    "timestamp": ValueType.UNIX_TIMESTAMP,
    "string_list": ValueType.STRING_LIST,
    "double_list": ValueType.DOUBLE_LIST,
}


@pytest.mark.parametrize("value", ["u1", "", "ü:ñ*|x", "a" * 64, "12345"])
def test_entity_key_equals_feast_redis_key(value: str) -> None:
    proto = EntityKey(join_keys=["user_id"], entity_values=[Value(string_val=value)])
    assert entity_key("user_id", value) == _redis_key(PROJECT, proto)
    assert entity_key("user_id", value).startswith(serialize_entity_key(proto, 3))


def test_feature_field_equals_feast_mmh3() -> None:
    for spec in VIEWS.values():
        for name in spec.feature_names:
            assert feature_field(spec.name, name) == _mmh3(f"{spec.name}:{name}")
    assert timestamp_field("user_activity") == b"_ts:user_activity"


@pytest.mark.parametrize(("kind", "values"), [
    ("int64", [0, 1, -5, 2**40]),
    ("double", [0.0, 1.5, 1e-12, 12.25]),
    ("string", ["c1", "", "ü"]),
    ("timestamp", [datetime(2024, 3, 10, 12, 0, 7, tzinfo=UTC), datetime(1999, 1, 1, tzinfo=UTC)]),
    ("string_list", [["a", "b"], []]),
    ("double_list", [[1.0, 0.5], []]),
])
def test_encode_value_equals_feast(kind: str, values: list) -> None:
    feast = python_values_to_proto_values(values, FEAST_TYPES[kind])
    assert [encode_value(kind, v) for v in values] == [p.SerializeToString() for p in feast]
    for v in values:
        assert decode_value(kind, encode_value(kind, v)) == v


@pytest.mark.parametrize("kind", sorted(FEAST_TYPES))
def test_encode_none_equals_feast(kind: str) -> None:
    sample = {"int64": 1, "double": 1.0, "string": "x",
              "timestamp": datetime(2024, 1, 1, tzinfo=UTC),
              "string_list": ["x"], "double_list": [1.0]}[kind]
    values: Any = [sample, None]
    if kind == "timestamp":
        # Feast's DataFrame write path sees a datetime column with NaT, not None
        values = pd.Series(values, dtype="datetime64[ns, UTC]").dt.tz_localize(None).to_numpy()
    feast = python_values_to_proto_values(values, FEAST_TYPES[kind])
    assert encode_value(kind, None) == feast[1].SerializeToString()
    assert decode_value(kind, encode_value(kind, None)) is None


def test_view_specs_match_finalize_columns() -> None:
    assert USER_ACTIVITY.columns == USER_FEATURE_COLUMNS
    assert ITEM_STATS.columns == ITEM_FEATURE_COLUMNS


def test_view_encode_decode_round_trip() -> None:
    row = {"item_id": "A", "category_id": "c1", "event_timestamp": datetime(2024, 1, 1, tzinfo=UTC),
           **{name: 3 if kind == "int64" else 0.5 for name, kind in ITEM_STATS.features
              if name != "category_id"}}
    key, mapping = ITEM_STATS.encode(row)
    assert key == entity_key("item_id", "A")
    assert len(mapping) == len(ITEM_STATS.features) + 1
    decoded = ITEM_STATS.decode(mapping)
    assert decoded == {name: row[name] for name in ITEM_STATS.feature_names}


def test_hset_args_are_the_encoded_hash_with_the_event_timestamp_last() -> None:
    # the Real-time feed and the writers send these as one HSET; encode_entity_rows reads
    # the event timestamp from the last argument, so its place is part of the contract
    when = datetime(2024, 1, 1, 12, 30, 15, 250_000, tzinfo=UTC)
    row = {"user_id": "u1", "event_timestamp": when, "views_1h": 2, "views_24h": 5, "carts_1h": 0,
           "carts_24h": 1, "purchases_1h": 0, "purchases_24h": 1, "spend_1h": 0.0,
           "spend_24h": 12.5, "distinct_items_viewed_1h": 2, "last_event_time": when,
           "top_category": "c1", "category_affinity_ids": ["c1", "c2"],
           "category_affinity_weights": [3.0, 1.0], "last_viewed_items": ["A", "B"],
           "last_purchased_items": None}
    key, args = USER_ACTIVITY.hset_args(row)
    assert (key, dict(zip(args[::2], args[1::2], strict=True))) == USER_ACTIVITY.encode(row)
    assert len(args) == 2 * (len(USER_ACTIVITY.features) + 1)
    assert args[-2] == timestamp_field("user_activity")
    assert decode_timestamp(args[-1]) == when
    assert USER_ACTIVITY.decode(dict(zip(args[::2], args[1::2], strict=True)))["spend_24h"] == 12.5


def test_a_row_without_an_optional_feature_encodes_it_as_null() -> None:
    # writers that build rows by hand predate last_purchased_items; a required feature still fails
    row = {"user_id": "u1", "event_timestamp": datetime(2024, 1, 1, tzinfo=UTC),
           **{name: None for name in USER_ACTIVITY.feature_names if name != "last_purchased_items"}}
    assert "last_purchased_items" in USER_ACTIVITY.optional
    _, mapping = USER_ACTIVITY.encode(row)
    assert USER_ACTIVITY.decode(mapping)["last_purchased_items"] is None
    del row["views_1h"]
    with pytest.raises(KeyError):
        USER_ACTIVITY.encode(row)


def test_layout_and_serving_import_without_the_feast_package() -> None:
    # importing feast costs seconds per process (each serving worker); the layout needs only
    # Feast's generated Value protos
    import subprocess
    import sys

    code = ("import sys, features.feast_layout, serving.client, serving.app; "
            "print(sorted(m for m in sys.modules if m == 'feast' or m.startswith('feast.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_layout_protos_are_feasts_own_classes_when_feast_is_imported_later() -> None:
    import subprocess
    import sys

    code = ("from features import feast_layout as layout\n"
            "from feast.protos.feast.types import Value_pb2\n"
            "assert layout.ValueProto is Value_pb2.Value\n"
            "assert layout.StringList is Value_pb2.StringList\n"
            "assert layout.DoubleList is Value_pb2.DoubleList\n"
            "from feast.type_map import python_values_to_proto_values\n"
            "from feast.value_type import ValueType\n"
            "ours = layout.encode_value('string_list', ['a', 'b'])\n"
            "theirs = python_values_to_proto_values([['a', 'b']], ValueType.STRING_LIST)[0]\n"
            "assert ours == theirs.SerializeToString()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_scalar_fast_paths_equal_protobuf_bytes() -> None:
    """Scalars are written in the wire format by hand; protobuf must agree byte for byte."""
    import random

    from google.protobuf.timestamp_pb2 import Timestamp

    from features.feast_layout import encode_timestamp

    rnd = random.Random(7)
    ints = [0, 1, 127, 128, 4095, 4096, -1, -(2**63), 2**63 - 1,
            *(rnd.randrange(-(2**63), 2**63) for _ in range(300))]
    for v in ints:
        assert encode_value("int64", v) == Value(int64_val=v).SerializeToString(), v
    doubles = [0.0, -0.0, float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308,
               *(rnd.uniform(-1e9, 1e9) for _ in range(300))]
    for d in doubles:
        assert encode_value("double", d) == Value(double_val=d).SerializeToString(), d
    for text in ["", "a", "é" * 100, "x" * 300, "\u2603|c1"]:
        assert encode_value("string", text) == Value(string_val=text).SerializeToString()
    for when in [datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 5, tzinfo=UTC),
                 datetime(2024, 3, 10, 12, 0, 7, 123456, tzinfo=UTC), datetime(2024, 3, 10),
                 *(datetime.fromtimestamp(rnd.uniform(-1e9, 4e9), tz=UTC) for _ in range(300))]:
        proto = Timestamp()
        proto.FromDatetime(when if when.tzinfo else when.replace(tzinfo=UTC))
        assert encode_timestamp(when) == proto.SerializeToString(), when
        seconds = int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())
        assert encode_value("timestamp", when) == Value(
            unix_timestamp_val=seconds).SerializeToString()
    from features.feast_layout import DoubleList, StringList

    texts = ["", "c1", "é" * 70, "x" * 200, "\u2603|i9"]
    for n in [0, 1, 2, 3, 17, 40]:
        strings = [rnd.choice(texts) for _ in range(n)]
        assert encode_value("string_list", strings) == Value(
            string_list_val=StringList(val=strings)).SerializeToString(), strings
        numbers = [rnd.choice((0.0, -0.0, 1.0, 5e-324, float("inf"), rnd.uniform(-1e6, 1e6)))
                   for _ in range(n)]
        assert encode_value("double_list", numbers) == Value(
            double_list_val=DoubleList(val=numbers)).SerializeToString(), numbers
        assert decode_value("double_list", encode_value("double_list", numbers)) == numbers
        assert decode_value("string_list", encode_value("string_list", strings)) == strings


@pytest.mark.parametrize("ts", [
    datetime(2024, 6, 1, 12, 0, 0, 123_456, tzinfo=UTC),
    datetime(2024, 6, 1, 12, 0, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
])
def test_decode_timestamp_inverts_encode_to_the_microsecond(ts: datetime) -> None:
    """Snapshots and ``verify`` read the row timestamp back: a float detour lost microseconds."""
    assert decode_timestamp(encode_timestamp(ts)) == ts
    assert decode_timestamp(None) is None
