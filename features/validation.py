"""The event contract as Spark column expressions.

Generated from :data:`features.events.FIELDS`, check for check in the order of
:func:`features.events.validate_event`, so a record gets the same verdict in
the stream, the backfill and the Python validator. JSON is parsed once into a
``VARIANT`` by Spark's parser, whose per-field types distinguish ``"7"`` from ``7``
and ``null`` from a missing field, which ``from_json`` cannot. The fields are read
from it by :data:`CONTRACT_FIELDS_FUNCTION` (the project's Java class) when the session
has it, else with ``try_variant_get`` and ``schema_of_variant``; see :func:`with_verdict`.

Everything here is DataFrame in, DataFrame out; no session, no I/O.
"""

from __future__ import annotations

import json
import operator
from datetime import datetime, timedelta
from functools import reduce
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from features.events import (
    EPOCH_MILLIS_MAX,
    EVENT_TYPES,
    FIELDS,
    ISO_TIMESTAMP_PATTERN,
    MAX_FUTURE,
    PRICE_MAX,
    PRICED_EVENT_TYPES,
    QUANTITY_MAX,
    VALID_COLUMNS,
    WHITESPACE,
    FieldSpec,
    Reason,
)

__all__ = ["validate_events", "QUARANTINE_COLUMNS", "with_verdict", "CONTRACT_FIELDS_FUNCTION",
           "VALID_UTF8_FUNCTION", "contract_fields_arguments"]

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

_NUMERIC_TYPES = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")
"""What ``schema_of_variant`` names a JSON number (and ``DECIMAL(p,s)``): a string
comparison, where a regular expression cost a match per numeric field of every record."""
_FIELDS_STRUCT = "struct<" + ", ".join(f"`{spec.name}`: variant" for spec in FIELDS) + ">"
"""The document as a struct of each field's sub-variant (absent fields are null)."""
CONTRACT_FIELDS_FUNCTION = "shopstream_contract_fields"
"""The session function that reads a record's contract fields in one pass (the Java class
``pipelines/infra/jvm/ContractFields.java``, registered by :func:`pipelines.spark.spark_session`)."""
VALID_UTF8_FUNCTION = "shopstream_valid_utf8"
"""The session function that says whether a record's bytes are valid UTF-8, as
``is_valid_utf8`` does, eight bytes at a time where those walk them one by one
(``pipelines/infra/jvm/ValidUtf8.java``, registered with :data:`CONTRACT_FIELDS_FUNCTION`)."""
_MAX_FUTURE_MICROS = MAX_FUTURE // timedelta(microseconds=1)
"""How far past its processing time an event's time may be, in microseconds."""
_NUMBER = "NUMBER"
"""The contract-fields function's type of any JSON number (a long, decimal or double)."""
FieldReader = Literal["auto", "jvm", "variant"]
"""How :func:`with_verdict` reads the fields: ``jvm`` with :data:`CONTRACT_FIELDS_FUNCTION`,
``variant`` with Spark's own expressions, ``auto`` the function when the session has it."""
_JSON_WHITESPACE = " \t\n\r"
"""What a JSON parser skips before the top-level value (RFC 8259; Jackson and Python agree)."""


def _is_integral(number: Column) -> Column:
    """True for finite whole numbers; pure double arithmetic (``floor`` overflows under ANSI)."""
    return (number % F.lit(1.0)) == F.lit(0.0)


def _bounded_by(text: Column, char: str, *, first: bool) -> Column:
    """Whether the first (last) character of ``text`` that is not JSON whitespace is
    ``char``. Almost every record starts with ``{`` and ends with ``}``, which one
    byte tells; only the others pay for a trimmed copy of the whole record."""
    if first:
        return text.startswith(char) | (
            F.substring(F.ltrim(text, F.lit(_JSON_WHITESPACE)), 1, 1) == F.lit(char))
    return text.endswith(char) | (
        F.substring(F.rtrim(text, F.lit(_JSON_WHITESPACE)), -1, 1) == F.lit(char))


_BLANK_BOUND = chr(ord(max(WHITESPACE)) + 1)
"""Every text that starts with a :data:`WHITESPACE` character (all of them ASCII) is less
than this one in Spark's binary order, and so is the empty text."""
if not _BLANK_BOUND.isascii():
    raise AssertionError("the blank check's one comparison needs ASCII whitespace")


