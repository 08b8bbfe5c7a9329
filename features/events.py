"""Clickstream event contract, version 1: the one definition of a valid event.

The field table :data:`FIELDS` and the reason codes :class:`Reason` drive two
implementations that must agree row for row:

* :func:`validate_event` here, in plain Python, for producers, the replay tool,
  the API and unit tests;
* :func:`features.validation.validate_events` for Spark, built from the same
  table with native column expressions (so the stream never calls Python per
  row).

``tests/integration/test_stream_validation.py`` runs both over the same corpus
and requires identical verdicts.

Checks run in a fixed order and the first failure wins, so a record has
exactly one reason: payload (empty, encoding, JSON, object), then each field in
the order of :data:`FIELDS` (missing, type, empty, length, value), then the
cross-field rule (price required for carts and purchases), then the Kafka key.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

__all__ = [
    "SCHEMA_VERSION",
    "EVENT_TYPES",
    "MAX_ID_LENGTH",
    "MAX_FUTURE",
    "PRICE_MAX",
    "QUANTITY_MAX",
    "EPOCH_MILLIS_MAX",
    "ISO_TIMESTAMP_PATTERN",
    "Reason",
    "FieldSpec",
    "FIELDS",
    "VALID_COLUMNS",
    "EVENT_IDENTITY",
    "Event",
    "Rejection",
    "validate_event",
    "parse_iso_timestamp",
    "event_to_json",
]

SCHEMA_VERSION = 1
EVENT_TYPES: tuple[str, ...] = ("view", "add_to_cart", "purchase")
PRICED_EVENT_TYPES: tuple[str, ...] = ("add_to_cart", "purchase")
MAX_ID_LENGTH = 64
MAX_FUTURE = timedelta(minutes=5)
PRICE_MAX = 1e9
"""Prices above this (or not finite) are ``numeric_overflow``."""
QUANTITY_MAX = 2**31 - 1
EPOCH_MILLIS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
ISO_TIMESTAMP_PATTERN = (
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?$"
)
"""ISO-8601 date-time; no offset means UTC. Shared with the Spark validator."""
WHITESPACE = " \t\n\r"
"""Characters that do not make a string non-empty (the same set in Spark's ``btrim``)."""

_ISO_RE = re.compile(ISO_TIMESTAMP_PATTERN)


class Reason(StrEnum):
    """Why a record was rejected; stable codes stored in the quarantine."""

    EMPTY_PAYLOAD = "empty_payload"
    INVALID_ENCODING = "invalid_encoding"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    EMPTY_FIELD = "empty_field"
    FIELD_TOO_LONG = "field_too_long"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    INVALID_TIMESTAMP = "invalid_timestamp"
    FUTURE_TIMESTAMP = "future_timestamp"
    NUMERIC_OVERFLOW = "numeric_overflow"
    NEGATIVE_PRICE = "negative_price"
    MISSING_PRICE = "missing_price"
    INVALID_QUANTITY = "invalid_quantity"
    MISSING_KEY = "missing_key"
    KEY_MISMATCH = "key_mismatch"
    LATE_EVENT = "late_event"
    """Only the stream decides this: older than its watermark (see the streaming job)."""


Kind = Literal["id", "string", "event_type", "timestamp", "price", "quantity"]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of the contract; both validators are generated from these."""

    name: str
    kind: Kind
    required: bool = True
    max_length: int | None = MAX_ID_LENGTH


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("event_id", "id"),
    FieldSpec("event_type", "event_type"),
    FieldSpec("event_time", "timestamp", max_length=None),
    FieldSpec("user_id", "id"),
    FieldSpec("session_id", "id"),
    FieldSpec("item_id", "id"),
    FieldSpec("category_id", "id"),
    FieldSpec("region", "id"),
    FieldSpec("price", "price", required=False, max_length=None),
    FieldSpec("quantity", "quantity", required=False, max_length=None),
    FieldSpec("device", "string", required=False),
)

VALID_COLUMNS: tuple[str, ...] = tuple(f.name for f in FIELDS)
"""Columns of a validated event, in order (``event_time`` a UTC timestamp)."""

EVENT_IDENTITY: tuple[str, ...] = ("event_id", "event_time")
"""What makes two records one event, for every dedup (stream, Real-time, backfill, training):
a copy (a producer's retry, a replayed range) carries both; an id reused at another time is
another event."""


@dataclass(frozen=True, slots=True)
class Event:
    """A validated clickstream event."""

    event_id: str
    event_type: str
    event_time: datetime
    user_id: str
    session_id: str
    item_id: str
    category_id: str
    region: str
    price: float | None
    quantity: int
    device: str | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in VALID_COLUMNS}


@dataclass(frozen=True, slots=True)
class Rejection:
    """A record the contract rejects: the reason code and the field it concerns."""

    reason: Reason
    field: str | None = None

    def __str__(self) -> str:
        return f"{self.reason.value}:{self.field}" if self.field else self.reason.value


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; Spark's parser refuses them too.
    raise ValueError(f"non-standard JSON constant {name}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def parse_iso_timestamp(text: str) -> datetime | None:
    """Parse the contract's ISO-8601 form into an aware UTC datetime, or ``None``."""
    if not _ISO_RE.match(text):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _check_field(spec: FieldSpec, obj: dict[str, Any], now: datetime) -> tuple[Rejection | None, Any]:
    value = obj.get(spec.name)
    if value is None:
        if spec.required:
            return Rejection(Reason.MISSING_FIELD, spec.name), None
        return None, (1 if spec.kind == "quantity" else None)

    if spec.kind in ("id", "string", "event_type"):
        if not isinstance(value, str):
            return Rejection(Reason.WRONG_TYPE, spec.name), None
        if not value.strip(WHITESPACE):
            return Rejection(Reason.EMPTY_FIELD, spec.name), None
        if spec.max_length is not None and len(value) > spec.max_length:
            return Rejection(Reason.FIELD_TOO_LONG, spec.name), None
        if spec.kind == "event_type" and value not in EVENT_TYPES:
            return Rejection(Reason.UNKNOWN_EVENT_TYPE, spec.name), None
        return None, value

    if spec.kind == "timestamp":
        if isinstance(value, str):
            parsed = parse_iso_timestamp(value)
            if parsed is None:
                return Rejection(Reason.INVALID_TIMESTAMP, spec.name), None
        elif _is_number(value):
            millis = _as_float(value)
            if not (math.isfinite(millis) and millis.is_integer() and 0 <= millis <= EPOCH_MILLIS_MAX):
                return Rejection(Reason.INVALID_TIMESTAMP, spec.name), None
            parsed = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=int(millis))
        else:
            return Rejection(Reason.WRONG_TYPE, spec.name), None
        if parsed > now + MAX_FUTURE:
            return Rejection(Reason.FUTURE_TIMESTAMP, spec.name), None
        return None, parsed

    if not _is_number(value):
        return Rejection(Reason.WRONG_TYPE, spec.name), None
    number = _as_float(value)
    if spec.kind == "price":
        if not math.isfinite(number) or number > PRICE_MAX:
            return Rejection(Reason.NUMERIC_OVERFLOW, spec.name), None
        if number < 0:
            return Rejection(Reason.NEGATIVE_PRICE, spec.name), None
        return None, number
    # quantity
    if not math.isfinite(number) or abs(number) > QUANTITY_MAX:
        return Rejection(Reason.NUMERIC_OVERFLOW, spec.name), None
    if not number.is_integer() or number < 1:
        return Rejection(Reason.INVALID_QUANTITY, spec.name), None
    return None, int(number)


def validate_event(
    value: bytes | str | None,
    *,
    now: datetime | None = None,
    key: bytes | str | None = None,
    check_key: bool = False,
) -> Event | Rejection:
    """Validate one raw record against the contract.

    Parameters
    ----------
    value
        The Kafka record value (or a JSON string).
    now
        Processing time for the "not more than 5 minutes in the future" rule;
        default the current UTC time.
    key, check_key
        With ``check_key``, the Kafka key must be present and equal ``user_id``.

    Returns
    -------
    Event | Rejection
        The typed event, or the first rule it breaks.
    """
    now = now or datetime.now(UTC)
    if value is None or len(value) == 0:
        return Rejection(Reason.EMPTY_PAYLOAD)
    if isinstance(value, bytes | bytearray):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return Rejection(Reason.INVALID_ENCODING)
    else:
        text = value
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return Rejection(Reason.INVALID_JSON)
    if not isinstance(obj, dict):
        return Rejection(Reason.NOT_AN_OBJECT)

    values: dict[str, Any] = {}
    for spec in FIELDS:
        rejection, parsed = _check_field(spec, obj, now)
        if rejection is not None:
            return rejection
        values[spec.name] = parsed
    if values["event_type"] in PRICED_EVENT_TYPES and values["price"] is None:
        return Rejection(Reason.MISSING_PRICE, "price")
    if check_key:
        key_text = key.decode("utf-8", "replace") if isinstance(key, bytes | bytearray) else key
        if not key_text:
            return Rejection(Reason.MISSING_KEY)
        if key_text != values["user_id"]:
            return Rejection(Reason.KEY_MISMATCH)
    return Event(**values)


def event_to_json(event: dict[str, Any]) -> bytes:
    """Serialize an event dict as the wire format (compact UTF-8 JSON).

    ``datetime`` values become ISO-8601 UTC strings with a ``Z`` suffix.
    """

    def default(obj: Any) -> Any:
        if isinstance(obj, datetime):
            return obj.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        raise TypeError(f"cannot serialize {type(obj).__name__}")

    return json.dumps(event, separators=(",", ":"), default=default, ensure_ascii=False).encode()
