"""``shopstream generate``: a synthetic store clickstream into Kafka, or into a JSON-lines file.

What the traffic looks like (store, sessions, conversion, bad records) is the
pure model in :mod:`pipelines.clickstream_model`; this module chooses the
times, bounds the run and sends (through :mod:`pipelines.producer`).

Time and pacing
    ``--rate R``
        Real time: records leave at R per second and ``event_time`` follows the
        wall clock, starting at ``--start-time`` (default: now).
    no ``--rate``
        As fast as possible; simulated event time advances at the config's
        nominal rate (:data:`~pipelines.clickstream_model.DEFAULT_NOMINAL_RATE`,
        1,000 events/s: a million events are about 17 minutes of store
        traffic). Without ``--start-time`` the run is backdated by its expected
        span (``count / nominal rate``, or ``--duration``) so that it ends
        about now: starting at now would put most of a large run more than the
        contract's 5 minutes in the future, and the stream would quarantine it.

Bulk loads
    An unpaced run of :data:`~pipelines.producer.BULK_THRESHOLD` records or more sends through
    :data:`~pipelines.producer.BULK_PROCESSES` producer processes
    (:class:`~pipelines.producer.ParallelKafkaSink`); each partition still
    gets exactly the records, in the same order, that one producer would send.

Bounds
    ``--count`` bounds the records sent (bad ones included); ``--duration`` bounds
    the event-time span in seconds (the wall-clock time when paced). At least
    one is required. Same seed and same options (with an explicit
    ``--start-time``) give byte-identical records, event ids included.

Examples
--------
::

    shopstream generate --count 1000000 --bad-fraction 0.01   # bulk load, ends about now
    shopstream generate --rate 500 --duration 600              # live traffic for ten minutes
    shopstream generate --count 1000 --start-time 2024-06-01T12:00:00Z --output events.jsonl
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from pipelines.cli import UserError
from pipelines.clickstream_model import ClickstreamModel, GeneratorConfig, Record, format_millis
from pipelines.producer import (
    BULK_PROCESSES,
    BULK_THRESHOLD,
    DeliveryError,
    ProduceReport,
    open_sink,
    produce,
    render_summary,
)
from pipelines.settings import Settings

__all__ = ["GeneratorConfig", "generate_records", "parse_start_time", "run_generate"]

log = logging.getLogger(__name__)



def parse_start_time(text: str) -> datetime:
    """``--start-time``: ISO-8601, UTC when it has no offset."""
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UserError(
            f"--start-time: expected an ISO-8601 time such as 2024-06-01T12:00:00Z, got {text!r}"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def generate_records(
    config: GeneratorConfig,
    *,
    start_ms: int,
    rate: float | None = None,
    count: int | None = None,
    duration: float | None = None,
) -> Iterator[Record]:
    """The bounded record stream of one run (pure: no clock, no I/O).

    Parameters
    ----------
    config
        Store, seed and bad fraction.
    start_ms
        Event time of the first record (epoch millis).
    rate
        Simulated events per second (default ``config.nominal_rate``).
    count, duration
        Stop after ``count`` records and/or when event time reaches
        ``start_ms + duration`` seconds.
    """
    return _bounded(ClickstreamModel(config, rate).records(start_ms), start_ms, count, duration)


def _bounded(records: Iterator[Record], start_ms: int, count: int | None,
             duration: float | None) -> Iterator[Record]:
    if duration is not None:
        end_ms = start_ms + duration * 1000.0
        records = itertools.takewhile(lambda r: r.time_ms < end_ms, records)
    if count is not None:
        records = itertools.islice(records, count)
    return records


def _start_ms(start_time: str | None, *, paced: bool, span_s: float) -> int:
    if start_time is not None:
        return int(parse_start_time(start_time).timestamp() * 1000)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return now_ms if paced else now_ms - int(span_s * 1000)


def run_generate(
    settings: Settings,
    config: GeneratorConfig,
    *,
    count: int | None = None,
    duration: float | None = None,
    rate: float | None = None,
    start_time: str | None = None,
    output: Path | None = None,
    console: Console | None = None,
) -> ProduceReport:
    """Generate and send; print progress (stderr) and a summary (``console``, default stdout).

    Returns
    -------
    ProduceReport
        Records sent, labels (valid / duplicate / intended rejection), speed.

    Raises
    ------
    UserError
        A missing bound, a bad ``--start-time``, an unreachable broker or
        records that were not delivered.
    """
    if count is None and duration is None:
        hint = " (with --rate it would run forever)" if rate else ""
        raise UserError(f"pass --count N and/or --duration SECONDS to bound the run{hint}")
    if rate is not None and rate <= 0:
        raise UserError(f"--rate must be positive, got {rate}")
    nominal = rate or config.nominal_rate
    span_s = min(
        count / nominal if count is not None else float("inf"),
        duration if duration is not None else float("inf"),
    )
    model = ClickstreamModel(config, nominal)  # before the clock starts: this takes a moment
    start_ms = _start_ms(start_time, paced=rate is not None, span_s=span_s)
    records = _bounded(model.records(start_ms), start_ms, count, duration)
    last_ms = [start_ms]

    def tracked() -> Iterator[Record]:
        for record in records:
            last_ms[0] = record.time_ms
            yield record

    expected = min(count or float("inf"), duration * nominal if duration is not None else float("inf"))
    processes = BULK_PROCESSES if output is None and rate is None and expected >= BULK_THRESHOLD else 1
    try:
        sink = open_sink(settings, output, processes=processes)
    except DeliveryError as exc:
        raise UserError(str(exc)) from exc
    mode = f"paced at {rate:,.0f} events/s" if rate else (
        f"as fast as possible (event time at {nominal:,.0f} events/s)"
    )
    report = ProduceReport(target=sink.description, details={"mode": mode, "seed": config.seed})
    log.info("generating into %s, %s", sink.description, mode)
    # Paced from "now": each record leaves when the wall clock reaches its event time.
    produce(tracked(), sink, report, pace=1.0 if rate else None, wall_clock=start_time is None,
            total=count, description="generate")
    report.details["event time"] = f"{format_millis(start_ms)} .. {format_millis(last_ms[0])}"
    render_summary(report, console or Console(), title="shopstream generate",
                   bad_heading="bad (intended rejection), by reason")
    if report.failed:
        raise UserError(
            f"{report.failed:,} of {report.sent:,} records were not delivered "
            f"(first error: {report.first_error})"
        )
    return report