def _blank(text: Column) -> Column:
    """Empty, or only :data:`WHITESPACE` (as ``btrim`` leaves nothing). A first character
    that is not blank settles it, so a valid field costs no trimmed copy: one per string
    field of every record, and the whole-record trims of :func:`_bounded_by`, were a fifth
    of the validation's CPU. That first character is asked once, by one comparison
    (:data:`_BLANK_BOUND`), before the ``startswith`` of each whitespace character: those
    four calls for every string field were 1.6 % of the executors' samples in a profile
    of the stream's drain."""
    starts_blank = (text < F.lit(_BLANK_BOUND)) & reduce(
        operator.or_, (text.startswith(ch) for ch in WHITESPACE))
    return (F.octet_length(text) == 0) | (
        starts_blank & (F.octet_length(F.btrim(text, F.lit(WHITESPACE))) == 0))


def _col(prefix: str, name: str) -> Column:
    return F.col(f"_{prefix}_{name}")


def _wants_text(spec: FieldSpec) -> bool:
    return spec.kind in ("id", "string", "event_type", "timestamp")


def _wants_number(spec: FieldSpec) -> bool:
    return spec.kind in ("timestamp", "price", "quantity")


def contract_fields_arguments() -> tuple[list[str], list[bool], list[bool], str, StructType]:
    """What :data:`CONTRACT_FIELDS_FUNCTION` is registered with: the contract's field names,
    which of them need their text and which their number, the rules it evaluates (JSON,
    :func:`_java_rules`), and the struct it returns."""
    struct = StructType([StructField("json", BooleanType())])
    for spec in FIELDS:
        struct = (struct.add(f"type_{spec.name}", StringType()).add(f"text_{spec.name}", StringType())
                  .add(f"number_{spec.name}", DoubleType()))
    struct = struct.add("time", TimestampType()).add("rule", IntegerType())
    return ([spec.name for spec in FIELDS], [_wants_text(spec) for spec in FIELDS],
            [_wants_number(spec) for spec in FIELDS], _java_rules(), struct)


Rule = tuple[str, Reason, str | None]
"""One rule of the contract: its check (a name, see :func:`_condition`), the reason it
gives, and the field it concerns (``None`` for the record as a whole)."""

JAVA_CHECKS: frozenset[str] = frozenset({
    "missing", "not_string", "blank", "too_long", "unknown_event_type", "not_string_or_number",
    "not_number", "price_overflow", "negative_price", "quantity_overflow", "invalid_quantity",
    "missing_price",
})
"""The checks :data:`CONTRACT_FIELDS_FUNCTION` evaluates itself, on the values it read; the
others (the record's bytes and text, the event time's two, which read the time the function
gives, and the Kafka key's) stay Spark's."""


_REASONS: dict[str, Reason] = {
    "empty_payload": Reason.EMPTY_PAYLOAD,
    "invalid_encoding": Reason.INVALID_ENCODING,
    "invalid_json": Reason.INVALID_JSON,
    "not_an_object": Reason.NOT_AN_OBJECT,
    "missing": Reason.MISSING_FIELD,
    "not_string": Reason.WRONG_TYPE,
    "not_string_or_number": Reason.WRONG_TYPE,
    "not_number": Reason.WRONG_TYPE,
    "blank": Reason.EMPTY_FIELD,
    "too_long": Reason.FIELD_TOO_LONG,
    "unknown_event_type": Reason.UNKNOWN_EVENT_TYPE,
    "invalid_timestamp": Reason.INVALID_TIMESTAMP,
    "future_timestamp": Reason.FUTURE_TIMESTAMP,
    "price_overflow": Reason.NUMERIC_OVERFLOW,
    "quantity_overflow": Reason.NUMERIC_OVERFLOW,
    "negative_price": Reason.NEGATIVE_PRICE,
    "invalid_quantity": Reason.INVALID_QUANTITY,
    "missing_price": Reason.MISSING_PRICE,
    "missing_key": Reason.MISSING_KEY,
    "key_mismatch": Reason.KEY_MISMATCH,
}
"""The reason each check gives."""


def _field_rules(spec: FieldSpec) -> list[Rule]:
    """One field's rules, in the Python validator's order."""
    checks: list[str] = ["missing"] if spec.required else []
    if spec.kind in ("id", "string", "event_type"):
        checks += ["not_string", "blank"]
        if spec.max_length is not None:
            checks.append("too_long")
        if spec.kind == "event_type":
            checks.append("unknown_event_type")
    elif spec.kind == "timestamp":
        checks += ["not_string_or_number", "invalid_timestamp", "future_timestamp"]
    elif spec.kind == "price":
        checks += ["not_number", "price_overflow", "negative_price"]
    else:  # quantity
        checks += ["not_number", "quantity_overflow", "invalid_quantity"]
    return [(check, _REASONS[check], spec.name) for check in checks]


