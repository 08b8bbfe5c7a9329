"""Sending raw records to Kafka (or a JSON-lines file), paced or not, with progress and a summary.

Shared by ``shopstream generate`` and ``shopstream replay``: both turn their
input into :class:`Record`-like tuples ``(key, value, label, time_ms)`` in
event-time order and hand them to :func:`produce`.

Delivery is checked, never assumed: every Kafka send returns a future, futures
are checked as they complete and once more after the final ``flush``, and the
report counts the failures (with the first error) so nothing is dropped
silently.

The file format of ``--output`` is one JSON object per line,
``{"key": "<user id>" | null, "value": "<base64 of the raw value bytes>"}``:
base64 keeps payloads that are not UTF-8 (which the generator makes on
purpose) byte for byte. :func:`read_records` reads it back.
"""

from __future__ import annotations

import base64
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.partitioner.default import DefaultPartitioner, murmur2
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pipelines.connections import kafka_producer, kafka_unreachable
from pipelines.settings import Settings
from pipelines.signals import GracefulStop

__all__ = [
    "DUPLICATE",
    "BULK_THRESHOLD",
    "BULK_PROCESSES",
    "ProduceReport",
    "RecordSink",
    "KafkaSink",
    "ParallelKafkaSink",
    "FileSink",
    "DeliveryError",
    "open_sink",
    "produce",
    "read_records",
    "render_summary",
]

log = logging.getLogger(__name__)

DUPLICATE = "duplicate"
"""Label of a valid record whose event_id was already sent (the stream counts it once)."""
CHUNK = 2000
"""Records handed to a sink at a time (bounds the latency of progress and pacing)."""
PACE_SLACK_S = 0.005
"""A paced record may leave up to this early; finer sleeps cost more than they buy."""
STOP_POLL_S = 0.2
"""A paced wait checks this often whether a stop (SIGTERM, Ctrl-C) was asked for."""
STATUS_EVERY_S = 5.0
"""Status-line period when the console is not a terminal."""
SLOW_BROKER_PATIENCE_S = 300.0
"""How long a send may wait for room in a full producer buffer before the run gives up."""
BULK_THRESHOLD = 200_000
"""Unpaced runs of at least this many records send through several producer processes."""
BULK_PROCESSES = 2
"""How many: kafka-python's per-record Python cost, not the broker, limits one process."""


class DeliveryError(RuntimeError):
    """Some records could not be delivered (raised after the summary is shown)."""


