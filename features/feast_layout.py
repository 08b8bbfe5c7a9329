"""Feast's Redis layout for shopstream's entity features, as pure functions.

The feature views ``user_activity`` and ``item_stats`` are declared here once
(names, entity join keys, features and their types); the Feast definitions
(:mod:`pipelines.feast_store`) are generated from these specs, and the fast
online writer (:mod:`pipelines.online_writer`) encodes rows with them, so that
Feast's own ``FeatureStore.get_online_features`` reads what the writer wrote.

The layout is Feast 0.67's ``RedisOnlineStore`` (``sdk/python/feast/infra/
online_stores/redis.py``) with ``entity_key_serialization_version: 3``:

* key: ``serialize_entity_key(EntityKey(join_keys=[k], entity_values=[v]))``
  followed by the project name's UTF-8 bytes. Version 3 is, for one string key,
  ``<I 1>`` (number of keys), ``<I STRING=2>``, ``<I len(k)>``, ``k``, then
  ``<I STRING=2>``, ``<I len(v)>``, ``v`` (all little-endian);
* one Redis hash per entity key, shared by every feature view of that entity;
* field ``mmh3_32("{view}:{feature}")`` (4 bytes, little-endian, unsigned
  murmur3 seed 0) -> a serialized ``feast.types.Value`` protobuf;
* field ``_ts:{view}`` -> a serialized ``google.protobuf.Timestamp`` of the
  row's event timestamp;
* ``EXPIRE`` with the online store's ``key_ttl_seconds`` when it is set.

Values: ``int64`` -> ``int64_val``, ``double`` -> ``double_val``, ``string`` ->
``string_val``, ``timestamp`` -> ``unix_timestamp_val`` (whole seconds, as Feast
stores ``UnixTimestamp``), ``string_list`` -> ``string_list_val``,
``double_list`` -> ``double_list_val``; ``None`` is an empty ``Value`` (Feast's
null), except for timestamps, where Feast writes the ``NaT`` sentinel
:data:`NULL_TIMESTAMP`. ``tests/integration/test_online_writer.py`` checks the bytes against
Feast's own writer and the values against ``get_online_features``.

No I/O here; only ``mmh3`` and Feast's generated protobuf classes. Those are
loaded from Feast's own ``Value_pb2.py`` *without* importing the ``feast``
package (whose ``__init__`` pulls in most of Feast: seconds per process), see
:func:`_value_protos`; the classes are the very ones Feast uses once it is
imported (protobuf keys them by descriptor).
"""

from __future__ import annotations

import importlib.util
import math
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Literal

import mmh3

_FEAST_VALUE_MODULE = "feast.protos.feast.types.Value_pb2"


def _value_protos() -> ModuleType:
    """Feast's generated ``feast/types/Value.proto`` module, without ``import feast``.

    The generated file only needs ``google.protobuf``; it is executed from the
    installed Feast under a private module name. It registers the same file
    descriptor Feast registers later (an identical registration is a no-op), so
    ``Value`` here *is* ``feast.protos.feast.types.Value_pb2.Value``. Falls back
    to the ordinary import when the file cannot be located.
    """
    loaded = sys.modules.get(_FEAST_VALUE_MODULE)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("feast")  # locates the package, does not run it
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root, "protos", "feast", "types", "Value_pb2.py")
        file_spec = importlib.util.spec_from_file_location("_shopstream_feast_value_pb2", path)
        if path.is_file() and file_spec is not None and file_spec.loader is not None:
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return module
    return importlib.import_module(_FEAST_VALUE_MODULE)  # pragma: no cover - unusual installs


_protos = _value_protos()
ValueProto = _protos.Value
StringList = _protos.StringList
DoubleList = _protos.DoubleList

__all__ = [
    "PROJECT",
    "ENTITY_KEY_SERIALIZATION_VERSION",
    "FeatureKind",
    "ViewSpec",
    "USER_ACTIVITY",
    "ITEM_STATS",
    "VIEWS",
    "entity_key",
    "feature_field",
    "timestamp_field",
    "encode_value",
    "encode_timestamp",
    "decode_timestamp",
    "decode_value",
]

