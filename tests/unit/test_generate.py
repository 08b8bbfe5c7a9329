"""The synthetic clickstream: what a store's traffic looks like, determinism, and bad records.

Everything here runs the generator without Kafka (pure model or ``--output``).
"""

from __future__ import annotations

import collections
import io
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

from features.events import Event, Reason, Rejection, validate_event
from pipelines.cli import UserError, app
from pipelines.clickstream_model import BAD_KINDS, DUPLICATE, ClickstreamModel, Record
from pipelines.generate import GeneratorConfig, generate_records, run_generate
from pipelines.producer import read_records
from pipelines.settings import Settings

START = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
START_MS = int(START.timestamp() * 1000)
SMALL_STORE = {"users": 2000, "items": 1000, "categories": 20, "nominal_rate": 100.0}
"""A small store at 100 simulated events/s: 2,000 open sessions, cheap to start."""


def _records(n: int, **config: object) -> list[Record]:
    cfg = GeneratorConfig(**{"seed": 7, **SMALL_STORE, **config})  # type: ignore[arg-type]
    return list(generate_records(cfg, start_ms=START_MS, count=n))


@pytest.fixture(scope="module")
def clean() -> list[dict[str, object]]:
    """60,000 valid events (ten simulated minutes)."""
    return [orjson.loads(r.value) for r in _records(60_000)]


def _quiet() -> Console:
    return Console(quiet=True)