@dataclass
class ProduceReport:
    """What a producing run did; rendered by :func:`render_summary`."""

    target: str
    sent: int = 0
    """Records handed to the sink (and, for Kafka, acknowledged unless in ``failed``)."""
    failed: int = 0
    first_error: str | None = None
    labels: Counter[str] = field(default_factory=Counter)
    """``valid``, ``duplicate`` or the contract's verdict ``reason[:field]`` per record sent."""
    elapsed_s: float = 0.0
    interrupted: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    """Extra lines for the summary (rows read, time span, ...), in order."""

    @property
    def valid(self) -> int:
        return self.labels.get("valid", 0) + self.labels.get(DUPLICATE, 0)

    @property
    def duplicates(self) -> int:
        return self.labels.get(DUPLICATE, 0)

    @property
    def rejected(self) -> Counter[str]:
        return Counter({k: v for k, v in self.labels.items() if k not in ("valid", DUPLICATE)})

    @property
    def events_per_s(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0


class RecordSink(Protocol):
    """Where records go: Kafka or a file."""

    description: str

    def send_batch(self, records: Sequence[tuple[Any, ...]]) -> None:
        """Send ``(key, value, ...)`` tuples; may return before delivery."""

    def close(self) -> tuple[int, str | None]:
        """Deliver everything still pending; return ``(failed, first_error)``."""


class _CachingPartitioner(DefaultPartitioner):
    """kafka-python's default partitioner (murmur2 of the key, as the Java client) with a cache.

    The pure-Python murmur2 costs about as much as the rest of a send; keys
    repeat (one per user), so each key's partition is computed once per
    partition count. Keyless records keep the default behaviour.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple[bytes, int], int] = {}

    def partition(self, topic: str, key: Any, serialized_key: bytes | None, value: Any,
                  serialized_value: Any, cluster: Any) -> int:
        if serialized_key is None:
            return super().partition(topic, key, serialized_key, value, serialized_value, cluster)
        cache_key = (serialized_key, len(cluster.partitions_for_topic(topic)))
        partition = self._cache.get(cache_key)
        if partition is None:
            partition = super().partition(topic, key, serialized_key, value, serialized_value, cluster)
            self._cache[cache_key] = partition
        return partition


def _warn_slow_crc() -> None:
    """kafka-python checksums every record batch; without the ``crc32c`` package it does so in
    pure Python, which costs more than everything else in a send (3x fewer events/s)."""
    from kafka.record import util

    if getattr(util, "crc32c_c", True) is None and not _warned:
        _warned.append(True)
        log.warning("kafka-python is using its pure-Python CRC32C: install the 'crc32c' package "
                    "for about 3x faster producing")


_warned: list[bool] = []


class KafkaSink:
    """kafka-python producer on ``topic`` with delivery tracking."""

    FLUSH_TIMEOUT_S = 120.0
    """How long :meth:`close` waits for acknowledgements (the producer's delivery timeout)."""
    WAIT_STATUS_EVERY_S = 10.0
    """While :meth:`close` waits for Kafka, a status line this often: with the broker gone
    the wait is the full delivery timeout, and it was two silent minutes but for
    kafka-python's connection errors."""

    def __init__(self, settings: Settings, topic: str | None = None) -> None:
        self.topic = topic or settings.kafka_topic_events
        self._settings = settings
        self.description = f"Kafka topic {self.topic} at {settings.kafka_bootstrap_servers}"
        if (problem := kafka_unreachable(settings)) is not None:
            raise DeliveryError(problem)  # at once, without kafka-python's bootstrap retries
        try:
            self._producer = kafka_producer(
                settings, partitioner=_CachingPartitioner(), max_block_ms=10_000, bootstrap_timeout_ms=10_000
            )
        except KafkaError as exc:
            raise DeliveryError(
                f"cannot reach Kafka at {settings.kafka_bootstrap_servers}: {exc} "
                "(start one with `shopstream infra up` or set SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS)"
            ) from exc
        try:
            partitions = self._producer.partitions_for(self.topic)
        except KafkaError as exc:
            partitions = None
            cause: Exception | None = exc
        else:
            cause = None
        if not partitions:
            self._producer.close(timeout=1)
            raise DeliveryError(
                f"Kafka topic {self.topic!r} is not available at {settings.kafka_bootstrap_servers} "
                "(`shopstream infra up` creates it)"
            ) from cause
        _warn_slow_crc()
        self._pending: list[list[Any]] = []
        self._failed = 0
        self._first_error: str | None = None

    def _check(self, futures: list[Any]) -> list[Any]:
        """Count failed futures; return those not done yet."""
        not_done = []
        for future in futures:
            if not future.is_done:
                not_done.append(future)
            elif future.failed():
                self._failed += 1
                if self._first_error is None:
                    self._first_error = repr(future.exception)
        return not_done

    def send_batch(self, records: Sequence[tuple[Any, ...]]) -> None:
        send, topic = self._producer.send, self.topic
        futures: list[Any] = []
        append = futures.append
        for r in records:
            try:
                append(send(topic, value=r[1], key=r[0]))
            except KafkaTimeoutError:
                append(self._send_when_room(r[0], r[1], None))
        self._pending.append(futures)
        self._check_pending()

    def send_partitioned(self, records: Sequence[tuple[bytes | None, bytes, int]]) -> None:
        """Send ``(key, value, partition)`` tuples to the given partitions."""
        send, topic = self._producer.send, self.topic
        futures: list[Any] = []
        append = futures.append
        for r in records:
            try:
                append(send(topic, value=r[1], key=r[0], partition=r[2]))
            except KafkaTimeoutError:
                append(self._send_when_room(r[0], r[1], r[2]))
        self._pending.append(futures)
        self._check_pending()

    def _send_when_room(self, key: bytes | None, value: bytes, partition: int | None) -> Any:
        """The producer's buffer stayed full (a slow broker): keep waiting, within a bound."""
        deadline = time.monotonic() + SLOW_BROKER_PATIENCE_S
        while True:
            log.warning("Kafka is not keeping up (send buffer full); waiting")
            try:
                return self._producer.send(self.topic, value=value, key=key, partition=partition)
            except KafkaTimeoutError as exc:
                if time.monotonic() > deadline:
                    raise DeliveryError(
                        f"Kafka accepted nothing for {SLOW_BROKER_PATIENCE_S:.0f} s: {exc}"
                    ) from exc

    def _check_pending(self) -> None:
        # Check older batches once they are likely acknowledged; keep the rest for later.
        while len(self._pending) > 8:
            left = self._check(self._pending.pop(0))
            if left:
                self._pending.insert(0, left)
                break

    def unacknowledged(self) -> int:
        """Records sent whose delivery is not settled yet (acknowledged or failed)."""
        return sum(not f.is_done for futures in self._pending for f in futures)

    def _flush(self) -> None:
        """Flush within ``FLUSH_TIMEOUT_S``, saying every ``WAIT_STATUS_EVERY_S`` what it
        waits for and, when no bootstrap server answers, why."""
        started, told = time.monotonic(), None
        while True:
            waited = time.monotonic() - started
            try:
                self._producer.flush(timeout=max(0.0, min(self.WAIT_STATUS_EVERY_S,
                                                          self.FLUSH_TIMEOUT_S - waited)))
                return
            except KafkaTimeoutError as exc:
                waited = time.monotonic() - started
                if waited >= self.FLUSH_TIMEOUT_S:
                    log.error("flush failed: %s", exc)
                    self._first_error = self._first_error or repr(exc)
                    return
                problem = kafka_unreachable(self._settings)
                why = "" if problem is None else ": still unreachable" if problem == told else f": {problem}"
                told = problem
                log.warning("waiting for Kafka to acknowledge %s records (%.0f s of %.0f s)%s",
                            f"{self.unacknowledged():,}", waited, self.FLUSH_TIMEOUT_S, why)
            except KafkaError as exc:
                log.error("flush failed: %s", exc)
                self._first_error = self._first_error or repr(exc)
                return

    def close(self) -> tuple[int, str | None]:
        self._flush()
        for futures in self._pending:
            # Anything still not done after the flush is undelivered.
            left = len(self._check(futures))
            if left:
                self._failed += left
                self._first_error = self._first_error or "not acknowledged within the flush timeout"
        self._pending = []
        try:
            self._producer.close(timeout=10)
        except KafkaError as exc:
            # Kafka went away: closing flushes again and gives up; what it held is counted
            # above. It raised past the summary (a traceback after 2 min 42 s), and again
            # from the producer's __del__; force it shut instead.
            log.warning("Kafka producer closed with records it could not deliver: %s", exc)
            _force_close(self._producer)
        return self._failed, self._first_error


def _force_close(producer: Any) -> None:
    """Shut a kafka-python producer whose ``close`` failed: ``close`` flushes first, at any
    timeout, and that flush is what fails while Kafka is away. Aborts what it still holds
    (counted as undelivered by the caller) and marks it closed, so its ``__del__`` does not
    raise the same error again at exit."""
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
    producer._closed = True  # noqa: SLF001 - kafka-python's own flag, read by close/__del__


class FileSink:
    """JSON lines ``{"key": str | null, "value": base64}``, one per record."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.description = f"file {self.path}"
        self._file = self.path.open("wb")

    def send_batch(self, records: Sequence[tuple[Any, ...]]) -> None:
        b64, dumps = base64.b64encode, orjson.dumps
        self._file.write(b"".join(
            b'{"key":' + dumps(r[0].decode() if r[0] is not None else None)
            + b',"value":"' + b64(r[1]) + b'"}\n'
            for r in records
        ))

    def close(self) -> tuple[int, str | None]:
        self._file.close()
        return 0, None


def _producer_process(index: int, settings: Settings, topic: str, inbox: Any, results: Any) -> None:
    """Body of one :class:`ParallelKafkaSink` worker: a KafkaSink fed through a queue."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (after a flush) on Ctrl-C
    try:
        sink = KafkaSink(settings, topic)
    except DeliveryError as exc:
        results.put(("error", index, str(exc)))
        return
    results.put(("ready", index, None))
    first_error: str | None = None
    dropped = 0
    try:
        while (batch := inbox.get()) is not None:
            if first_error is not None:
                dropped += len(batch)  # after a failure: drain, count as not delivered
                continue
            try:
                sink.send_partitioned(batch)
            except Exception as exc:  # reported to the parent (the whole batch as not delivered)
                first_error = str(exc)
                dropped += len(batch)
    finally:
        failed, error = sink.close()
        results.put(("done", index, (failed + dropped, first_error or error)))


class ParallelKafkaSink:
    """Several producer processes, each owning the partitions ``p % processes == i``.

    kafka-python spends ~25 us of Python per record; one process (its GIL shared
    with the generator) tops out well below what the broker takes. Records are
    routed here by the Java client's partitioner (murmur2 of the key), so each
    partition receives exactly what, and in the order, a single producer would
    send; keyless records go round-robin. Workers report delivery failures at
    :meth:`close`; everything handed to a worker that dies is counted as failed.
    """

    QUEUE_DEPTH = 16

    def __init__(self, settings: Settings, processes: int, topic: str | None = None) -> None:
        import multiprocessing

        self.topic = topic or settings.kafka_topic_events
        self.description = (
            f"Kafka topic {self.topic} at {settings.kafka_bootstrap_servers} ({processes} producer processes)"
        )
        probe = KafkaSink(settings, self.topic)  # fails fast, with the usual message, on a bad broker/topic
        self._partitions = len(probe._producer.partitions_for(self.topic))
        probe.close()
        # fork: the workers need nothing from __main__ (spawn would re-import a caller's script).
        ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        self._results = ctx.Queue()
        self._inboxes = [ctx.Queue(maxsize=self.QUEUE_DEPTH) for _ in range(processes)]
        self._workers = [
            ctx.Process(target=_producer_process, args=(i, settings, self.topic, inbox, self._results),
                        name=f"shopstream-producer-{i}", daemon=True)
            for i, inbox in enumerate(self._inboxes)
        ]
        self._handed = [0] * processes
        self._reported: set[int] = set()
        for worker in self._workers:
            worker.start()
        for _ in self._workers:
            status, _, detail = self._result(timeout=120)
            if status == "error":
                self._stop()
                raise DeliveryError(detail)
        self._reported.clear()
        self._cache: dict[bytes, int] = {}
        self._round_robin = 0

    def _partition(self, key: bytes | None) -> int:
        if key is None:
            self._round_robin += 1
            return self._round_robin % self._partitions
        partition = self._cache.get(key)
        if partition is None:
            partition = (murmur2(key) & 0x7FFFFFFF) % self._partitions
            self._cache[key] = partition
        return partition

    def send_batch(self, records: Sequence[tuple[Any, ...]]) -> None:
        n = len(self._workers)
        buckets: list[list[tuple[bytes | None, bytes, int]]] = [[] for _ in range(n)]
        part = self._partition
        for record in records:
            p = part(record[0])
            buckets[p % n].append((record[0], record[1], p))
        for i, bucket in enumerate(buckets):
            if bucket:
                self._handed[i] += len(bucket)
                self._put(i, bucket)

    def _put(self, index: int, item: Any) -> None:
        """Queue ``item`` for worker ``index`` unless it died (then its records count as failed)."""
        import queue

        worker, inbox = self._workers[index], self._inboxes[index]
        while worker.is_alive():
            try:
                inbox.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    def close(self) -> tuple[int, str | None]:
        failed, first_error = 0, None
        for i in range(len(self._workers)):
            self._put(i, None)
        for _ in self._workers:
            status, index, detail = self._result(timeout=300)
            if status == "done":
                failed += detail[0]
                first_error = first_error or detail[1]
            else:  # died or silent: nothing it was handed is confirmed
                failed += self._handed[index] if index is not None else sum(self._handed)
                first_error = first_error or str(detail)
                if index is None:
                    break
        self._stop()
        return failed, first_error

    def _result(self, timeout: float) -> tuple[str, int | None, Any]:
        """The next worker report; a worker that died without one is an error, not a hang."""
        import queue

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, index, detail = self._results.get(timeout=1.0)
                self._reported.add(index)
                return status, index, detail
            except queue.Empty:
                for i, worker in enumerate(self._workers):
                    if i not in self._reported and not worker.is_alive():
                        self._reported.add(i)
                        return "error", i, f"{worker.name} exited with code {worker.exitcode}"
        return "error", None, f"no report from the producer processes within {timeout:.0f} s"

    def _stop(self) -> None:
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()


def open_sink(settings: Settings, output: Path | None, *, processes: int = 1) -> RecordSink:
    """A :class:`FileSink` when ``output`` is given, else Kafka on the events topic.

    ``processes > 1`` sends through a :class:`ParallelKafkaSink` (for bulk loads).
    """
    if output is not None:
        return FileSink(output)
    if processes > 1:
        return ParallelKafkaSink(settings, processes)
    return KafkaSink(settings)


def read_records(path: Path) -> Iterator[tuple[bytes | None, bytes]]:
    """Read an ``--output`` file back as ``(key, value)`` byte pairs."""
    with Path(path).open("rb") as fh:
        for line in fh:
            doc = orjson.loads(line)
            key = doc["key"]
            yield (key.encode() if key is not None else None), base64.b64decode(doc["value"])


class _Progress:
    """A rich progress bar on a terminal, else a status line every few seconds."""

    def __init__(self, console: Console, description: str, total: int | None) -> None:
        self.console, self.description, self.total = console, description, total
        self.done = 0
        self._bar: Progress | None = None
        self._task: Any = None
        self._start = self._last = time.monotonic()

    def __enter__(self) -> _Progress:
        if self.console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>10,.0f} events/s"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, rate=0.0)
        return self

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        rate = self.done / max(now - self._start, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, advance=n, rate=rate)
        elif now - self._last >= STATUS_EVERY_S:
            self._last = now
            of = f" of {self.total:,}" if self.total else ""
            log.info("%s: %s%s records sent (%s/s)", self.description, f"{self.done:,}", of, f"{rate:,.0f}")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)