PROJECT = "shopstream"
"""The Feast project name (part of every entity key in Redis)."""
ENTITY_KEY_SERIALIZATION_VERSION = 3
_STRING = 2  # feast.types.ValueType.STRING
NULL_TIMESTAMP = -(2**63)
"""Feast's null ``UnixTimestamp`` (``NaT`` as int64); it writes this, not an empty Value."""

FeatureKind = Literal["int64", "double", "string", "timestamp", "string_list", "double_list"]


@lru_cache(maxsize=1 << 16)
def entity_key(join_key: str, value: str, project: str = PROJECT) -> bytes:
    """The Redis key of one entity (string join key), as Feast's ``_redis_key`` builds it.

    Cached: the Real-time feed names each touched entity's key twice a flush (its stored
    timestamp, then its row), for the same active users and items flush after flush."""
    k = join_key.encode("utf-8")
    v = str(value).encode("utf-8")
    return b"".join(
        (
            struct.pack("<III", 1, _STRING, len(k)),
            k,
            struct.pack("<II", _STRING, len(v)),
            v,
            project.encode("utf-8"),
        )
    )


def feature_field(view: str, feature: str) -> bytes:
    """The hash field of one feature: unsigned murmur3-32 of ``view:feature``, little-endian."""
    return struct.pack("<I", mmh3.hash(f"{view}:{feature}", signed=False))


def timestamp_field(view: str) -> bytes:
    """The hash field holding a view's event timestamp."""
    return f"_ts:{view}".encode()