_RECORD_CHECKS = ("empty_payload", "invalid_encoding", "invalid_json", "not_an_object")
"""The rules of the record as a whole, which come first: its bytes, their text, the JSON."""


def contract_rules(check_key: bool = False) -> list[Rule]:
    """The contract's rules in order: the first that holds is a record's verdict, as in
    :func:`features.events.validate_event`. One table, which both the Spark expressions
    (:func:`_condition`) and the contract-fields function evaluate."""
    rules: list[Rule] = [(check, _REASONS[check], None) for check in _RECORD_CHECKS]
    for spec in FIELDS:
        rules += _field_rules(spec)
    rules.append(("missing_price", Reason.MISSING_PRICE, "price"))
    if check_key:
        rules += [("missing_key", Reason.MISSING_KEY, None), ("key_mismatch", Reason.KEY_MISMATCH, None)]
    return rules


def _java_rules() -> str:
    """The rules as the contract-fields function takes them: each check it evaluates, with
    its field's position (``null`` for a check it leaves to Spark, which keeps the rules'
    numbers), and the contract's constants those checks read."""
    position = {spec.name: i for i, spec in enumerate(FIELDS)}
    specs = {spec.name: spec for spec in FIELDS}
    rules = []
    for check, _reason, name in contract_rules():
        if check not in JAVA_CHECKS:
            rules.append(None)
            continue
        assert name is not None
        limit = specs[name].max_length if check == "too_long" else None
        rules.append({"check": check, "field": position[name], "limit": limit})
    return json.dumps({
        "rules": rules,
        "event_type_field": position["event_type"],
        "event_types": list(EVENT_TYPES),
        "priced_event_types": list(PRICED_EVENT_TYPES),
        "whitespace": WHITESPACE,
        "price_max": PRICE_MAX,
        "quantity_max": QUANTITY_MAX,
        "time_field": next(position[spec.name] for spec in FIELDS if spec.kind == "timestamp"),
        "iso_pattern": ISO_TIMESTAMP_PATTERN,
    })


def _condition(check: str, name: str | None, now: Column, value: Column, key: Column) -> Column:
    """A rule's condition as a Spark expression, on the columns of :func:`with_verdict`
    (``_t_`` type, ``_s_`` text, ``_n_`` double, ``_num_`` numeric flag of each field,
    ``_et`` the event time, ``_utf8``/``_json``/``_obj``/``_closed`` of the record), each
    computed once per record."""
    if name is None:
        record = {
            "empty_payload": lambda: value.isNull() | (F.length(value) == 0),
            "invalid_encoding": lambda: ~F.col("_utf8"),
            # Spark's parser stops after the first complete value ({"a": 1} x parses);
            # Python's rejects what follows, so an object text must end with its brace
            "invalid_json": lambda: ~F.col("_json") | (F.col("_obj") & ~F.col("_closed")),
            "not_an_object": lambda: ~F.col("_obj"),
            "missing_key": lambda: key.isNull() | (F.octet_length(key) == 0),
            "key_mismatch": lambda: key != _col("s", "user_id"),
        }
        return record[check]()
    if check == "missing_price":
        price_type = _col("t", "price")
        return (_col("s", "event_type").isin(*PRICED_EVENT_TYPES)
                & (price_type.isNull() | (price_type == "VOID")))
    spec = next(spec for spec in FIELDS if spec.name == name)
    typ = _col("t", name)
    missing = typ.isNull() | (typ == F.lit("VOID"))
    if check == "missing":
        return missing
    present = ~missing
    text, number, is_number = _col("s", name), _col("n", name), _col("num", name)
    finite = ~(F.isnan(number) | number.isin(float("inf"), float("-inf")))
    if check == "too_long":
        assert spec.max_length is not None
        # a text has no more characters than bytes: only one of more bytes than the
        # limit pays for counting its characters (a scan of the text)
        holds = ((F.octet_length(text) > spec.max_length)
                 & (F.char_length(text) > spec.max_length))
    elif check == "future_timestamp":
        # in microseconds since the epoch: the same comparison, where Spark adds an interval
        # to a timestamp through a ZonedDateTime in the session's zone, for every record
        holds = F.unix_micros(F.col("_et")) > F.unix_micros(now) + F.lit(_MAX_FUTURE_MICROS)
    else:
        holds = {
            "not_string": lambda: typ != F.lit("STRING"),
            "blank": lambda: _blank(text),
            "unknown_event_type": lambda: ~text.isin(*EVENT_TYPES),
            "not_string_or_number": lambda: (typ != F.lit("STRING")) & ~is_number,
            "invalid_timestamp": lambda: F.col("_et").isNull(),
            "not_number": lambda: ~is_number,
            "price_overflow": lambda: ~finite | (number > PRICE_MAX),
            "negative_price": lambda: number < 0,
            "quantity_overflow": lambda: ~finite | (F.abs(number) > QUANTITY_MAX),
            "invalid_quantity": lambda: ~_is_integral(number) | (number < 1),
        }[check]()
    return present & holds