def produce(
    records: Iterable[tuple[bytes | None, bytes, str | None, int]],
    sink: RecordSink,
    report: ProduceReport,
    *,
    pace: float | None = None,
    wall_clock: bool = False,
    total: int | None = None,
    console: Console | None = None,
    description: str = "sending",
) -> ProduceReport:
    """Send ``(key, value, label, time_ms)`` records in order, paced by their times or not.

    Parameters
    ----------
    records
        In event-time order; ``label`` is ``None`` for a valid record, ``"duplicate"``,
        or the contract's verdict; ``time_ms`` is when the record is due.
    sink
        Kafka or file; closed here (flushed, delivery checked).
    report
        Filled in and returned.
    pace
        ``None``: as fast as possible. Else a time compression factor: a record
        leaves ``(time_ms - first time_ms) / pace`` ms after the first (1.0 =
        real time).
    wall_clock
        With ``pace``: a record is due when the wall clock reaches its
        ``time_ms`` (times are "now"-based: event time then equals send time,
        which freshness measurements rely on), instead of relative to the first.
    total
        Expected number of records, for the progress bar.
    """
    console = console or Console(stderr=True)
    labels = report.labels
    buffer: list[tuple[bytes | None, bytes, str | None, int]] = []
    start = anchor = time.monotonic()
    first_ms: int | None = None

    def flush(progress: _Progress) -> None:
        sink.send_batch(buffer)
        for record in buffer:
            labels[record[2] or "valid"] += 1
        report.sent += len(buffer)
        progress.advance(len(buffer))
        buffer.clear()

    lost, lost_error = 0, None
    stop = GracefulStop(description, finishing="delivering what was already sent")
    with _Progress(console, description, total) as progress, stop:
        try:
            for record in records:
                if stop.requested.is_set():
                    break
                if pace is not None:
                    if first_ms is None:
                        # The monotonic instant of the first record's time: now, or (wall clock)
                        # when the wall clock shows it.
                        first_ms = record[3]
                        anchor = time.monotonic()
                        if wall_clock:
                            anchor += first_ms / 1000.0 - time.time()
                    due = anchor + (record[3] - first_ms) / 1000.0 / pace
                    now = time.monotonic()
                    if due > now + PACE_SLACK_S:
                        if buffer:
                            flush(progress)
                        while not stop.requested.is_set() and time.monotonic() < due:
                            time.sleep(min(STOP_POLL_S, max(0.0, due - time.monotonic())))
                        if stop.requested.is_set():
                            break
                buffer.append(record)
                if len(buffer) >= CHUNK:
                    flush(progress)
            if buffer:
                flush(progress)
            report.interrupted = stop.requested.is_set()
        except KeyboardInterrupt:
            report.interrupted = True
            log.warning("interrupted: delivering what was already sent")
            if buffer:
                flush(progress)
        except DeliveryError as exc:
            # Stop sending; the batch that failed is counted as not delivered.
            log.error("%s", exc)
            lost, lost_error = len(buffer), str(exc)
            for record in buffer:
                labels[record[2] or "valid"] += 1
            report.sent += lost
            buffer.clear()
        finally:
            failed, first_error = sink.close()
            report.elapsed_s = time.monotonic() - start
        report.failed = failed + lost
        report.first_error = lost_error or first_error
    return report


