"""The event contract's Python validator: every reason code, on the shared corpus."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from features.events import Event, Reason, Rejection, event_to_json, validate_event
from tests.corpus import CASES, GOOD, NOW


@pytest.mark.parametrize(("name", "raw", "expected"), CASES, ids=[c[0] for c in CASES])
def test_validate_event_corpus(name: str, raw: bytes | None, expected: str | None) -> None:
    verdict = validate_event(raw, now=NOW)
    if expected is None:
        assert isinstance(verdict, Event), f"{name}: rejected as {verdict}"
    else:
        assert isinstance(verdict, Rejection)
        assert str(verdict) == expected


def test_validate_event_every_reason_covered() -> None:
    seen = {str(validate_event(raw, now=NOW)).split(":")[0] for _, raw, exp in CASES if exp}
    stream_only = {Reason.LATE_EVENT, Reason.MISSING_KEY, Reason.KEY_MISMATCH}
    assert {r.value for r in Reason} - stream_only <= seen


def test_validate_event_types_and_defaults() -> None:
    event = validate_event(event_to_json({**GOOD, "quantity": None, "device": None}), now=NOW)
    assert isinstance(event, Event)
    assert event.event_time == datetime(2024, 6, 1, 11, 59, tzinfo=UTC)
    assert event.quantity == 1 and event.price == 9.5 and event.device is None


def test_validate_event_epoch_millis_equals_iso() -> None:
    a = validate_event(event_to_json({**GOOD, "event_time": 1717243140000}), now=NOW)
    b = validate_event(event_to_json(GOOD), now=NOW)
    assert isinstance(a, Event) and isinstance(b, Event) and a.event_time == b.event_time


def test_validate_event_key_rules() -> None:
    raw = event_to_json(GOOD)
    assert validate_event(raw, now=NOW, key=b"u1", check_key=True) == validate_event(raw, now=NOW)
    assert validate_event(raw, now=NOW, key=None, check_key=True) == Rejection(Reason.MISSING_KEY)
    assert validate_event(raw, now=NOW, key=b"u2", check_key=True) == Rejection(Reason.KEY_MISMATCH)


def test_event_to_json_roundtrip() -> None:
    event = validate_event(event_to_json(GOOD), now=NOW)
    assert isinstance(event, Event)
    again = validate_event(event_to_json(event.as_dict()), now=NOW)
    assert again == event
