"""The stream's Spark validator gives the Python validator's verdict, record for record.

The same rules exist twice (:func:`features.events.validate_event` and
:func:`features.validation.with_verdict`); a user relies on a record being
quarantined with the same reason whichever path saw it. Checked on the contract's
corpus and on a few thousand seeded mutations of a good event (each field swapped
for values of every JSON type, edge lengths, blanks, huge and non-finite numbers,
payloads wrapped in whitespace, a BOM or an array).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from features.events import Event, validate_event
from tests.corpus import CASES, GOOD, NOW

pytestmark = pytest.mark.integration

_POOL: list[Any] = [
    None, "", "  ", " \t", "\n", " x", "\tview", "UK\r", "x" * 64, "x" * 65, "é" * 64, "é" * 65,
    123, 0, -1, 1.5, 3.0,
    2**40, 2**31, 2**31 - 1, True, False, [1], {"a": 1}, "7", "9.5", "view", "purchase",
    "add_to_cart", "click", "2024-06-01T11:00:00Z", "2024-06-01T12:04:59Z", "2024-06-01T12:05:01Z",
    "2024-06-01 11:00", "2024-02-30T00:00:00Z", "2024-06-01T11:00:00.1234567Z", 1717243140000,
    1717243140000.5, -5, 10**20, 253_402_300_799_999, 253_402_300_800_000, 1e12, 1e9, 1e9 + 1,
    "Infinity", "NaN", "UK", "Côte d’Ivoire",
]
_RAW_NUMBERS = ["1e400", "-1e400", "1E2", "-0", "0.1e-400", "1.0e0", "123456789012345678901234567890"]


def mutated_records(n: int, seed: int = 1) -> list[bytes]:
    """``n`` variations of the corpus' good event (deterministic)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        doc: dict[str, Any] = {**GOOD, "event_id": f"m{i}"}
        raw_numbers = {}
        for _ in range(rnd.choice((1, 1, 1, 2, 3))):
            name = rnd.choice([*GOOD, "extra"])
            r = rnd.random()
            if r < 0.1:
                doc.pop(name, None)
            elif r < 0.2:
                doc.pop(name, None)
                raw_numbers[name] = rnd.choice(_RAW_NUMBERS)
            else:
                doc[name] = rnd.choice(_POOL)
        text = json.dumps(doc, ensure_ascii=rnd.random() < 0.5)
        if raw_numbers:
            text = text[:-1] + "".join(f', "{k}": {v}' for k, v in raw_numbers.items()) + "}"
        wrap = rnd.random()
        if wrap < 0.03:
            text = " \n\t" + text
        elif wrap < 0.05:
            text += " \r\n"
        elif wrap < 0.06:
            text = "\ufeff" + text
        elif wrap < 0.07:
            text = f"[{text}]"
        out.append(text.encode())
    return out


def _python(value: bytes | None) -> tuple[str | None, dict[str, Any] | None]:
    verdict = validate_event(value, now=NOW)
    if isinstance(verdict, Event):
        return None, verdict.as_dict()
    return str(verdict), None


def _spark(spark: Any, values: list[bytes | None],
           reader: str = "auto") -> list[tuple[str | None, dict[str, Any]]]:
    from pyspark.sql import functions as F

    from features.events import VALID_COLUMNS
    from features.validation import with_verdict

    frame = spark.createDataFrame(list(enumerate(values)), "i long, value binary")
    rows = (with_verdict(frame, now=F.lit(NOW), reader=reader)  # type: ignore[arg-type]
            .select("i", "reason", "field", *VALID_COLUMNS).orderBy("i").collect())
    out = []
    for row in rows:
        verdict = None if row["reason"] is None else (
            f"{row['reason']}:{row['field']}" if row["field"] else row["reason"])
        out.append((verdict, {c: row[c] for c in VALID_COLUMNS}))
    return out