def render_summary(report: ProduceReport, console: Console, *, title: str,
                   bad_heading: str = "bad, by reason") -> None:
    """Print the end-of-run table: sent, valid vs bad by reason, duplicates, speed."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("target", report.target)
    for name, value in report.details.items():
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    table.add_row("records sent", f"{report.sent:,}")
    failed = f"[red]{report.failed:,}[/red]" if report.failed else "0"
    table.add_row("delivery failures", failed)
    table.add_row("valid", f"{report.valid:,}")
    table.add_row("  of which duplicates", f"{report.duplicates:,}")
    rejected = report.rejected
    table.add_row(bad_heading, f"{sum(rejected.values()):,}")
    by_reason: Counter[str] = Counter()
    fields: dict[str, list[str]] = {}
    for label, n in rejected.items():
        reason, _, name = label.partition(":")
        by_reason[reason] += n
        if name:
            fields.setdefault(reason, []).append(name)
    for reason, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])):
        names = fields.get(reason, [])
        # One field: name it as the quarantine does (reason:field); several: the reason alone.
        table.add_row(f"  {reason}:{names[0]}" if len(names) == 1 else f"  {reason}", f"{n:,}")
    table.add_row("elapsed", f"{report.elapsed_s:,.2f} s")
    table.add_row("throughput", f"{report.events_per_s:,.0f} events/s")
    if report.interrupted:
        table.add_row("[yellow]interrupted[/yellow]", "yes")
    console.print(table)
    if report.failed:
        log.error("%s of %s records were not delivered (first error: %s)",
                  f"{report.failed:,}", f"{report.sent:,}", report.first_error)
