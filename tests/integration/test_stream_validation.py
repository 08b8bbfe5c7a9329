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


def _spark(spark: Any, values: list[bytes | None]) -> list[tuple[str | None, dict[str, Any]]]:
    from pyspark.sql import functions as F

    from features.events import VALID_COLUMNS
    from features.validation import with_verdict

    frame = spark.createDataFrame(list(enumerate(values)), "i long, value binary")
    rows = (with_verdict(frame, now=F.lit(NOW)).select("i", "reason", "field", *VALID_COLUMNS)
            .orderBy("i").collect())
    out = []
    for row in rows:
        verdict = None if row["reason"] is None else (
            f"{row['reason']}:{row['field']}" if row["field"] else row["reason"])
        out.append((verdict, {c: row[c] for c in VALID_COLUMNS}))
    return out


def test_spark_verdicts_equal_python_on_corpus_and_mutations(spark: Any) -> None:
    values = [value for _, value, _ in CASES] + mutated_records(3000)
    got = _spark(spark, values)
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
