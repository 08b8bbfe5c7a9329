"""The backfill's default as-of range: the events' span on the step grid, never in the future."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pipelines.backfill import as_of_series, default_range

STEP = 3600


def test_historic_events_are_rounded_out_to_the_step() -> None:
    first = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)
    last = datetime(2011, 1, 31, 17, 5, tzinfo=UTC)
    since, until = default_range(first, last, STEP, now=datetime(2026, 11, 22, tzinfo=UTC))
    assert since == datetime(2010, 12, 1, 8, 0, tzinfo=UTC)
    assert until == datetime(2011, 1, 31, 18, 0, tzinfo=UTC)
    start, count = as_of_series(since, until, STEP)
    assert start + timedelta(seconds=STEP * (count - 1)) == until  # the last as-of covers `last`


def test_live_events_never_give_an_as_of_after_now() -> None:
    now = datetime(2026, 11, 22, 12, 31, 7, tzinfo=UTC)
    since, until = default_range(now - timedelta(hours=3), now - timedelta(seconds=20), STEP, now)
    assert until == now
    start, count = as_of_series(since, until, STEP)
    last_as_of = start + timedelta(seconds=STEP * (count - 1))
    assert last_as_of == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_events_slightly_in_the_future_bound_the_range() -> None:
    now = datetime(2026, 11, 22, 12, 59, 0, tzinfo=UTC)
    last = now + timedelta(minutes=3)  # the contract tolerates a little future
    _, until = default_range(now - timedelta(hours=1), last, STEP, now)
    assert until == last
