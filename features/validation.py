"""The event contract as Spark column expressions.

Generated from :data:`features.events.FIELDS`, check for check in the order of
:func:`features.events.validate_event`, so a record gets the same verdict in
the stream, the backfill and the Python validator. JSON is parsed once into a
``VARIANT`` (``try_parse_json``) whose per-field type is read with
``schema_of_variant``: that distinguishes ``"7"`` from ``7`` and ``null`` from
a missing field, which ``from_json`` cannot.

Everything here is DataFrame in, DataFrame out; no session, no I/O.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from features.events import (
    EPOCH_MILLIS_MAX,
    FIELDS,
    ISO_TIMESTAMP_PATTERN,
    MAX_FUTURE,
    PRICE_MAX,
    PRICED_EVENT_TYPES,
    QUANTITY_MAX,
    VALID_COLUMNS,
    WHITESPACE,
    EVENT_TYPES,
    FieldSpec,
    Reason,
)

__all__ = ["validate_events", "QUARANTINE_COLUMNS", "with_verdict"]

QUARANTINE_COLUMNS: tuple[str, ...] = (
    "reason",
    "field",
    "raw_value",
    "raw_key",
    "topic",
    "partition",
    "offset",
    "kafka_timestamp",
    "ingest_time",
)
"""Columns of a quarantine row: why, the raw bytes, and where they came from."""

_NUMERIC_TYPE = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL\(\d+,\d+\))$"


def _is_integral(number: Column) -> Column:
    """True for finite whole numbers; pure double arithmetic (``floor`` overflows under ANSI)."""
    return (number % F.lit(1.0)) == F.lit(0.0)


def _field_type(doc: Column, name: str) -> Column:
    """``NULL`` when absent, ``VOID`` for JSON null, else STRING/BIGINT/DECIMAL(p,s)/DOUBLE/..."""
    return F.schema_of_variant(F.try_variant_get(doc, f"$.{name}", "variant"))


def _field_checks(spec: FieldSpec, doc: Column, now: Column) -> list[tuple[Column, Reason]]:
    """(condition, reason) pairs for one field, in the Python validator's order."""
    typ = _field_type(doc, spec.name)
    missing = typ.isNull() | (typ == F.lit("VOID"))
    present = ~missing
    checks: list[tuple[Column, Reason]] = []
    if spec.required:
        checks.append((missing, Reason.MISSING_FIELD))

    if spec.kind in ("id", "string", "event_type"):
        text = F.try_variant_get(doc, f"$.{spec.name}", "string")
        checks.append((present & (typ != F.lit("STRING")), Reason.WRONG_TYPE))
        checks.append((present & (F.length(F.btrim(text, F.lit(WHITESPACE))) == 0), Reason.EMPTY_FIELD))
        if spec.max_length is not None:
            checks.append((present & (F.char_length(text) > spec.max_length), Reason.FIELD_TOO_LONG))
        if spec.kind == "event_type":
            checks.append((present & ~text.isin(*EVENT_TYPES), Reason.UNKNOWN_EVENT_TYPE))
        return checks

    is_number = typ.rlike(_NUMERIC_TYPE)
    number = F.try_variant_get(doc, f"$.{spec.name}", "double")
    finite = ~(F.isnan(number) | number.isin(float("inf"), float("-inf")))

    if spec.kind == "timestamp":
        is_string = typ == F.lit("STRING")
        checks.append((present & ~is_string & ~is_number, Reason.WRONG_TYPE))
        parsed = _parse_event_time(doc, typ)
        checks.append((present & parsed.isNull(), Reason.INVALID_TIMESTAMP))
        checks.append(
            (present & (parsed > now + F.expr(f"INTERVAL {int(MAX_FUTURE.total_seconds())} SECONDS")),
             Reason.FUTURE_TIMESTAMP)
        )
        return checks

    checks.append((present & ~is_number, Reason.WRONG_TYPE))
    if spec.kind == "price":
        checks.append((present & (~finite | (number > PRICE_MAX)), Reason.NUMERIC_OVERFLOW))
        checks.append((present & (number < 0), Reason.NEGATIVE_PRICE))
    else:  # quantity
        checks.append((present & (~finite | (F.abs(number) > QUANTITY_MAX)), Reason.NUMERIC_OVERFLOW))
        checks.append((present & (~_is_integral(number) | (number < 1)), Reason.INVALID_QUANTITY))
    return checks


def _parse_event_time(doc: Column, typ: Column) -> Column:
    text = F.try_variant_get(doc, "$.event_time", "string")
    millis = F.try_variant_get(doc, "$.event_time", "double")
    iso = F.when(text.rlike(ISO_TIMESTAMP_PATTERN), F.try_to_timestamp(text))
    in_range = _is_integral(millis) & (millis >= 0) & (millis <= EPOCH_MILLIS_MAX)
    epoch = F.when(in_range, F.timestamp_millis(millis.cast("bigint")))
    return F.when(typ == F.lit("STRING"), iso).when(typ.rlike(_NUMERIC_TYPE), epoch)