# ---------------------------------------------------------------- what the traffic looks like
def test_generate_item_popularity_is_zipf_like(clean: list[dict[str, object]]) -> None:
    views = collections.Counter(e["item_id"] for e in clean if e["event_type"] == "view")
    counts = np.array(sorted(views.values(), reverse=True), dtype=float)
    top_tenth = counts[: len(counts) // 10].sum() / counts.sum()
    assert top_tenth > 0.6, f"the top 10% of items get only {top_tenth:.0%} of views"
    slope = np.polyfit(np.log(np.arange(1, 101)), np.log(counts[:100]), 1)[0]
    assert -1.4 < slope < -0.8, f"rank-frequency slope {slope:.2f} is not Zipf-like"


def test_generate_conversion_rates_are_realistic(clean: list[dict[str, object]]) -> None:
    types = collections.Counter(e["event_type"] for e in clean)
    cart_per_view = types["add_to_cart"] / types["view"]
    purchase_per_cart = types["purchase"] / types["add_to_cart"]
    purchase_per_view = types["purchase"] / types["view"]
    assert 0.075 <= cart_per_view <= 0.105, cart_per_view
    assert 0.28 <= purchase_per_cart <= 0.42, purchase_per_cart
    assert 0.02 <= purchase_per_view <= 0.045, purchase_per_view


def test_generate_users_prefer_a_few_categories(clean: list[dict[str, object]]) -> None:
    views = [(e["user_id"], e["category_id"]) for e in clean if e["event_type"] == "view"]

    def top3_share(pairs: list[tuple[object, object]]) -> float:
        per_user: dict[object, collections.Counter[object]] = collections.defaultdict(collections.Counter)
        for user, category in pairs:
            per_user[user][category] += 1
        shares = [
            sum(n for _, n in c.most_common(3)) / sum(c.values())
            for c in per_user.values() if sum(c.values()) >= 20
        ]
        return float(np.mean(shares))

    users = [u for u, _ in views]
    random.Random(1).shuffle(users)
    shuffled = list(zip(users, [c for _, c in views], strict=True))
    assert top3_share(views) > 0.8
    assert top3_share(views) > top3_share(shuffled) + 0.2  # not just globally popular categories


def test_generate_sessions_go_view_cart_purchase(clean: list[dict[str, object]]) -> None:
    in_progress = ClickstreamModel(GeneratorConfig(seed=7, **SMALL_STORE)).sessions_in_progress
    sessions: dict[str, list[dict[str, object]]] = collections.defaultdict(list)
    for event in clean:
        sessions[str(event["session_id"])].append(event)
    checked = 0
    for session_id, events in sessions.items():
        assert len({e["user_id"] for e in events}) == 1
        times = [str(e["event_time"]) for e in events]
        assert times == sorted(times)
        if int(session_id.rsplit("-s", 1)[1]) <= in_progress:
            continue  # started before the first event: its first steps were not sent
        viewed: set[object] = set()
        carted: set[object] = set()
        for i, event in enumerate(events):
            item = event["item_id"]
            if event["event_type"] == "view":
                viewed.add(item)
                assert all(e["event_type"] != "purchase" for e in events[:i]), "view after checkout"
            elif event["event_type"] == "add_to_cart":
                assert item in viewed and events[i - 1]["item_id"] == item
                carted.add(item)
            else:
                assert item in carted
        checked += 1
    assert checked > 1000


def test_generate_prices_fixed_per_item_and_keys_are_users(clean: list[dict[str, object]]) -> None:
    prices: dict[object, set[object]] = collections.defaultdict(set)
    for event in clean:
        prices[event["item_id"]].add(event["price"])
    assert all(len(p) == 1 for p in prices.values())
    values = np.array([p for ps in prices.values() for p in ps], dtype=float)
    assert values.min() > 0
    # Log-normal-ish: right-skewed, a wide spread.
    assert values.mean() > np.median(values) and np.percentile(values, 90) > 4 * np.percentile(values, 10)
    regions = collections.Counter(e["region"] for e in clean)
    assert 8 <= len(regions) <= 14 and regions.most_common(1)[0][1] > 2 * np.median(list(regions.values()))
    for record in _records(2000):
        assert record.key == orjson.loads(record.value)["user_id"].encode()


def test_generate_event_times_advance_at_the_nominal_rate() -> None:
    records = _records(20_000)
    times = [r.time_ms for r in records]
    assert times == sorted(times)
    assert times[0] == START_MS
    assert 190 <= (times[-1] - times[0]) / 1000 <= 210  # 20,000 events at 100/s
    first = validate_event(records[0].value, now=START)
    assert isinstance(first, Event) and first.event_time == START


# ------------------------------------------------------------------------- determinism
def test_generate_same_seed_same_bytes() -> None:
    a = _records(5000, bad_fraction=0.1)
    b = _records(5000, bad_fraction=0.1)
    assert a == b
    c = _records(5000, bad_fraction=0.1, seed=8)
    assert [r.value for r in a] != [r.value for r in c]


def test_random_ids_are_uuids_of_the_same_traffic_and_a_rerun_sends_them_again() -> None:
    """``--random-ids``: each valid event's id is a distinct UUIDv4, the same on a re-run,
    and the traffic is otherwise the same (the same events, and copies and malformed
    records in the same places), so a comparison of the two kinds of id compares the ids."""
    sequential = _records(5000, bad_fraction=0.1)
    random_ids = _records(5000, bad_fraction=0.1, random_ids=True)
    assert random_ids == _records(5000, bad_fraction=0.1, random_ids=True)
    # the same records are malformed in the same way (the field a corruption picks may
    # differ: the picking draws depend on the record's text)
    assert ([r.label and r.label.split(":")[0] for r in random_ids]
            == [r.label and r.label.split(":")[0] for r in sequential])
    assert [r.time_ms for r in random_ids] == [r.time_ms for r in sequential]
    valid = [(orjson.loads(a.value), orjson.loads(b.value))
             for a, b in zip(sequential, random_ids, strict=True) if a.label is None]
    ids = [b["event_id"] for _, b in valid]
    assert len(set(ids)) == len(ids) > 4000
    assert all(uuid.UUID(i).version == 4 and str(uuid.UUID(i)) == i for i in ids)
    assert ids != sorted(ids), "random ids came out in order"
    for a, b in valid:
        assert {**a, "event_id": None} == {**b, "event_id": None}
    # a copy carries its original's random id, as it carried the sequence number
    originals = {r.value for r in random_ids if r.label is None}
    assert all(r.value in originals for r in random_ids if r.label == "duplicate")


def test_generate_output_file_is_byte_identical(settings: Settings, tmp_path: Path) -> None:
    def run(path: Path) -> None:
        run_generate(settings, GeneratorConfig(seed=3, **SMALL_STORE, bad_fraction=0.05), count=3000,
                     start_time="2024-06-01T12:00:00Z", output=path, console=_quiet())

    run(tmp_path / "a.jsonl")
    run(tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert len(list(read_records(tmp_path / "a.jsonl"))) == 3000


# ------------------------------------------------------------------------- bad records
def test_generate_every_bad_kind_rejected_with_intended_reason() -> None:
    records = _records(40_000, bad_fraction=0.5)
    now = datetime.fromtimestamp(records[-1].time_ms / 1000, UTC) + timedelta(seconds=1)
    seen_ids: set[str] = set()
    kinds: collections.Counter[str] = collections.Counter()
    for record in records:
        verdict = validate_event(record.value, now=now)
        if record.label is None or record.label == DUPLICATE:
            assert isinstance(verdict, Event), record
            if record.label == DUPLICATE:
                assert verdict.event_id in seen_ids, "a duplicate must re-send an earlier event"
            else:
                assert verdict.event_id not in seen_ids
            seen_ids.add(verdict.event_id)
        else:
            assert isinstance(verdict, Rejection), record
            assert str(verdict) == record.label, record
        kinds[(record.label or "valid").split(":")[0]] += 1
    assert set(BAD_KINDS) <= set(kinds), set(BAD_KINDS) - set(kinds)
    stream_only = {Reason.LATE_EVENT, Reason.MISSING_KEY, Reason.KEY_MISMATCH}
    assert {r.value for r in Reason} - stream_only <= set(kinds)


def test_generate_bad_records_keep_the_intended_key() -> None:
    for record in _records(5000, bad_fraction=0.5):
        if record.label == Reason.EMPTY_PAYLOAD:
            assert record.key is None and record.value == b""
        else:
            assert record.key is not None and record.key.startswith(b"u")


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.2])
def test_generate_bad_fraction_respected(fraction: float) -> None:
    records = _records(20_000, bad_fraction=fraction)
    bad = sum(1 for r in records if r.label is not None)
    # Binomial: 4 standard deviations.
    assert abs(bad / len(records) - fraction) <= 4 * (fraction * (1 - fraction) / len(records)) ** 0.5 + 1e-9