def _aware(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _varint(value: int) -> bytes:
    """A protobuf varint (negative int64 as its 64-bit two's complement, 10 bytes)."""
    if 0 <= value < 128:  # most lengths
        return _ONE_BYTE[value]
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = tuple(bytes((i,)) for i in range(128))

# Wire-format tags (field number << 3 | wire type) of the Value fields written by hand
# below; tests/unit/test_features_feast_layout.py checks the bytes against protobuf's.
_TAG_STRING = b"\x12"  # string_val = 2, length-delimited
_TAG_INT64 = b"\x20"  # int64_val = 4, varint
_TAG_DOUBLE = b"\x29"  # double_val = 5, 64-bit
_TAG_UNIX_TS = b"\x40"  # unix_timestamp_val = 8, varint
_TAG_STRING_LIST = b"\x62"  # string_list_val = 12, length-delimited (a StringList)
_TAG_DOUBLE_LIST = b"\x7a"  # double_list_val = 15, length-delimited (a DoubleList)
_TAG_LIST_VAL = b"\x0a"  # StringList.val / DoubleList.val = 1, length-delimited (packed doubles)
_SMALL_INT64 = tuple(_TAG_INT64 + _varint(i) for i in range(4096))
_DOUBLE = struct.Struct("<d")
_EMPTY_VALUE = b""


@lru_cache(maxsize=64)
def encode_timestamp(ts: datetime) -> bytes:
    """A serialized ``google.protobuf.Timestamp`` (naive datetimes are UTC).

    Written by hand (seconds and nanos, zero fields left out as proto3 does):
    the stream encodes one per entity and micro-batch, and the message object
    cost more than the rest of the row. Cached: every row of a flush or a batch
    carries the same event timestamp, its clock.
    """
    delta = _aware(ts) - _EPOCH
    seconds = delta.days * 86_400 + delta.seconds
    nanos = delta.microseconds * 1000
    return ((b"\x08" + _varint(seconds) if seconds else b"")
            + (b"\x10" + _varint(nanos) if nanos else b""))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ABSENT = object()


def decode_timestamp(data: bytes | None) -> datetime | None:
    """Inverse of :func:`encode_timestamp`, exact to the microsecond (``None`` for no value;
    an empty message is the epoch: proto3 leaves zero fields out)."""
    if data is None:
        return None
    from google.protobuf.timestamp_pb2 import Timestamp  # type: ignore[import-untyped]

    ts = Timestamp()
    ts.ParseFromString(data)
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def _epoch_seconds(value: Any) -> int:
    if isinstance(value, datetime):
        return int(_aware(value).timestamp())
    return int(value)


def _encode_int64(value: Any) -> bytes:
    number = int(value)
    return _SMALL_INT64[number] if 0 <= number < 4096 else _TAG_INT64 + _varint(number)


def _encode_double(value: Any) -> bytes:
    return _TAG_DOUBLE + _DOUBLE.pack(float(value))


def _encode_string(value: Any) -> bytes:
    data = str(value).encode("utf-8")
    return _TAG_STRING + _varint(len(data)) + data


def _encode_timestamp_value(value: Any) -> bytes:
    return _TAG_UNIX_TS + _varint(_epoch_seconds(value))


@lru_cache(maxsize=1 << 16, typed=True)
def _string_element(value: Any) -> bytes:
    """One element of a ``StringList`` (cached: lists repeat the same category and item ids)."""
    data = ("" if value is None else str(value)).encode("utf-8")
    return _TAG_LIST_VAL + _varint(len(data)) + data


def _encode_string_list(value: Any) -> bytes:
    body = b"".join([_string_element(v) for v in value])
    return _TAG_STRING_LIST + _varint(len(body)) + body


def _encode_double_list(value: Any) -> bytes:
    doubles = [float(v) for v in value if v is not None]
    packed = struct.pack(f"<{len(doubles)}d", *doubles)
    body = _TAG_LIST_VAL + _varint(len(packed)) + packed if doubles else b""
    return _TAG_DOUBLE_LIST + _varint(len(body)) + body


_ENCODERS: Mapping[str, Any] = MappingProxyType({
    "int64": _encode_int64, "double": _encode_double, "string": _encode_string,
    "timestamp": _encode_timestamp_value, "string_list": _encode_string_list,
    "double_list": _encode_double_list,
})
_NULL: Mapping[str, bytes] = MappingProxyType({
    kind: _TAG_UNIX_TS + _varint(NULL_TIMESTAMP) if kind == "timestamp" else _EMPTY_VALUE
    for kind in _ENCODERS})


def encode_value(kind: FeatureKind, value: Any) -> bytes:
    """One feature value as Feast's serialized ``Value`` proto (``None`` -> empty Value).

    Written in the wire format directly (what ``SerializeToString`` returns, byte for
    byte): the Real-time feed encodes every touched entity's row, and the message
    classes cost more than the rest of it (lists were about a fifth of the feed's time).
    """
    return _NULL[kind] if value is None else _ENCODERS[kind](value)


def decode_value(kind: FeatureKind, data: bytes | None) -> Any:
    """Inverse of :func:`encode_value` (for tests and the consistency check)."""
    if not data:
        return None
    proto = ValueProto()
    proto.ParseFromString(data)
    which = proto.WhichOneof("val")
    if which is None:
        return None
    if kind == "timestamp":
        if proto.unix_timestamp_val == NULL_TIMESTAMP:
            return None
        return datetime.fromtimestamp(proto.unix_timestamp_val, tz=UTC)
    if kind in ("string_list", "double_list"):
        return list(getattr(proto, which).val)
    result = getattr(proto, which)
    if kind == "double" and isinstance(result, float) and math.isnan(result):
        return None
    return result


@dataclass(frozen=True)
class ViewSpec:
    """One Feast feature view: its name, entity, join key and typed features.

    Attributes
    ----------
    name
        Feature view name (also the snapshot folder name in the offline store).
    entity
        Feast entity name (``user`` / ``item``).
    join_key
        Entity join key column (``user_id`` / ``item_id``).
    features
        ``(feature name, kind)`` pairs, in the order of the finalize output.
    description
        Shown by ``feast feature-views list`` / the UI.
    optional
        Features a row may leave out (encoded as Feast's null): those added to
        the view after writers that build rows by hand existed.
    """

    name: str
    entity: str
    join_key: str
    features: tuple[tuple[str, FeatureKind], ...]
    description: str = ""
    optional: frozenset[str] = frozenset()
    _fields: tuple[bytes, ...] = field(init=False, repr=False, compare=False)
    _timestamp_field: bytes = field(init=False, repr=False, compare=False)
    # per feature: (hash field, name, its null bytes, its encoder), looked up once
    _encoders: tuple[tuple[bytes, str, bytes, Any], ...] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = tuple(feature_field(self.name, f) for f, _ in self.features)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_timestamp_field", timestamp_field(self.name))
        object.__setattr__(self, "_encoders", tuple(
            (fld, name, _NULL[kind], _ENCODERS[kind])
            for fld, (name, kind) in zip(fields, self.features, strict=True)))

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.features)

    @property
    def columns(self) -> tuple[str, ...]:
        """Columns a snapshot / row must have: join key, features, timestamps."""
        return (self.join_key, *self.feature_names, "event_timestamp", "created")

    def redis_key(self, entity_value: str, project: str = PROJECT) -> bytes:
        return entity_key(self.join_key, entity_value, project)

    def encode(self, row: Mapping[str, Any], project: str = PROJECT) -> tuple[bytes, dict[bytes, bytes]]:
        """``(redis key, {hash field: bytes})`` for one feature row (a dict or Spark Row).

        The row needs the join key, every feature and ``event_timestamp``.
        """
        key, args = self.hset_args(row, project)
        return key, dict(zip(args[::2], args[1::2], strict=True))

    def hset_args(self, row: Mapping[str, Any], project: str = PROJECT) -> tuple[bytes, list[bytes]]:
        """``(redis key, [field, value, field, value ...])``: :meth:`encode`'s hash as the
        arguments of one ``HSET``, the event timestamp's field and value last.

        Why a list: the Real-time feed encodes about one entity row a tile row, and
        building the dict, then flattening it for ``HSET``, was a fifth of the encoding.
        """
        args: list[bytes] = []
        append = args.append
        get = row.get if isinstance(row, dict) else None
        for fld, name, null, encoder in self._encoders:
            # a dict's get is the common case (finalized rows): no call per feature
            value = get(name, _ABSENT) if get is not None else _ABSENT
            if value is _ABSENT:
                value = self._value(row, name)
            append(fld)
            append(null if value is None else encoder(value))
        append(self._timestamp_field)
        append(encode_timestamp(row["event_timestamp"]))
        return self.redis_key(row[self.join_key], project), args

    def _value(self, row: Mapping[str, Any], name: str) -> Any:
        try:
            return row[name]
        except (KeyError, ValueError):  # a Spark Row raises ValueError for an unknown field
            if name in self.optional:
                return None
            raise

    def decode(self, mapping: Mapping[bytes, bytes]) -> dict[str, Any]:
        """Feature values from a Redis hash (the inverse of :meth:`encode`, minus the key)."""
        return {
            name: decode_value(kind, mapping.get(fld))
            for fld, (name, kind) in zip(self._fields, self.features, strict=True)
        }