def with_verdict(raw: DataFrame, now: Column | datetime | None = None, check_key: bool = False) -> DataFrame:
    """Add ``reason`` / ``field`` (null when valid) and the typed event columns.

    Parameters
    ----------
    raw
        Rows with a binary or string ``value`` (and ``key`` when ``check_key``).
    now
        Processing time for the future-timestamp rule; default ``current_timestamp()``.
    """
    now_col = F.current_timestamp() if now is None else (now if isinstance(now, Column) else F.lit(now))
    value = F.col("value").cast("binary")
    doc = F.col("_doc")
    ordered: list[tuple[Column, Reason, str | None]] = [
        (value.isNull() | (F.length(value) == 0), Reason.EMPTY_PAYLOAD, None),
        (~F.is_valid_utf8(value), Reason.INVALID_ENCODING, None),
        (doc.isNull(), Reason.INVALID_JSON, None),
        (~F.schema_of_variant(doc).startswith("OBJECT"), Reason.NOT_AN_OBJECT, None),
    ]
    for spec in FIELDS:
        ordered.extend((cond, reason, spec.name) for cond, reason in _field_checks(spec, doc, now_col))
    event_type = F.try_variant_get(doc, "$.event_type", "string")
    price_type = _field_type(doc, "price")
    ordered.append(
        (event_type.isin(*PRICED_EVENT_TYPES) & (price_type.isNull() | (price_type == "VOID")),
         Reason.MISSING_PRICE, "price")
    )
    if check_key:
        key = F.col("key").cast("string")
        ordered.append((key.isNull() | (F.length(key) == 0), Reason.MISSING_KEY, None))
        ordered.append((key != F.try_variant_get(doc, "$.user_id", "string"), Reason.KEY_MISMATCH, None))

    reason = F.lit(None).cast("string")
    field = F.lit(None).cast("string")
    for cond, code, name in reversed(ordered):
        reason = F.when(cond, F.lit(code.value)).otherwise(reason)
        field = F.when(cond, F.lit(name)).otherwise(field)

    typed = {
        "event_id": F.try_variant_get(doc, "$.event_id", "string"),
        "event_type": event_type,
        "event_time": _parse_event_time(doc, _field_type(doc, "event_time")),
        "user_id": F.try_variant_get(doc, "$.user_id", "string"),
        "session_id": F.try_variant_get(doc, "$.session_id", "string"),
        "item_id": F.try_variant_get(doc, "$.item_id", "string"),
        "category_id": F.try_variant_get(doc, "$.category_id", "string"),
        "region": F.try_variant_get(doc, "$.region", "string"),
        "price": F.try_variant_get(doc, "$.price", "double"),
        "quantity": F.coalesce(F.try_variant_get(doc, "$.quantity", "int"), F.lit(1)),
        "device": F.try_variant_get(doc, "$.device", "string"),
    }
    assert tuple(typed) == VALID_COLUMNS
    parsed = raw.withColumn(
        "_doc", F.when(F.is_valid_utf8(value), F.try_parse_json(value.cast("string")))
    )
    return parsed.select("*", reason.alias("reason"), field.alias("field"),
                         *[c.alias(n) for n, c in typed.items()]).drop("_doc")


def validate_events(
    raw: DataFrame, now: Column | datetime | None = None, check_key: bool = False
) -> tuple[DataFrame, DataFrame]:
    """Split raw Kafka rows into valid events and quarantine rows.

    Parameters
    ----------
    raw
        Kafka source rows (``key``, ``value``, ``topic``, ``partition``, ``offset``,
        ``timestamp``); missing metadata columns are filled with nulls so replay
        files validate the same way.

    Returns
    -------
    (valid, quarantine)
        ``valid`` has :data:`features.events.VALID_COLUMNS` plus ``topic``,
        ``partition``, ``offset``; ``quarantine`` has :data:`QUARANTINE_COLUMNS`.
    """
    for name, typ in (("key", "binary"), ("topic", "string"), ("partition", "int"),
                      ("offset", "bigint"), ("timestamp", "timestamp")):
        if name not in raw.columns:
            raw = raw.withColumn(name, F.lit(None).cast(typ))
    checked = with_verdict(raw, now=now, check_key=check_key)
    valid = checked.where(F.col("reason").isNull()).select(
        *VALID_COLUMNS, "topic", "partition", "offset"
    )
    quarantine = checked.where(F.col("reason").isNotNull()).select(
        "reason",
        "field",
        F.col("value").cast("binary").alias("raw_value"),
        F.col("key").cast("binary").alias("raw_key"),
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        F.current_timestamp().alias("ingest_time"),
    )
    return valid, quarantine
