"""Malformed records of every kind through the *running* stream: quarantined with the right
reason, duplicates counted once, the job keeps going, the counts exact.

The corpus is ``tests/corpus.py`` (56 cases, shared with the validators' tests) plus the
kinds only a running stream can see: a null Kafka key, a very large string, far-future
and epoch-overflow times, duplicated event ids (the same record replayed, and another
payload under an id already seen), an id reused at another event time (a different event:
the dedup's identity is the id and the event time, as in the backfill), all sent
``COPIES`` times each, in two waves produced while one streaming query runs (the second wave only after the first one is processed,
so the query has to survive the first wave's garbage).

The null Kafka key: the contract says key = user_id (``stream_check_key``, on by default),
so a null-keyed *valid* event is quarantined as ``missing_key``; a null-keyed malformed
record is quarantined with its payload's reason (the payload rules come first); either way
with a null ``raw_key``. A valid event under another user's key is ``key_mismatch``.

Default (CI): 2 copies of each kind. Full: 25.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from features.events import Event, Reason, validate_event
from pipelines.settings import Settings
from tests.corpus import CASES, GOOD, NOW
from tests.integration.test_stream import (
    Sent,
    check_stores,
    create_topic,
    expected_outcome,
    produce,
    read_quarantine,
    stream_settings,
)
from tests.reliability.helpers import size, topic_name, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.integration]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

COPIES = size(2, 25)
TS = int(NOW.timestamp() * 1000)
"""Kafka timestamp of every record: the corpus's "now" (the future rule compares with it)."""


def _doc(event_id: str, **changes: Any) -> dict[str, Any]:
    doc = dict(GOOD, event_id=event_id, event_time="2024-06-01T11:58:00Z")
    doc.update(changes)
    return doc


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def kinds(wave: int, copy: int) -> list[tuple[str, bytes | None, bytes | None]]:
    """(kind, key, value) of one copy of every extra kind."""
    tag = f"w{wave}c{copy}"
    no_price = _doc(f"np-{tag}")
    no_price.pop("price")
    return [
        ("null_key_valid", None, _json(_doc(f"nk-{tag}", user_id="u-nokey"))),
        ("empty_key_valid", b"", _json(_doc(f"ek-{tag}", user_id="u-nokey"))),
        ("other_users_key", b"u-other", _json(_doc(f"ok2-{tag}"))),
        ("null_key_invalid_json", None, b'{"event_id": "nk-bad", '),
        ("null_key_empty", None, b""),
        ("tombstone", b"u1", None),  # a null value (kafka-python refuses null key *and* value)
        ("huge_string", b"u1", _json(_doc(f"big-{tag}", item_id="x" * 200_000))),
        ("far_future", b"u1", _json(_doc(f"ff-{tag}", event_time="2999-01-01T00:00:00Z"))),
        ("future_millis", b"u1", _json(_doc(f"fm-{tag}", event_time=TS + 6 * 60_000))),
        ("millis_overflow", b"u1", _json(_doc(f"mo-{tag}", event_time=10**30))),
        ("unparseable_time", b"u1", _json(_doc(f"ut-{tag}", event_time="01/06/2024 11:58"))),
        ("price_overflow", b"u1", _json(_doc(f"po-{tag}")).replace(b'"price": 9.5',
                                                                  b'"price": 1e999')),
        ("quantity_overflow", b"u1", _json(_doc(f"qo-{tag}", quantity=10**25))),
        ("purchase_no_price", b"u1", _json(no_price)),
        ("negative_price", b"u1", _json(_doc(f"neg-{tag}", price=-0.01))),
        ("negative_quantity", b"u1", _json(_doc(f"negq-{tag}", quantity=-1))),
        ("deep_json", b"u1", b"[" * 100_000 + b"]" * 100_000),
        ("valid", b"u1", _json(_doc(f"ok-{tag}", item_id=f"ok-item-{copy % 3}"))),
    ]


def wave(n: int) -> list[tuple[str, Sent]]:
    out: list[tuple[str, Sent]] = []
    for copy in range(COPIES):
        for i, (name, value, _verdict) in enumerate(CASES):
            key = b"u1"
            if value is not None and _verdict is None:  # valid corpus records: own ids and times
                doc = json.loads(value)
                doc.update(event_id=f"corpus-{n}-{copy}-{i}", event_time="2024-06-01T11:57:00Z")
                value = json.dumps(doc).encode()
                key = doc["user_id"].encode()  # the contract: key = user_id
            out.append((f"corpus:{name}", Sent(key, value, TS)))
        out += [(kind, Sent(key, value, TS)) for kind, key, value in kinds(n, copy)]
    return out


def duplicates(first: list[tuple[str, Sent]]) -> list[tuple[str, Sent]]:
    """Replays of wave 1's valid events, other payloads under ids it already used, and ids
    it used again at another event time (different events, to be stored)."""
    valid = [s for _, s in first
             if isinstance(validate_event(s.value, now=NOW, key=s.key, check_key=True), Event)]
    out = [("dup_replayed", s) for s in valid[: 3 * COPIES]]
    for s in valid[3 * COPIES: 5 * COPIES]:
        doc = json.loads(s.value or b"")
        doc.update(item_id="other-item", event_type="view")
        out.append(("dup_other_payload", Sent(s.key, json.dumps(doc).encode(), TS)))
    for s in valid[5 * COPIES: 6 * COPIES]:
        doc = json.loads(s.value or b"")
        doc.update(event_time="2024-06-01T11:58:30Z")  # wave 1's are at 11:57 and 11:58
        out.append(("id_reused_other_time", Sent(s.key, json.dumps(doc).encode(), TS)))
    return out


