"""generate and replay into a real Kafka topic, read back with a consumer."""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console

from features.events import Event, validate_event
from pipelines.cli import UserError
from pipelines.clickstream_model import DUPLICATE
from pipelines.connections import kafka_consumer
from pipelines.generate import GeneratorConfig, generate_records, run_generate
from pipelines.replay import run_replay
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

START = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
READ_BACK_S = 60
"""Bound on reading a small topic back."""


def _read_all(settings: Settings, topic: str, expected: int) -> list[Any]:
    """Every record of ``topic`` (waits up to READ_BACK_S for ``expected`` of them)."""
    consumer = kafka_consumer(settings, topic, consumer_timeout_ms=2000)
    records: list[Any] = []
    deadline = time.monotonic() + READ_BACK_S
    try:
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                records.extend(batch)
        records.extend(r for batch in consumer.poll(timeout_ms=500).values() for r in batch)
    finally:
        consumer.close()
    return records


@pytest.fixture()
def topic_settings(make_settings: Callable[..., Settings], topic: str) -> Settings:
    return make_settings(kafka_topic_events=topic)


def test_generate_into_topic(topic_settings: Settings, topic: str) -> None:
    config = GeneratorConfig(seed=11, users=500, items=300, categories=12, bad_fraction=0.1, nominal_rate=100)
    report = run_generate(topic_settings, config, count=3000, start_time="2024-06-01T12:00:00Z",
                          console=Console(quiet=True))
    assert report.sent == 3000 and report.failed == 0

    expected = list(generate_records(config, start_ms=int(START.timestamp() * 1000), count=3000))
    got = _read_all(topic_settings, topic, 3000)
    assert len(got) == 3000
    assert collections.Counter((r.key, r.value) for r in got) == collections.Counter(
        (e.key, e.value) for e in expected
    )
    # Keys are user ids; a key decides the partition, so a user's events stay together.
    partitions_of: dict[bytes, set[int]] = collections.defaultdict(set)
    now = START + timedelta(hours=1)
    labels = {(e.key, e.value): e.label for e in expected}
    for record in got:
        verdict = validate_event(record.value, now=now, key=record.key, check_key=record.key is not None)
        label = labels[(record.key, record.value)]
        if label in (None, DUPLICATE):
            assert isinstance(verdict, Event) and record.key == verdict.user_id.encode()
        else:
            assert str(verdict) == label
        if record.key is not None:
            partitions_of[record.key].add(record.partition)
    assert all(len(p) == 1 for p in partitions_of.values())
    assert len({r.partition for r in got}) == topic_settings.kafka_topic_partitions
    # Per partition, exactly the generated sequence (event-time order, duplicates where re-sent).
    partition_of = {key: next(iter(p)) for key, p in partitions_of.items()}
    for partition in range(topic_settings.kafka_topic_partitions):
        sent = [(e.key, e.value) for e in expected if e.key is not None and partition_of[e.key] == partition]
        read = [(r.key, r.value) for r in got if r.partition == partition and r.key is not None]
        assert read == sent


def test_replay_into_topic(topic_settings: Settings, topic: str) -> None:
    report = run_replay(topic_settings, preset="online-retail", limit=4000, console=Console(quiet=True))
    assert report.sent == 4000 and report.failed == 0 and report.details["rows read"] == 70_051

    got = _read_all(topic_settings, topic, 4000)
    assert len(got) == 4000
    verdicts: collections.Counter[str] = collections.Counter()
    for record in got:
        doc_time = validate_event(record.value, now=datetime(2011, 2, 1, tzinfo=UTC))
        if isinstance(doc_time, Event):
            assert record.key == doc_time.user_id.encode()
            verdicts["valid"] += 1
        else:
            verdicts[str(doc_time)] += 1
    assert dict(verdicts) == {"valid": report.valid, **report.rejected}
    assert report.rejected and set(report.rejected) == {"invalid_quantity:quantity"}


def test_generate_unreachable_broker_is_one_line(make_settings: Callable[..., Settings]) -> None:
    from tests.conftest import free_port

    settings = make_settings(kafka_bootstrap_servers=f"127.0.0.1:{free_port()}")
    with pytest.raises(UserError) as info:
        run_generate(settings, GeneratorConfig(), count=10, console=Console(quiet=True))
    assert "cannot reach Kafka at 127.0.0.1:" in str(info.value) and "\n" not in str(info.value)


def test_parallel_sink_partitions_like_one_producer(topic_settings: Settings, topic: str) -> None:
    """Bulk loads use several processes; each partition must still get one producer's sequence."""
    from kafka.partitioner.default import murmur2

    from pipelines.producer import ParallelKafkaSink, ProduceReport, produce

    config = GeneratorConfig(seed=12, users=300, items=200, categories=8, bad_fraction=0.05, nominal_rate=100)
    expected = list(generate_records(config, start_ms=int(START.timestamp() * 1000), count=4000))
    sink = ParallelKafkaSink(topic_settings, processes=2)
    report = produce(iter(expected), sink, ProduceReport(target=sink.description), console=Console(quiet=True))
    assert report.sent == 4000 and report.failed == 0

    got = _read_all(topic_settings, topic, 4000)
    assert len(got) == 4000
    n = topic_settings.kafka_topic_partitions
    for partition in range(n):
        sent = [(e.key, e.value) for e in expected
                if e.key is not None and (murmur2(e.key) & 0x7FFFFFFF) % n == partition]
        read = [(r.key, r.value) for r in got if r.partition == partition and r.key is not None]
        assert read == sent
    assert sum(1 for r in got if r.key is None) == sum(1 for e in expected if e.key is None)