def _parse_event_time(iso: Column | None = None) -> Column:
    """The event time from the ``event_time`` columns: ISO-8601 text or whole epoch millis.

    ``iso``: the text's time when the contract-fields function read it (its ``time``, the
    same value as the expression here, without Spark's regular expression and its cast's
    look-up of the offset's zone for every record)."""
    typ, text, millis = _col("t", "event_time"), _col("s", "event_time"), _col("n", "event_time")
    if iso is None:
        iso = F.when(text.rlike(ISO_TIMESTAMP_PATTERN), F.try_to_timestamp(text))
    in_range = _is_integral(millis) & (millis >= 0) & (millis <= EPOCH_MILLIS_MAX)
    epoch = F.when(in_range, F.timestamp_millis(millis.cast("bigint")))
    return F.when(typ == F.lit("STRING"), iso).when(_col("num", "event_time"), epoch)


def with_verdict(raw: DataFrame, now: Column | datetime | None = None, check_key: bool = False,
                 reader: FieldReader = "auto") -> DataFrame:
    """Add ``reason`` / ``field`` (null when valid) and the typed event columns.

    A few projections, so that every costly expression runs once per record
    (a single projection with the checks inline evaluated each field's
    ``schema_of_variant`` anew in every rule of both ``CASE`` chains, ~150 times
    per valid record): parse the JSON once; read each field (type, text, number)
    in one projection, where Spark evaluates the field's sub-variant once for all
    of them; then the ordered rules pick the first failure, once, as a rule number
    that gives both ``reason`` and ``field``. Spark keeps the projections apart
    because their costly columns are read more than once.

    The sub-variants come from one cast of the document to a struct of
    ``VARIANT`` fields, which walks the object once; a ``$.field`` path per field
    searched the object's keys again for each (decoding them as it went), and
    that search was a sixth of the stage's samples. And almost every record breaks
    no rule, so it is checked against all ~50: with the conditions inside one
    ordered ``CASE`` each rule read its field's columns anew (Spark shares no work
    between a ``CASE``'s later branches). Each condition is now a flag in one
    projection, where Spark evaluates the parts they share once, and the ``CASE``
    reads the flags. The stage (Kafka read, validation, shuffle write) takes about a
    sixth less CPU. An ``OR`` of the conditions before the ``CASE`` did as well, but
    its tree, twice the size, took longer to plan, which a micro-batch does every
    time: 64 ms against 40 before, where the flags take 47.

    The rows between them carry no sub-variant and, after the fields are read, no
    document: when the stage runs operator by operator (it does with
    ``spark.sql.codegen.hugeMethodLimit`` at 8,000, :mod:`pipelines.spark`), each
    projection copies every column it passes on. Nine projections carrying eleven
    sub-variants cost about a fifth more CPU than these five. By default the stage runs
    as one whole-stage method, with no copies between the projections.

    The rules are one table (:func:`contract_rules`). When the contract-fields function
    reads the fields, it also evaluates the rules it can on what it read (:data:`JAVA_CHECKS`)
    and gives the first that holds; Spark keeps the record's own rules (a ``CASE`` before
    it) and the event time's and the key's (the least number that holds, after it). As
    Spark expressions, those flags were 11,800 of the stage method's 13,500 bytes of
    bytecode, and the rule number they share became a generated function of 98 arguments:
    HotSpot's C2 refused the method ("unsupported calling sequence"), C1's profiling tier
    too ("out of virtual registers"), and where both had tried it stayed in the
    interpreter, at about three times the CPU. The method is now about 3,300 bytes and
    every tier compiles it.

    Spark's own way to a field's text or number, ``try_variant_get`` of its sub-variant,
    builds a ``Literal`` and a ``Cast`` expression for that one value and reads a fresh
    ``SQLConf`` on the executor to do it: 37 % of the samples in a JFR profile of the
    validation alone (a field's text from ``to_json``, or a second parse with
    ``from_json``, cost as much). So when the session has :data:`CONTRACT_FIELDS_FUNCTION`
    (a small Java class the project compiles, :mod:`pipelines.infra.jvm_jar`), every
    field is read inside it in one pass: the same types and values, and a third less of
    the validation's CPU (400k records from memory to a ``noop`` sink, alternating:
    2.9-3.3 s of the JVM's CPU against 4.6-6.1 s). A flat object of strings, numbers and
    nulls (nearly every record) is read by one pass of Spark's JSON parser (Jackson) with
    the rules Spark's variant builder applies, without building the variant; any other
    record is parsed by Spark's ``parseJson``, as ``try_parse_json`` does, and read
    through the variant's Java API. Skipping the variant took another seventh off
    (2.4-2.8 s against 2.7-3.4 s on 400k generated records). Without it
    (``reader="variant"``, or a session without the function) the fields are read with
    Spark's expressions as described above; both give every record the same verdict
    (``tests/integration/test_stream_validation.py``).

    Parameters
    ----------
    raw
        Rows with a binary or string ``value`` (and ``key`` when ``check_key``).
    now
        Processing time for the future-timestamp rule; default ``current_timestamp()``.
    reader
        How the fields are read (:data:`FieldReader`); the verdicts are the same.
    """
    now_col = F.current_timestamp() if now is None else (now if isinstance(now, Column) else F.lit(now))
    value = F.col("value").cast("binary")
    text = value.cast("string")
    columns = list(raw.columns)

    read = _jvm_fields if _use_jvm(raw, reader) else _variant_fields
    parsed, per_field = read(raw, value, text)
    iso = F.col("_iso") if read is _jvm_fields else None
    fields = parsed.select("*", *per_field).select("*", _parse_event_time(iso).alias("_et"))

    key = F.col("key").cast("string") if check_key else F.lit(None).cast("string")
    # the function was given contract_rules() without the key's two, which come last: the
    # numbers it gives are these
    rules = contract_rules(check_key)
    # Spark's share of the rules: all of them, or, when the contract-fields function read
    # the fields, those it leaves to Spark (it gives the first of its own that holds)
    in_java = read is _jvm_fields
    spark_rules = [(number, check, name) for number, (check, _code, name) in enumerate(rules, start=1)
                   if not (in_java and check in JAVA_CHECKS)]
    # every such rule's condition once, in one projection (Spark evaluates the parts the
    # rules share, such as a field's type test, once for all of them); then one CASE over
    # those flags picks the first that holds (in order; null counts as false)
    flagged = fields.select("*", *[_condition(check, name, now_col, value, key).alias(f"_r{number}")
                                   for number, check, name in spark_rules])
    record_level = [number for number, check, _name in spark_rules if check in _RECORD_CHECKS]
    rule: Column | None = None
    for number, _check, _name in spark_rules:
        if in_java and number not in record_level:
            continue
        flag = F.col(f"_r{number}")
        rule = F.when(flag, F.lit(number)) if rule is None else rule.when(flag, F.lit(number))
    assert rule is not None
    if in_java:
        # past the record's own rules, the first that holds is the least number that does
        # (``least`` skips nulls): the function's, or one of Spark's after it
        later = [F.when(F.col(f"_r{number}"), F.lit(number))
                 for number, _check, _name in spark_rules if number not in record_level]
        rule = rule.otherwise(F.least(F.col("_rule"), *later))

    def pick(values: list[str | None]) -> Column:
        """The value of the rule that failed (``NULL`` when none did)."""
        return F.get(F.array(*[F.lit(v).cast("string") for v in values]), rule - 1)

    typed = {
        "event_id": _col("s", "event_id"),
        "event_type": _col("s", "event_type"),
        "event_time": F.col("_et"),
        "user_id": _col("s", "user_id"),
        "session_id": _col("s", "session_id"),
        "item_id": _col("s", "item_id"),
        "category_id": _col("s", "category_id"),
        "region": _col("s", "region"),
        "price": _col("n", "price"),
        "quantity": F.col("_q"),
        "device": _col("s", "device"),
    }
    assert tuple(typed) == VALID_COLUMNS
    return flagged.select(
        *columns,
        pick([code.value for _, code, _ in rules]).alias("reason"),
        pick([name for _, _, name in rules]).alias("field"),
        *[c.alias(n) for n, c in typed.items()],
    )


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