def _progress(redis_client: Any) -> dict[str, int]:
    from features.online_keys import stream_progress_key

    raw = redis_client.hgetall(stream_progress_key())
    return {k.decode(): int(v) for k, v in raw.items() if k.startswith(b"total_")
            and v.decode().lstrip("-").isdigit()}


def test_every_bad_kind_is_quarantined_by_the_running_stream(
    make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any, spark: Any,
    tmp_path: Path,
) -> None:
    from pipelines.stream import StreamOptions, run_stream

    topic = topic_name("bad", tmp_path)
    settings = stream_settings(make_settings, tmp_path, topic, stream_max_offsets_per_trigger=150,
                               stream_trigger_seconds=0.5)
    create_topic(settings, topic)

    first = wave(1)
    second = wave(2) + duplicates(first)
    sent = [s for _, s in first + second]
    expected = expected_outcome(sent)

    # what each kind should give, by the contract's Python validator
    verdicts: dict[str, Counter[str]] = {}
    seen: set[tuple[str, datetime]] = set()
    for kind, s in first + second:
        v = validate_event(s.value, now=datetime.fromtimestamp(s.ts_ms / 1000, tz=UTC),
                           key=s.key, check_key=True)
        if isinstance(v, Event):
            label = "duplicate" if (v.event_id, v.event_time) in seen else "stored"
            seen.add((v.event_id, v.event_time))
        else:
            label = str(v)
        verdicts.setdefault(kind, Counter())[label] += 1
    reasons = {label.split(":")[0] for c in verdicts.values() for label in c} - {"stored", "duplicate"}
    assert len(reasons) >= 14, reasons  # the kinds really differ
    SENT = 2 * COPIES  # each kind, both waves
    assert verdicts["null_key_valid"] == Counter(missing_key=SENT)
    assert verdicts["empty_key_valid"] == Counter(missing_key=SENT)
    assert verdicts["other_users_key"] == Counter(key_mismatch=SENT)
    assert verdicts["null_key_empty"] == Counter(empty_payload=SENT)
    assert verdicts["huge_string"] == Counter({"field_too_long:item_id": SENT})
    assert verdicts["far_future"] == Counter({"future_timestamp:event_time": SENT})
    assert verdicts["price_overflow"] == Counter({"numeric_overflow:price": SENT})
    assert verdicts["quantity_overflow"] == Counter({"numeric_overflow:quantity": SENT})
    assert verdicts["deep_json"] == Counter(invalid_json=SENT)
    assert verdicts["dup_replayed"] == Counter(duplicate=3 * COPIES)
    assert verdicts["dup_other_payload"] == Counter(duplicate=2 * COPIES)
    assert verdicts["id_reused_other_time"] == Counter(stored=COPIES)

    queries: list[Any] = []
    failure: list[BaseException] = []
    started = threading.Event()

    def run() -> None:
        try:
            run_stream(settings, StreamOptions(stop="never", timeout_seconds=900), spark=spark,
                       on_started=lambda q: (queries.append(q), started.set()))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failure.append(exc)
            started.set()

    produce(settings, [s for _, s in first])
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert started.wait(300) and not failure, failure
        wait_for(lambda: _progress(redis_client).get("total_input_rows", 0) >= len(first),
                 timeout=600, what="wave 1 processed", alive=runner.is_alive)
        mid = _progress(redis_client)
        assert queries[0].isActive and queries[0].exception() is None
        produce(settings, [s for _, s in second])
        wait_for(lambda: _progress(redis_client).get("total_input_rows", 0) >= len(sent),
                 timeout=600, what="wave 2 processed", alive=runner.is_alive)
        time.sleep(1.0)  # a trailing empty trigger may still be writing progress
        assert queries[0].isActive and queries[0].exception() is None, "the job stopped"
    finally:
        from pipelines.stream import stop_gracefully  # after the running batch, as the CLI does

        for q in queries:
            stop_gracefully(q)
        runner.join(180)
    assert not failure, failure
    totals = _progress(redis_client)

    n_quarantined = sum(expected.quarantine.values())
    print(f"{len(sent)} records, {len(verdicts)} kinds x {COPIES} copies; "
          f"quarantined {n_quarantined}, duplicates {expected.duplicates}, "
          f"stored {len(expected.events)}; by kind: "
          + ", ".join(f"{k}={dict(v)}" for k, v in sorted(verdicts.items()) if k[:7] != "corpus:"))
    assert totals["total_input_rows"] == len(sent)
    assert totals["total_quarantined"] == n_quarantined
    assert totals["total_duplicates_dropped"] == expected.duplicates
    assert totals["total_on_time"] == len(expected.events)
    assert mid["total_quarantined"] < n_quarantined  # the second wave came after

    # raw store, quarantine multiset, verify 100 % (the clock stays in one slide: no snapshot)
    check_stores(spark, settings, expected, snapshots=False)

    # null keys are kept as null in the quarantine
    from pipelines.offline_store import quarantine_path

    rows = spark.read.parquet(quarantine_path(settings)).where("raw_key IS NULL").collect()
    nulls = Counter(r["reason"] for r in rows)
    assert nulls == Counter({Reason.INVALID_JSON.value: 2 * COPIES,
                             Reason.EMPTY_PAYLOAD.value: 2 * COPIES,
                             Reason.MISSING_KEY.value: 2 * COPIES}), nulls
    # empty and null payloads: the corpus's two cases, the null-keyed and the tombstones
    assert read_quarantine(spark, settings)[("empty_payload", None, None)] == 8 * COPIES