def test_parallel_sink_counts_a_dead_workers_records_as_failed(topic_settings: Settings) -> None:
    import os
    import signal

    from pipelines.producer import ParallelKafkaSink

    sink = ParallelKafkaSink(topic_settings, processes=2)
    records = [(f"u{i}".encode(), b"{}", None, 0) for i in range(200)]
    sink.send_batch(records)
    victim = sink._workers[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=10)
    sink.send_batch(records)  # must not hang on the dead worker's queue
    failed, first_error = sink.close()
    assert failed >= sink._handed[0] > 0  # nothing handed to it is taken as delivered
    assert first_error and "exited" in first_error


def test_sigterm_stops_generate_with_everything_it_counted_delivered(
    topic_settings: Settings, topic: str,
) -> None:
    """A paced ``shopstream generate`` stopped with SIGTERM (as a process manager does):
    it stops sending, delivers what it had handed to Kafka, prints its summary marked
    interrupted and exits 0; the topic holds exactly the records the summary counts."""
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "generate", "--rate", "400", "--duration", "300",
         "--seed", "5", "--users", "50", "--items", "30"],
        cwd=repo, env={**topic_settings.child_env(), "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        seen = _read_all(topic_settings, topic, 200)  # it is sending
        assert len(seen) >= 200, "generate did not start sending"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "SIGTERM received: delivering what was already sent" in out, out[-3000:]
    assert re.search(r"interrupted\W+yes", out), out[-3000:]
    match = re.search(r"records sent\W+([\d,]+)", out)
    assert match, out[-3000:]
    sent = int(match.group(1).replace(",", ""))
    assert 200 <= sent < 400 * 300
    assert re.search(r"delivery failures\W+0\b", out), out[-3000:]
    assert len(_read_all(topic_settings, topic, sent)) == sent  # all of them, no more


def test_kafka_gone_before_the_sink_closes_counts_what_it_held_without_raising(
        make_settings: Callable[..., Settings], tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``generate`` with its broker killed mid-run ended, 2 min 42 s later, in a
    ``KafkaTimeoutError`` traceback from the producer's close (which flushes again), past the
    summary of what was not delivered, and once more from the producer's ``__del__``. The
    wait said nothing of its own; now a status line says what it waits for and why."""
    from pipelines.infra import KafkaBroker
    from pipelines.log_repeats import CollapseRepeats
    from pipelines.producer import KafkaSink
    from tests.conftest import free_port

    settings = make_settings(kafka_bootstrap_servers=f"127.0.0.1:{free_port()}",
                             kafka_controller_port=free_port(), run_dir=str(tmp_path / "run"),
                             kafka_topic_events="gone.events")
    # what the CLI's log shows of kafka-python meanwhile (its handler's filter)
    shown: list[str] = []
    kafka_log = logging.getLogger("kafka")
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    handler.addFilter(CollapseRepeats(("kafka",)))
    kafka_log.addHandler(handler)
    broker = KafkaBroker(settings)
    broker.start()
    try:
        sink = KafkaSink(settings)
        sink.send_batch([(b"u1", b'{"n": 1}')])
        assert sink.close() == (0, None)  # delivered
        sink = KafkaSink(settings)
        sink.FLUSH_TIMEOUT_S, sink.WAIT_STATUS_EVERY_S = 2.0, 0.5
        broker.stop()
        sink.send_batch([(f"u{i}".encode(), b'{"n": 2}') for i in range(50)])
        with caplog.at_level(logging.WARNING, logger="pipelines.producer"):
            failed, error = sink.close()  # no exception: the records are counted instead
        assert failed == 50 and error is not None
        waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for Kafka")]
        assert 2 <= len(waits) <= 4, waits  # one every 0.5 s of the 2 s
        address = settings.kafka_bootstrap_servers
        assert re.match(r"waiting for Kafka to acknowledge 50 records \(\d s of 2 s\): "
                        rf"cannot reach Kafka at {re.escape(address)} \(connection refused\)", waits[0]), waits
        assert sink._producer._closed  # noqa: SLF001 - its __del__ will not flush again
        # kafka-python's lines of the outage: one in our words, quoting its first (it logged
        # a refused or lost connection in several kinds: transport, connection, metadata...)
        failed_lines = [line for line in shown if line.startswith("Kafka connection failed (kafka-python: ")]
        assert len(failed_lines) == 1, shown
        assert not [line for line in shown if not line.startswith("Kafka connection")
                    and ("ECONNREFUSED" in line or "KafkaConnectionError" in line)], shown
    finally:
        kafka_log.removeHandler(handler)
        broker.stop()