def _parsed(raw: DataFrame, text: Column, doc: Column, utf8: Column) -> DataFrame:
    """``raw`` with the document ``doc`` of each valid UTF-8 record (``utf8``: whether the
    bytes are), parsed once, and whether its text is an object's (a valid JSON text whose
    first non-blank byte is "{" and whose last is "}")."""
    return raw.select(
        "*",
        utf8.alias("_utf8"),
        F.when(utf8, doc).alias("_doc"),
        _bounded_by(text, "{", first=True).alias("_obj"),
        _bounded_by(text, "}", first=False).alias("_closed"),
    )


def _variant_fields(raw: DataFrame, value: Column, text: Column) -> tuple[DataFrame, list[Column]]:
    """The document and each field's columns, read with Spark's own expressions."""
    parsed = _parsed(raw, text, F.try_parse_json(text), F.is_valid_utf8(value))

    # each field in one projection: its type, text, number (Spark evaluates the
    # document's struct, and each field's sub-variant, once for all of them)
    doc = F.col("_doc")
    subs = F.try_variant_get(doc, "$", _FIELDS_STRUCT)
    per_field: list[Column] = [doc.isNotNull().alias("_json")]
    for spec in FIELDS:
        sub = subs.getField(spec.name)
        typ = F.schema_of_variant(sub)
        per_field.append(typ.alias(f"_t_{spec.name}"))
        if _wants_text(spec):
            per_field.append(F.try_variant_get(sub, "$", "string").alias(f"_s_{spec.name}"))
        if _wants_number(spec):
            is_number = typ.isin(*_NUMERIC_TYPES) | typ.startswith("DECIMAL(")
            # the number only of a numeric value: a cast of text to double that fails
            # costs an exception inside Spark, and ``event_time`` is text in almost
            # every record
            per_field.append(is_number.alias(f"_num_{spec.name}"))
            per_field.append(F.when(is_number, F.try_variant_get(sub, "$", "double"))
                             .alias(f"_n_{spec.name}"))
        if spec.kind == "quantity":  # the typed column: absent means 1
            per_field.append(F.coalesce(F.try_variant_get(sub, "$", "int"), F.lit(1)).alias("_q"))
    return parsed, per_field