@pytest.mark.parametrize("reader", ["jvm", "variant"])
def test_spark_verdicts_equal_python_on_corpus_and_mutations(spark: Any, reader: str) -> None:
    """Both ways of reading the fields: the project's Java function, which the stream
    uses, and Spark's own expressions, used where the session has no such function."""
    values = [value for _, value, _ in CASES] + mutated_records(3000)
    got = _spark(spark, values, reader)
    mismatches = []
    valid = 0
    for value, (verdict, typed) in zip(values, got, strict=True):
        expected, event = _python(value)
        if verdict != expected:
            mismatches.append((value, verdict, expected))
        elif event is not None:
            valid += 1
            typed = {**typed, "event_time": typed["event_time"].replace(tzinfo=NOW.tzinfo)}
            if typed != event:
                mismatches.append((value, typed, event))
    assert not mismatches, f"{len(mismatches)} records differ, e.g. {mismatches[:3]}"
    # the corpus' expected verdicts hold in Spark too, and the mutations cover both outcomes
    for (name, _, expected), (verdict, _) in zip(CASES, got, strict=False):
        assert verdict == expected, name
    assert 300 < valid < len(values) - 300


def test_the_session_reads_the_fields_with_the_java_function(spark: Any) -> None:
    """The project's sessions have the function, so the stream and the backfill use it; a
    session without it (a user's own, or one started before the jar) reads the fields
    with Spark's expressions and gives the same verdicts."""
    from pyspark.sql import functions as F

    from features.validation import CONTRACT_FIELDS_FUNCTION, with_verdict

    def plan(session: Any) -> str:
        frame = session.createDataFrame([(b'{"event_id": "a"}',)], "value binary")
        checked = with_verdict(frame)
        assert checked.select("reason", "field").first() == ("missing_field", "event_type")
        return checked._jdf.queryExecution().analyzed().toString()

    assert spark.catalog.functionExists(CONTRACT_FIELDS_FUNCTION)
    assert CONTRACT_FIELDS_FUNCTION in plan(spark) and "try_parse_json" not in plan(spark)
    # a call with other arguments than one record is told so, by the function's name
    with pytest.raises(Exception, match=f"{CONTRACT_FIELDS_FUNCTION} takes one argument"):
        spark.range(1).select(F.call_function(CONTRACT_FIELDS_FUNCTION, F.lit(b"{}"), F.lit(1)))
    # a text is read as its UTF-8 bytes, as the binary it casts to
    text = spark.range(1).select(F.call_function(CONTRACT_FIELDS_FUNCTION, F.lit('{"region": "UK"}'))
                                 .alias("f")).first()["f"]
    assert (text["json"], text["type_region"], text["text_region"]) == (True, "STRING", "UK")
    other = spark.newSession()
    assert not other.catalog.functionExists(CONTRACT_FIELDS_FUNCTION)
    assert "try_parse_json" in plan(other) and CONTRACT_FIELDS_FUNCTION not in plan(other)