# ------------------------------------------------------------------------- options
def test_run_generate_needs_a_bound(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--count.*--duration"):
        run_generate(settings, GeneratorConfig(), rate=10, output=tmp_path / "x.jsonl")
    with pytest.raises(UserError, match="--count.*--duration"):
        run_generate(settings, GeneratorConfig(), output=tmp_path / "x.jsonl")


def test_run_generate_duration_bounds_event_time(settings: Settings, tmp_path: Path) -> None:
    report = run_generate(settings, GeneratorConfig(seed=1, **SMALL_STORE), duration=5.0,
                          start_time="2024-06-01T12:00:00", output=tmp_path / "d.jsonl", console=_quiet())
    times = [validate_event(v, now=START + timedelta(minutes=1)) for _, v in read_records(tmp_path / "d.jsonl")]
    assert all(isinstance(t, Event) for t in times)
    assert max(t.event_time for t in times) < START + timedelta(seconds=5)  # type: ignore[union-attr]
    assert 400 < report.sent < 600  # 5 s at 100 events/s


def test_run_generate_paced_follows_the_wall_clock(settings: Settings, tmp_path: Path) -> None:
    before = datetime.now(UTC)
    report = run_generate(settings, GeneratorConfig(seed=1, **SMALL_STORE), rate=200, count=100,
                          output=tmp_path / "p.jsonl", console=_quiet())
    after = datetime.now(UTC)
    assert report.sent == 100
    assert report.elapsed_s >= 0.3  # 100 events at 200/s take about half a second, not less
    for _, value in read_records(tmp_path / "p.jsonl"):
        event = validate_event(value, now=after)
        assert isinstance(event, Event)
        assert before - timedelta(seconds=1) <= event.event_time <= after


def test_run_generate_unpaced_default_start_is_not_in_the_future(settings: Settings, tmp_path: Path) -> None:
    run_generate(settings, GeneratorConfig(seed=1, **SMALL_STORE), count=5000,
                 output=tmp_path / "u.jsonl", console=_quiet())
    now = datetime.now(UTC)
    verdicts = [validate_event(v, now=now) for _, v in read_records(tmp_path / "u.jsonl")]
    assert all(isinstance(v, Event) for v in verdicts)
    assert max(v.event_time for v in verdicts) > now - timedelta(minutes=2)  # type: ignore[union-attr]


def test_run_generate_summary_counts(settings: Settings, tmp_path: Path) -> None:
    console = Console(record=True, width=120, file=io.StringIO())
    report = run_generate(settings, GeneratorConfig(seed=5, **SMALL_STORE, bad_fraction=0.1), count=4000,
                          start_time="2024-06-01T12:00:00Z", output=tmp_path / "s.jsonl", console=console)
    text = console.export_text()
    assert report.sent == 4000 and report.failed == 0
    assert report.valid + sum(report.rejected.values()) == 4000
    assert report.duplicates == report.labels[DUPLICATE] > 0
    assert "records sent" in text and "4,000" in text and "events/s" in text and "duplicates" in text


# ------------------------------------------------------------------------- CLI
def test_cli_generate_malformed_option_names_it() -> None:
    result = CliRunner().invoke(app, ["generate", "--bad-fraction", "2", "--count", "10"])
    assert result.exit_code == 2
    assert any("--bad-fraction" in line for line in result.output.splitlines())


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["generate", "--rate", "10"], "--count"),
        (["generate", "--count", "5", "--start-time", "yesterday"], "--start-time"),
        (["replay", "--map", "user_id"], "--map"),
        (["replay", "--map", "colour=Country", "--preset", "online-retail"], "--map"),
        (["replay", "--preset", "nope"], "--preset"),
        (["replay", "--preset", "online-retail", "--speedup", "0"], "--speedup"),
    ],
)
def test_cli_user_error_is_one_line_naming_the_option(
    args: list[str], option: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    result = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "o.jsonl")])
    assert isinstance(result.exception, UserError), result.output
    message = str(result.exception)
    assert "\n" not in message and option in message