def _jvm_fields(raw: DataFrame, value: Column, text: Column) -> tuple[DataFrame, list[Column]]:
    """The same columns, read by the contract-fields function in one pass per record."""
    utf8 = (F.call_function(VALID_UTF8_FUNCTION, value)
            if raw.sparkSession.catalog.functionExists(VALID_UTF8_FUNCTION)
            else F.is_valid_utf8(value))
    # the bytes, not their text: the function reads them with Jackson's UTF-8 parser (a
    # String decoded for every record, then read char by char, cost about 4 % of a drain);
    # ``_parsed`` asks it only of the records that are valid UTF-8, as it requires
    parsed = _parsed(raw, text, F.call_function(CONTRACT_FIELDS_FUNCTION, value), utf8)
    doc = F.col("_doc")
    per_field: list[Column] = [F.coalesce(doc.getField("json"), F.lit(False)).alias("_json")]
    for spec in FIELDS:
        typ = doc.getField(f"type_{spec.name}")
        number = doc.getField(f"number_{spec.name}")
        per_field.append(typ.alias(f"_t_{spec.name}"))
        if _wants_text(spec):
            per_field.append(doc.getField(f"text_{spec.name}").alias(f"_s_{spec.name}"))
        if _wants_number(spec):
            per_field.append((typ == F.lit(_NUMBER)).alias(f"_num_{spec.name}"))
            per_field.append(number.alias(f"_n_{spec.name}"))
        if spec.kind == "quantity":  # the typed column: absent means 1
            per_field.append(F.coalesce(number.try_cast("int"), F.lit(1)).alias("_q"))
    # the event time's text as a time (_parse_event_time)
    per_field.append(doc.getField("time").alias("_iso"))
    # the first of the function's own rules that holds (null: none, or not an object)
    per_field.append(doc.getField("rule").alias("_rule"))
    return parsed, per_field


def _use_jvm(raw: DataFrame, reader: FieldReader) -> bool:
    if reader == "auto":
        return raw.sparkSession.catalog.functionExists(CONTRACT_FIELDS_FUNCTION)
    return reader == "jvm"