def test_a_session_without_the_class_falls_back_with_a_warning(
        spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from features.validation import CONTRACT_FIELDS_FUNCTION
    from pipelines.spark import register_contract_fields

    other = spark.newSession()
    with caplog.at_level(logging.WARNING, logger="pipelines.spark"):
        assert register_contract_fields(other, class_name="shopstream.NotThere") is False
    assert "shopstream.NotThere" in caplog.text and "Spark's own expressions" in caplog.text
    assert not other.catalog.functionExists(CONTRACT_FIELDS_FUNCTION)
    assert register_contract_fields(other) is True
    assert other.catalog.functionExists(CONTRACT_FIELDS_FUNCTION)


def test_a_rule_the_class_does_not_know_is_an_error_naming_it(
        spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule table the Java class cannot read is a defect of the build, not a session
    without the jar: it is an error that names the check, not a silent, slower fallback."""
    import json

    import features.validation as validation
    from features.validation import CONTRACT_FIELDS_FUNCTION
    from pipelines.spark import register_contract_fields

    names, wants_text, wants_number, rules, struct = validation.contract_fields_arguments()
    table = json.loads(rules)
    first = next(i for i, rule in enumerate(table["rules"]) if rule is not None)
    table["rules"][first] = {**table["rules"][first], "check": "not_a_check"}
    monkeypatch.setattr(validation, "contract_fields_arguments",
                        lambda: (names, wants_text, wants_number, json.dumps(table), struct))
    other = spark.newSession()
    with pytest.raises(ValueError, match=r'refused the contract.s rules: unknown check '
                                         rf'"not_a_check" in rule {first + 1}'):
        register_contract_fields(other)
    assert not other.catalog.functionExists(CONTRACT_FIELDS_FUNCTION)


def _blank_edges() -> list[str]:
    """Texts at the edges of the blank rule's first look: each whitespace character alone,
    doubled and before others, the characters just above and below each, non-ASCII ones and
    Unicode spaces (not blank to Spark's ``btrim``)."""
    from features.events import WHITESPACE

    return ["", "x", "!", " ", "  ", "\t\n", " x", "x ", "\u00a0", "\u3000", "é", "\x1f", "\x00",
            *[ch + tail for ch in WHITESPACE for tail in ("", "a", ch, "\u00a0")],
            *[chr(ord(ch) + step) for ch in WHITESPACE for step in (-1, 1)]]


def _time_edges() -> list[str]:
    """Event-time texts at the edges of the contract-fields function's own parse of the
    common shape (``yyyy-MM-ddTHH:mm:ss``, a fraction of up to six digits, ``Z`` or an
    offset) and of what it leaves to Spark: every fraction length, both separators, offsets
    at and past their limits, dates and times that do not exist, the ends of the four-digit
    years; and texts just off the shape (no seconds, lower-case letters, blanks and line
    ends around it, signs, other digits), and seeded mutations of them all."""
    texts = []
    for separator in ("T", " "):
        for fraction in ("", ".", *(".123456789"[:n] for n in range(2, 10))):
            for zone in ("", "Z", "+00:00", "-00:00", "+18:00", "-18:00", "+18:01", "-18:01",
                         "+14:30", "-12:45", "+05:60", "+23:59", "+0100", "+01", "+1:00",
                         "z", " Z", "UTC", " UTC", "GMT+01:00", "Europe/Paris"):
                texts.append(f"2024-05-31{separator}10:11:12{fraction}{zone}")
    for day in ("2023-02-29", "2024-02-29", "2024-02-30", "2024-00-10", "2024-13-01",
                "2024-04-31", "2024-01-00", "2024-01-32", "0000-01-01", "9999-12-31",
                "1969-12-31", "1582-10-10", "1900-02-29", "2000-02-29"):
        for time in ("00:00:00", "23:59:59.999999", "24:00:00", "23:60:00", "23:59:60"):
            texts += [f"{day}T{time}Z", f"{day}T{time}", f"{day}T{time}-18:00"]
    base = "2024-05-31T10:11:12"
    texts += [base[:16], base[:16] + "Z", base[:16] + "+01:00", base.replace("T", "t"),
              base + "Z\n", base + "Z\r\n", base + "\n", base + " ", " " + base, base + "\u2028",
              base + "Z\u0085", "+" + base, "-" + base, "1" + base, base[:5] + "5" + base[7:],
              base.replace("2024", "\u0662\u0660\u0662\u0664"), base.replace("10", "\uff11\uff10"),
              "2024-05-31", "10:11:12", "T10:11:12", "Z", "", base + ".Z", base + "Z" * 2]
    rng = random.Random(13)
    alphabet = "0123456789-:T .Z+zt\n"
    mutated = []
    for _ in range(1500):
        text = list(rng.choice(texts))
        for _ in range(rng.choice((1, 1, 2))):
            at = rng.randrange(len(text) + 1)
            edit = rng.random()
            if edit < 0.4 and at < len(text):
                text[at] = rng.choice(alphabet)
            elif edit < 0.7 and at < len(text):
                del text[at]
            else:
                text.insert(at, rng.choice(alphabet))
        mutated.append("".join(text))
    return texts + mutated


def _edge_records() -> list[bytes]:
    """Records at the edges of what the Java function reads in one pass without building
    Spark's variant (a flat object of strings, numbers and nulls) and what it hands to
    Spark's parser: escaped surrogates, duplicate and nested keys, numbers past a long
    or a decimal, plain decimals of up to 15 digits and more (negative zeros among
    them), values of every JSON type where a text or a number is wanted; and
    the starts of a record on which Jackson's byte parser guesses an encoding or skips a
    byte-order mark where Spark's parser of the text does not (a mark, blanks, zero
    bytes that read as UTF-16 or UTF-32), and non-ASCII keys and texts."""
    good = json.dumps(GOOD)[:-1]
    extras = [
        r'"region": "\ud800"', r'"extra": "\udc00x"', r'"\ud800": 1', r'"extra": "\ud83d\ude00"',
        r'"region": "\ud83d\ude00"', '"extra": 1, "extra": 2', '"extra": {"a": 1, "a": 2}',
        '"extra": {"a": [1, {"b": true}]}', '"extra": [1, [2, "x"]]', '"extra": true',
        '"extra": null', '"extra": 1e400', '"extra": -0', '"extra": "x", "more": 9.5',
    ]
    records = [(good + ", " + extra + "}").encode() for extra in extras]
    numbers = ["9223372036854775807", "9223372036854775808", "-9223372036854775809",
               "1" * 38, "1" * 39, "0." + "0" * 37 + "1", "0." + "0" * 38 + "1",
               "123456789012345678901234567890.5", "1E2", "1.5e-3", "-0", "-0.0", "7.000",
               "true", "false", "null", '"7"', "[7]", '{"v": 7}']
    for name in ("price", "quantity", "event_time", "event_id", "user_id", "event_type"):
        for number in numbers:
            doc = {k: v for k, v in GOOD.items() if k != name}
            records.append((json.dumps(doc)[:-1] + f', "{name}": {number}}}').encode())
    # plain decimals on both sides of 15 digits (past it a double's 53 bits no longer
    # hold every unscaled value), negative zeros, and decimals no double holds (0.3, 1.1)
    rng = random.Random(11)
    decimals = ["0.3", "1.1", "-0.000", "0.00000000000001", "99999999999999.9",
                "999999999999999.9", "-999999999999999", "123456789012345.6"]
    for _ in range(300):
        places = rng.randrange(1, 12)
        whole = rng.randrange(10 ** rng.randrange(0, 12))
        sign = "-" if rng.random() < 0.3 else ""
        decimals.append(f"{sign}{whole}.{rng.randrange(10 ** places):0{places}d}")
    for number in decimals:
        doc = {k: v for k, v in GOOD.items() if k != "price"}
        records.append((json.dumps(doc)[:-1] + f', "price": {number}}}').encode())
    records.append(json.dumps({**GOOD, "event_id": "x" * 5000}).encode())
    # the contract's keys in other orders, a key of it again after others (first, last, the
    # one after the first: the key the reader looks for next), and many other keys
    keys = list(GOOD)
    records += [json.dumps({k: GOOD[k] for k in order}).encode()
                for order in (keys[::-1], keys[1:] + keys[:1], keys[::2] + keys[1::2])]
    for again in (keys[0], keys[1], keys[-1]):
        records.append((good + f', "extra": 1, {json.dumps(again)}: {json.dumps(GOOD[again])}}}'
                        ).encode())
    records.append((good + ", " + ", ".join(f'"x{i}": {i}' for i in range(9)) + "}").encode())
    records.append((good + ", " + ", ".join(f'"x{i % 6}": {i}' for i in range(9)) + "}").encode())
    records.append(b'{"event_id": "a"} {"event_id": "b"}')
    records.append(b'{"event_id": "a", }')
    whole = json.dumps(GOOD).encode()
    records += [b"\xef\xbb\xbf" + whole, b" " + whole, b"\n\t" + whole, whole + b"\n ",
                b"{\x00\x00\x00", b"{\x00\"\x00a\x00\"\x00:\x001\x00}\x00", b"{\x00}", b"{}", b"{",
                b"{ }", json.dumps({**GOOD, "region": "Zürich ☕ 😀"}, ensure_ascii=False).encode(),
                json.dumps({**GOOD, "ünï": "ç", "event_type": "vïew"}, ensure_ascii=False).encode()]
    records += [json.dumps({**GOOD, "user_id": text}, ensure_ascii=ascii).encode()
                for text in _blank_edges() for ascii in (True, False)]
    # not the first and last years (0000, 0001, 9999 and their mutations), whose times
    # Python's datetime cannot hold when collected; the direct test of the parse reads them
    records += [json.dumps({**GOOD, "event_time": text}).encode() for text in _time_edges()
                if not text[:4].isdigit() or 1000 <= int(text[:4]) < 9999]
    return records


def test_the_java_functions_one_pass_reads_what_sparks_parser_reads(spark: Any) -> None:
    """The function's one-pass reader returns, field by field, what it returns from Spark's
    parser (its other way, which every record took before): on records chosen to take
    each way, and on mutations."""
    from pyspark.sql import functions as F

    from pipelines.spark import register_contract_fields

    def register(name: str, one_pass: bool) -> None:
        assert register_contract_fields(spark, name=name, one_pass=one_pass)

    register("_fields_one_pass", True)
    register("_fields_parser", False)
    # the function takes valid UTF-8 bytes (the validation calls it on no others)
    values = [v.decode("utf-8", "replace").encode() for v in (
        *_edge_records(), *mutated_records(1000, seed=7),
        *[value for _, value, _ in CASES if value is not None])]
    # repartitioned, so the functions run in Spark's generated code as in the stream (on a
    # local relation the optimizer evaluates them one by one, through reflection)
    frame = spark.createDataFrame(list(enumerate(values)), "i long, value binary").repartition(2)
    rows = frame.select("i", F.call_function("_fields_one_pass", "value").alias("a"),
                        F.call_function("_fields_parser", "value").alias("b")).orderBy("i").collect()
    # by their repr, which tells -0.0 from 0.0 where == does not
    differ = [(values[row["i"]], row["a"], row["b"]) for row in rows
              if repr(row["a"]) != repr(row["b"])]
    assert not differ, f"{len(differ)} records differ, e.g. {differ[:2]}"
    assert len(rows) == len(values)
    # the records reach the parser's failures, wrong types and valid numbers alike
    assert any(row["b"]["json"] is False for row in rows)
    assert any(row["b"]["type_price"] == "OTHER" for row in rows)
    assert any(row["b"]["number_price"] == 9.5 for row in rows)


def test_the_java_function_reads_what_sparks_parser_reads(spark: Any) -> None:
    """The verdicts, and the typed columns of valid records, are the same whichever way
    the fields are read, on the edge records above."""
    values: list[bytes | None] = [*_edge_records(), *mutated_records(500, seed=7)]
    java = _spark(spark, values, "jvm")
    variant = _spark(spark, values, "variant")
    differ = [(value, a, b) for value, a, b in zip(values, java, variant, strict=True)
              if a[0] != b[0] or (a[0] is None and a != b)]
    assert not differ, f"{len(differ)} records differ, e.g. {differ[:3]}"
    verdicts = {verdict for verdict, _ in java}
    # the edges reach both outcomes and the parser's own failures
    assert None in verdicts and "invalid_json" in verdicts and "wrong_type:price" in verdicts
    assert "empty_field:user_id" in verdicts
    assert "invalid_timestamp:event_time" in verdicts


def test_the_java_event_time_is_sparks_parse_of_the_text(spark: Any) -> None:
    """The function's ``time`` of an event-time text is what Spark's expression gives
    (``when(text rlike ISO, try_to_timestamp(text))``), to the microsecond and null alike,
    on the texts at the edges of its own parse and on seeded mutations of them."""
    from pyspark.sql import functions as F

    from features.events import ISO_TIMESTAMP_PATTERN
    from features.validation import CONTRACT_FIELDS_FUNCTION

    texts = _time_edges()
    values = [json.dumps({**GOOD, "event_time": text}).encode() for text in texts]
    # repartitioned, so the function runs in Spark's generated code, as in the stream
    frame = spark.createDataFrame(list(enumerate(values)), "i long, value binary").repartition(2)
    doc = F.call_function(CONTRACT_FIELDS_FUNCTION, "value")
    text = doc.getField("text_event_time")
    sparks = F.when(text.rlike(ISO_TIMESTAMP_PATTERN), F.try_to_timestamp(text))
    rows = frame.select("i", F.unix_micros(doc.getField("time")).alias("java"),
                        F.unix_micros(sparks).alias("spark")).orderBy("i").collect()
    assert len(rows) == len(texts)
    differ = [(texts[row["i"]], row["java"], row["spark"]) for row in rows
              if row["java"] != row["spark"]]
    assert not differ, f"{len(differ)} texts differ, e.g. {differ[:3]}"
    by_text = {texts[row["i"]]: row["java"] for row in rows}
    # the common shape's values, and the null of a date, a time or an offset that is not
    assert by_text["2024-05-31T10:11:12.123456Z"] == 1_717_150_272_123_456
    assert by_text["2024-05-31T10:11:12.1-18:00"] == 1_717_150_272_100_000 + 18 * 3_600_000_000
    assert by_text["2024-05-31T10:11:12+05:60"] is None
    assert by_text["2023-02-29T00:00:00Z"] is None and by_text["2024-02-29T00:00:00Z"] is not None
    # the texts off the shape reach Spark's own parse: a line end after the zone is read there
    assert by_text["2024-05-31T10:11:12Z\n"] == 1_717_150_272_000_000
    assert by_text["2024-05-31T10:11Z"] is None and by_text["2024-05-31T10:11"] is not None


def _utf8_edge_bytes() -> list[bytes | None]:
    """Byte strings at the edges of the UTF-8 function's eight-byte reads: every length up
    to two words and a tail, one non-ASCII sequence (valid or not) at every position of
    them, and seeded random bytes."""
    ascii_text = b'{"event_id": "e-1", "region": "UK"}'
    sequences = [b"\xc3\xa9", b"\xe2\x80\x99", b"\xf0\x9f\x98\x80",  # valid: 2, 3 and 4 bytes
                 b"\x80", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                 b"\xe2\x82", b"\xc3"]  # a continuation byte alone, 0xFF, an overlong form,
    # a surrogate, past U+10FFFF, and sequences cut short
    values: list[bytes | None] = [None, b""]
    values += [ascii_text[:n] for n in range(1, 20)]
    for sequence in sequences:
        values += [ascii_text[:at] + sequence + ascii_text[at:] for at in range(0, 20)]
    rng = random.Random(5)
    values += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(300)]
    values += [bytes(rng.randrange(128) for _ in range(rng.randrange(1, 40))) for _ in range(100)]
    return values


def test_the_java_utf8_check_says_what_is_valid_utf8_says(spark: Any) -> None:
    """The session's UTF-8 check (eight bytes at a time, Spark's own check past ASCII)
    gives ``is_valid_utf8``'s answer for every byte string, and the validation uses it."""
    from pyspark.sql import functions as F

    from features.validation import VALID_UTF8_FUNCTION, with_verdict

    values = _utf8_edge_bytes()
    frame = spark.createDataFrame(list(enumerate(values)), "i long, value binary")
    rows = frame.select("i", F.call_function(VALID_UTF8_FUNCTION, "value").alias("java"),
                        F.is_valid_utf8("value").alias("spark")).orderBy("i").collect()
    assert len(rows) == len(values)
    differ = [(values[row["i"]], row["java"], row["spark"]) for row in rows
              if row["java"] != row["spark"]]
    assert not differ, f"{len(differ)} byte strings differ, e.g. {differ[:3]}"
    answers = [row["java"] for row in rows]
    assert answers.count(True) > 100 and answers.count(False) > 100 and answers[0] is None

    checked = with_verdict(spark.createDataFrame([(b'{"event_id": "\xc3"}',)], "value binary"))
    assert checked.select("reason").first() == ("invalid_encoding",)
    assert VALID_UTF8_FUNCTION in checked._jdf.queryExecution().analyzed().toString()


def test_the_blank_check_compares_once_before_its_startswith_calls(spark: Any) -> None:
    """``_blank``'s one comparison before its ``startswith`` calls changes no answer: the
    texts that start with each whitespace character, the characters just above and below
    it, non-ASCII ones and Unicode spaces (not blank to Spark's ``btrim``) are blank
    exactly when ``btrim`` leaves nothing."""
    from pyspark.sql import functions as F

    from features.events import WHITESPACE
    from features.validation import _blank

    texts = _blank_edges()
    frame = spark.createDataFrame([(t,) for t in texts], "text string")
    rows = frame.select("text", _blank(F.col("text")).alias("blank"),
                        (F.length(F.btrim("text", F.lit(WHITESPACE))) == 0).alias("trimmed")).collect()
    assert [row["text"] for row in rows] == texts
    assert [(row["text"], row["blank"]) for row in rows] == [
        (row["text"], row["trimmed"]) for row in rows]
    assert any(row["blank"] for row in rows) and not all(row["blank"] for row in rows)


def test_the_future_check_holds_its_bound_to_the_microsecond(spark: Any) -> None:
    """The future-timestamp rule, now a comparison of microseconds, draws the line where
    the Python validator does: at exactly the processing time plus ``MAX_FUTURE`` an event
    is valid, one microsecond later it is not; epoch millis likewise. Rows carry their own
    processing time, as the stream's Kafka timestamps do."""
    from datetime import timedelta

    from pyspark.sql import functions as F

    from features.events import MAX_FUTURE
    from features.validation import with_verdict

    edge = NOW + MAX_FUTURE
    times: list[Any] = [
        *(t.isoformat(timespec="microseconds").replace("+00:00", "Z")
          for t in (edge - timedelta(microseconds=1), edge, edge + timedelta(microseconds=1),
                    edge + timedelta(days=1), NOW - timedelta(days=400))),
        int(edge.timestamp() * 1000), int(edge.timestamp() * 1000) + 1,
    ]
    values = [json.dumps({**GOOD, "event_time": t}).encode() for t in times]
    expected = [_python(v)[0] for v in values]
    assert expected == [None, None, "future_timestamp:event_time", "future_timestamp:event_time",
                        None, None, "future_timestamp:event_time"]
    frame = spark.createDataFrame([(i, v, NOW) for i, v in enumerate(values)],
                                  "i long, value binary, now timestamp")
    rows = with_verdict(frame, now=F.col("now")).orderBy("i").collect()
    got = [None if r["reason"] is None else f"{r['reason']}:{r['field']}" for r in rows]
    assert got == expected


def test_the_partition_columns_are_the_utc_date_and_hour(spark: Any, tmp_path: Any) -> None:
    """``utc_date`` and ``utc_hour``, computed from microseconds, give what ``to_date`` and
    ``hour`` give in a UTC session, around midnights and hours, before the epoch, in leap
    years and at the ends of the four-digit years; and a store partitioned by the date has
    the folders ``date_format`` names (``event_date=yyyy-MM-dd``), which its readers prune."""
    from datetime import UTC, datetime, timedelta

    from pyspark.sql import functions as F

    from pipelines.offline_store import utc_date, utc_hour

    anchors = [datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, tzinfo=UTC),
               datetime(2024, 2, 29, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC),
               datetime(2026, 11, 29, 13, tzinfo=UTC), datetime(1900, 3, 1, tzinfo=UTC),
               datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 31, 23, tzinfo=UTC)]
    steps = [timedelta(microseconds=s) for s in (-1, 0, 1)] + [timedelta(minutes=59, seconds=59)]
    times = [a + s for a in anchors for s in steps]
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(times)], "i int, t timestamp")
    rows = frame.select(utc_date("t").alias("date"), utc_hour("t").alias("hour"),
                        F.to_date("t").alias("want_date"),
                        F.date_format("t", "yyyy-MM-dd").alias("want_text"),
                        F.hour("t").alias("want_hour")).collect()
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert len(rows) == len(times)
    assert [(r["date"], r["hour"]) for r in rows] == [(r["want_date"], r["want_hour"]) for r in rows]
    assert rows[0]["date"].isoformat() == "1969-12-31" and rows[0]["hour"] == 23  # 1 µs before
    texts = {r["want_text"] for r in rows}
    assert texts >= {"2024-02-29", "0001-01-01", "9999-12-31"}

    out = str(tmp_path / "store")
    (frame.select("i", utc_date("t").alias("event_date"), utc_hour("t").alias("event_hour"))
     .write.partitionBy("event_date", "event_hour").parquet(out))
    folders = {p.name for p in (tmp_path / "store").iterdir() if p.is_dir()}
    assert folders == {f"event_date={text}" for text in texts}
    read = spark.read.schema("i int, event_date string, event_hour int").parquet(out)
    back = {r["i"]: (r["event_date"], r["event_hour"]) for r in read.collect()}
    want = {i: (r["want_text"], r["want_hour"]) for i, r in enumerate(rows)}
    assert back == want
    leap = read.where(F.col("event_date") == "2024-02-29").select("i").collect()
    assert sorted(r["i"] for r in leap) == [i for i, t in enumerate(times) if t.date().isoformat()
                                            == "2024-02-29"]