USER_ACTIVITY = ViewSpec(
    name="user_activity",
    entity="user",
    join_key="user_id",
    description="A user's recent activity: sliding 1h/24h counts, spend, category affinity, "
                "last items viewed and purchased.",
    features=(
        ("views_1h", "int64"),
        ("views_24h", "int64"),
        ("carts_1h", "int64"),
        ("carts_24h", "int64"),
        ("purchases_1h", "int64"),
        ("purchases_24h", "int64"),
        ("spend_1h", "double"),
        ("spend_24h", "double"),
        ("distinct_items_viewed_1h", "int64"),
        ("last_event_time", "timestamp"),
        ("top_category", "string"),
        ("category_affinity_ids", "string_list"),
        ("category_affinity_weights", "double_list"),
        ("last_viewed_items", "string_list"),
        ("last_purchased_items", "string_list"),
    ),
    optional=frozenset({"last_purchased_items"}),
)

ITEM_STATS = ViewSpec(
    name="item_stats",
    entity="item",
    join_key="item_id",
    description="An item's sliding 1h/24h views, carts, sales, revenue, conversion and trending score.",
    features=(
        ("category_id", "string"),
        ("views_1h", "int64"),
        ("views_24h", "int64"),
        ("carts_1h", "int64"),
        ("carts_24h", "int64"),
        ("purchases_1h", "int64"),
        ("purchases_24h", "int64"),
        ("units_1h", "int64"),
        ("units_24h", "int64"),
        ("revenue_1h", "double"),
        ("revenue_24h", "double"),
        ("conversion_rate_1h", "double"),
        ("conversion_rate_24h", "double"),
        ("trending_score", "double"),
    ),
)

VIEWS: Mapping[str, ViewSpec] = {v.name: v for v in (USER_ACTIVITY, ITEM_STATS)}
"""Every entity feature view, by name."""

