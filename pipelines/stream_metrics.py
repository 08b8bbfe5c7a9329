"""Operability of the streaming job: one INFO line per micro-batch and the figures behind it.

Two sources meet per batch:

* the ``foreachBatch`` function reports what only it knows (:class:`BatchStats`:
  quarantined and late rows, the event-time clock, freshness = online write
  time minus event time, p50 / p99 / max);
* a :class:`ProgressListener` (Spark's ``StreamingQueryListener``) reports what
  Spark measured (input rows, rows/s, batch duration, state rows, duplicates
  dropped).

:class:`MetricsRecorder` joins them by batch id, logs one line, and publishes:

* Redis hash :func:`features.online_keys.stream_progress_key` (the job owns it,
  rewrites it every batch; ``shopstream status`` reads it);
* ``<data_dir>/stream/progress.json`` (local data dir), the same figures;
* a Prometheus textfile (node-exporter textfile collector format), atomically
  replaced: ``stream_metrics_textfile`` or ``<data_dir>/stream/shopstream_stream.prom``
  (and, in Real-time Mode, the feed's ``shopstream_stream_rt.prom`` beside it).

Publishing never fails the job: an unreachable Redis costs a warning, not a batch.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from features.online_keys import stream_progress_key
from pipelines.settings import Settings

try:  # the listener base class; keep this module importable without pyspark
    from pyspark.sql.streaming import StreamingQueryListener as _ListenerBase
except ImportError:  # pragma: no cover
    _ListenerBase = object  # type: ignore[assignment,misc]

__all__ = [
    "BatchStats",
    "BatchMetrics",
    "MetricsRecorder",
    "ProgressListener",
    "progress_path",
    "textfile_path",
    "realtime_textfile_path",
    "realtime_prometheus_text",
    "write_textfile",
    "read_progress",
    "format_batch_line",
    "format_epoch_line",
    "REALTIME_QUERY_NAME",
    "prometheus_text",
    "StreamHealth",
    "stream_health",
    "caught_up_of",
]

log = logging.getLogger(__name__)

REALTIME_QUERY_NAME = "shopstream-online-rtm"
"""The Real-time Mode query's name (:mod:`pipelines.streaming.realtime`): its epochs
get a line of their own (:func:`format_epoch_line`), not the micro-batch line."""

PREFIX = "shopstream_stream"

HEARTBEAT_SECONDS = 5.0
"""How often a running job stamps ``job_heartbeat`` (and ``job_caught_up``) in the
progress hash. Batches alone cannot tell an idle job from a dead one: an idle stream
publishes no batch, and a SIGKILLed one cannot say it stopped."""
EVICTION_WARN_SHARE = 0.25
"""Warn when the dedup's eviction pass takes more than this share of a batch's task time
(its duration times the dedup's tasks), and at least :data:`EVICTION_WARN_MIN_SECONDS`:
the pass reads every state row, so it is the part of a batch that grows with
``rate x stream_dedup_retention_seconds`` and not with the batch."""
EVICTION_WARN_MIN_SECONDS = 1.0
EVICTION_WARN_EVERY_SECONDS = 600.0
"""At most one such warning per this many seconds: the state does not shrink by itself."""
HEARTBEAT_STALE_SECONDS = 30.0
"""A job whose state says ``running`` but whose heartbeat is older than this was killed
(``kill -9``, the OOM killer, a lost machine) or hangs."""


@dataclass(frozen=True)
class BatchStats:
    """What ``foreachBatch`` measured for one batch."""

    batch_id: int
    rows: int
    valid: int
    quarantined: int
    late: int
    on_time: int
    clock_us: int | None
    freshness_s: tuple[float, float, float] | None
    """(p50, p99, max) of online write time minus event time, over the on-time events."""
    foreach_seconds: float
    read_seconds: float | None = None
    """Kafka read, validation and dedup, up to the batch held in memory (its first Spark job)."""
    online_seconds: float | None = None
    """The online path (tiles, features, Redis); ``None`` when it did not run."""
    offline_seconds: float | None = None
    """The Parquet sinks, from their start until both ended (they run beside the online path)."""
    spilled_bytes: int = 0
    """Bytes of the batch's in-memory copy that did not fit the JVM's storage memory and went
    to disk (:func:`pipelines.stream_state.spilled_bytes`)."""


@dataclass(frozen=True)
class BatchMetrics:
    """One batch's figures, as published (Spark's progress joined with :class:`BatchStats`)."""

    batch_id: int
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    quarantined: int
    late: int
    duplicates_dropped: int
    on_time: int
    freshness_p50_s: float | None
    freshness_p99_s: float | None
    freshness_max_s: float | None
    clock: str | None
    state_rows: int
    timestamp: str
    mode: str = "microbatch"
    read_s: float | None = None
    online_s: float | None = None
    offline_s: float | None = None
    """Where the batch's time went (:class:`BatchStats`): which part to look at when a
    batch takes longer than the trigger."""
    state_update_s: float | None = None
    """Task time of the dedup's rows (Spark's ``allUpdatesTimeMs``, summed over its tasks):
    from its first row to its last, so it covers the shuffle read, each id's lookup and
    store, and what the stage does with a row after (the batch's in-memory copy)."""
    state_evict_s: float | None = None
    """Task time the dedup spent expiring ids: Spark's eviction pass (``allRemovalsTimeMs``)
    or the ``bucketed`` operator's due timers (``timerProcessingTimeMs``). Spark's
    ``dropDuplicatesWithinWatermark`` reads every state row every batch to find the
    expired ones, so with it this grows with :attr:`state_rows`, not with the batch: the
    figure that says when ``stream_dedup_retention_seconds`` costs more than it should.
    The ``bucketed`` operator's grows with the ids that expire."""
    state_rows_removed: int = 0
    """State rows expired from the dedup state by this batch, as Spark counts them (an id
    each with Spark's operator)."""
    spilled_bytes: int = 0
    """Bytes of the batch's in-memory copy written to disk instead (:class:`BatchStats`):
    each sink then reads them back and deserializes them, so a batch too large for the
    driver's memory runs slower than two batches half its size."""

    def as_fields(self) -> dict[str, str]:
        return {k: "" if v is None else str(v) for k, v in asdict(self).items()}


@dataclass
class Totals:
    batches: int = 0
    input_rows: int = 0
    quarantined: int = 0
    late: int = 0
    duplicates_dropped: int = 0
    on_time: int = 0


def progress_path(settings: Settings) -> Path | None:
    """``<data_dir>/stream/progress.json`` for a local data dir, else ``None``."""
    if not settings.is_local_data_dir:
        return None
    return Path(settings.data_path("stream", "progress.json"))


def textfile_path(settings: Settings) -> Path | None:
    """The Prometheus textfile, or ``None`` (remote data dir and no explicit setting)."""
    if settings.stream_metrics_textfile:
        return Path(settings.stream_metrics_textfile)
    if not settings.is_local_data_dir:
        return None
    return Path(settings.data_path("stream", "shopstream_stream.prom"))


def _sample(value: float) -> str:
    """A sample value, exact: ``:g`` kept six digits and put epoch seconds off by hours."""
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)


def realtime_textfile_path(settings: Settings, feed: int = 0) -> Path | None:
    """The Real-time feed's textfile, beside the job's (``<name>_rt.prom``, feed #k's
    ``<name>_rt<k>.prom`` from the second on: the textfile collector reads every ``*.prom``
    of its directory); ``None`` when there is none."""
    path = textfile_path(settings)
    return None if path is None else path.with_name(f"{path.stem}_rt{feed or ''}.prom")


def realtime_fields(fields: Mapping[str, str], feed: int) -> dict[str, str]:
    """Feed #``feed``'s progress-hash fields: ``rt_...`` for the first, ``rt<k>_...`` for
    the others, so feeds side by side keep their own figures."""
    if not feed:
        return dict(fields)
    return {f"rt{feed}_{name.removeprefix('rt_')}": value for name, value in fields.items()}


def realtime_feed_prefixes(progress: Mapping[str, Any]) -> list[str]:
    """The field prefixes of the feeds with figures in ``progress`` (``rt_``, ``rt1_``...)."""
    return sorted({name[:name.index("_") + 1] for name in progress
                   if re.fullmatch(r"rt\d*_updated", name)}, key=lambda p: (len(p), p))


def write_textfile(path: Path, text: str) -> None:
    """Replace ``path`` atomically (the collector never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def realtime_prometheus_text(parts: Mapping[str, tuple[float, float, float]], tiles: int,
                             at: datetime, feed: int = 0,
                             top: Mapping[str, float] | None = None) -> str:
    """The Real-time feed's figures since its last report: freshness per ``part``
    (``total``, ``query``, ``feed``) as p50 / p99 / max, the tiles written, and the top
    writes (``top``: ``writes``, ``write_p50_s``, ``write_max_s``, ``lag_max_s``, from the
    feed that keeps the top lists); every sample labelled with the feed's index
    (``feed="0"``...), as feeds side by side each write a file."""
    name = f"{PREFIX}_rt_freshness_seconds"
    lines = [f"# HELP {name} Real-time freshness over the tiles since the last report: total "
             "(newest event -> in Redis), query (-> the tile sent), feed (sent -> in Redis).",
             f"# TYPE {name} gauge"]
    for part, values in parts.items():
        for quantile, value in zip(("0.5", "0.99", "1"), values, strict=True):
            lines.append(f'{name}{{feed="{feed}",part="{part}",quantile="{quantile}"}} '
                         f'{_sample(value)}')
    for metric, help_, value in (
        ("rt_tiles_written", "Tiles the feed wrote since its last report.", float(tiles)),
        ("rt_last_report_timestamp_seconds", "When the feed last reported.", at.timestamp()),
    ):
        lines += [f"# HELP {PREFIX}_{metric} {help_}", f"# TYPE {PREFIX}_{metric} gauge",
                  f'{PREFIX}_{metric}{{feed="{feed}"}} {_sample(value)}']
    top = top or {}
    if "writes" in top:
        name = f"{PREFIX}_rt_top_write_seconds"
        lines += [f"# HELP {name} Time of a top-lists write since the last report.",
                  f"# TYPE {name} gauge"]
        lines += [f'{name}{{feed="{feed}",quantile="{q}"}} {_sample(top[key])}'
                  for q, key in (("0.5", "write_p50_s"), ("1", "write_max_s"))]
    for metric, key, help_ in (
        ("rt_top_writes", "writes", "Top-lists writes since the last report."),
        ("rt_top_lag_max_seconds", "lag_max_s",
         "Longest a sales change waited for the top lists since the last report."),
    ):
        if key in top:
            lines += [f"# HELP {PREFIX}_{metric} {help_}", f"# TYPE {PREFIX}_{metric} gauge",
                      f'{PREFIX}_{metric}{{feed="{feed}"}} {_sample(top[key])}']
    return "\n".join(lines) + "\n"


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def format_batch_line(m: BatchMetrics) -> str:
    """The one INFO line per batch."""
    fresh = (f"freshness p50 {_fmt_s(m.freshness_p50_s)} p99 {_fmt_s(m.freshness_p99_s)} "
             f"max {_fmt_s(m.freshness_max_s)}")
    return (f"batch {m.batch_id}: {m.input_rows} rows in {m.batch_duration_ms / 1000:.2f}s "
            f"({m.processed_rows_per_second:,.0f} rows/s), {m.on_time} on time, "
            f"{m.quarantined} quarantined ({m.late} late), {m.duplicates_dropped} duplicates, "
            f"{fresh}, clock {m.clock or '-'}{_phases(m)}{_state(m)}{_spill(m)}")


def _spill(m: BatchMetrics) -> str:
    """``; spilled 312 MB to disk`` when part of the batch's copy did not fit in memory."""
    return f"; spilled {m.spilled_bytes / 2**20:,.0f} MB to disk" if m.spilled_bytes else ""


def format_epoch_line(progress: Mapping[str, Any]) -> str:
    """The one INFO line per Real-time epoch: its rows, its length, and Spark's phases
    (``durationMs`` without the epoch itself, ``addBatch``) largest first, so time spent
    between two epochs, when nothing reaches the tiles, shows by name."""
    durations = {k: int(v) for k, v in (progress.get("durationMs") or {}).items()}
    epoch_ms = durations.pop("triggerExecution", 0)
    running_ms = durations.pop("addBatch", 0)
    phases = ", ".join(f"{name} {ms / 1000:.2f}s" for name, ms in
                       sorted(durations.items(), key=lambda kv: -kv[1]) if ms)
    # the state stores commit as the epoch's tasks end, inside ``addBatch``: a part of the
    # time past the epoch's length that the phases above cannot show
    commits = ", ".join(
        f"{op.get('operatorName', '?')} {int(op['commitTimeMs']) / 1000:.2f}s"
        for op in progress.get("stateOperators") or [] if int(op.get("commitTimeMs") or 0))
    return (f"real-time epoch {progress.get('batchId')}: {int(progress.get('numInputRows', 0)):,} "
            f"rows in {epoch_ms / 1000:.1f}s (running {running_ms / 1000:.1f}s"
            + (f"; {phases}" if phases else "")
            + (f"; state commits {commits}" if commits else "") + ")")


def _task_seconds(operators: list[dict[str, Any]], key: str) -> float | None:
    """A timing of the state operators, summed over them, in seconds (``None``: not reported)."""
    values = [int(op[key]) for op in operators if op.get(key) is not None]
    return sum(values) / 1000 if values else None


def _evict_seconds(operators: list[dict[str, Any]]) -> float | None:
    """Task time spent expiring state: Spark's eviction pass, or ``transformWithState``'s
    due timers (a custom metric), summed over the operators (``None``: not reported)."""
    timers = [op["customMetrics"] for op in operators if op.get("customMetrics")]
    parts = [s for s in (_task_seconds(operators, "allRemovalsTimeMs"),
                         _task_seconds(timers, "timerProcessingTimeMs")) if s is not None]
    return sum(parts) if parts else None


def _state(m: BatchMetrics) -> str:
    """``; dedup state 1,198,614 rows (update 1.28s, evict 0.34s of task time)``."""
    if not m.state_rows and m.state_evict_s is None:
        return ""
    parts = [f"{name} {value:.2f}s" for name, value in
             (("update", m.state_update_s), ("evict", m.state_evict_s)) if value is not None]
    timing = f" ({', '.join(parts)} of task time)" if parts else ""
    return f"; dedup state {m.state_rows:,} rows{timing}"


def _phases(m: BatchMetrics) -> str:
    """``; read+validate 4.30s, online 3.60s, Parquet 1.20s`` (the parts that ran)."""
    parts = [f"{name} {value:.2f}s" for name, value in
             (("read+validate", m.read_s), ("online", m.online_s), ("Parquet", m.offline_s))
             if value is not None]
    return "; " + ", ".join(parts) if parts else ""


def prometheus_text(m: BatchMetrics, totals: Totals, heartbeat: datetime | None = None,
                    caught_up: bool | None = None) -> str:
    """The node-exporter textfile for the latest batch and the run's totals; with the job's
    latest heartbeat, which an alert compares with ``time()`` (an idle job publishes no
    batch, a killed one nothing at all)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {PREFIX}_{name} {help_}")
        lines.append(f"# TYPE {PREFIX}_{name} {kind}")
        for labels, value in samples:
            lines.append(f"{PREFIX}_{name}{labels} {_sample(value)}")

    metric("batch_id", "gauge", "Id of the latest micro-batch.", [("", m.batch_id)])
    metric("input_rows", "gauge", "Rows read by the latest batch.", [("", m.input_rows)])
    metric("input_rows_per_second", "gauge", "Input rate of the latest batch.",
           [("", m.input_rows_per_second)])
    metric("processed_rows_per_second", "gauge", "Processing rate of the latest batch.",
           [("", m.processed_rows_per_second)])
    metric("batch_duration_seconds", "gauge", "Duration of the latest batch.",
           [("", m.batch_duration_ms / 1000)])
    fresh = [(f'{{quantile="{q}"}}', v) for q, v in
             (("0.5", m.freshness_p50_s), ("0.99", m.freshness_p99_s), ("1", m.freshness_max_s))
             if v is not None]
    if fresh:
        metric("freshness_seconds", "gauge",
               "Online write time minus event time over the latest batch's events.", fresh)
    phases = [(f'{{phase="{name}"}}', v) for name, v in
              (("read", m.read_s), ("online", m.online_s), ("offline", m.offline_s))
              if v is not None]
    if phases:
        metric("batch_phase_seconds", "gauge",
               "Parts of the latest batch: read (Kafka, validation, dedup), online (Redis), "
               "offline (Parquet, beside online).", phases)
    metric("state_rows", "gauge", "Rows in the dedup state store.", [("", m.state_rows)])
    state = [(f'{{part="{name}"}}', v) for name, v in
             (("update", m.state_update_s), ("evict", m.state_evict_s)) if v is not None]
    if state:
        metric("state_task_seconds", "gauge",
               "Task time of the latest batch's dedup: update (its rows, with the stage's "
               "shuffle read and in-memory copy), evict (a pass over every state row).", state)
    metric("state_rows_removed", "gauge", "State rows the latest batch expired from the dedup state.",
           [("", m.state_rows_removed)])
    metric("batch_spilled_bytes", "gauge",
           "Bytes of the latest batch's in-memory copy that went to disk (driver memory too "
           "small for the batch).", [("", m.spilled_bytes)])
    for name, value, help_ in (
        ("batches_total", totals.batches, "Micro-batches completed by this run."),
        ("input_rows_total", totals.input_rows, "Rows read by this run."),
        ("quarantined_rows_total", totals.quarantined, "Rows sent to the quarantine (incl. late)."),
        ("late_rows_total", totals.late, "Valid events later than the allowed lateness."),
        ("duplicate_rows_total", totals.duplicates_dropped, "Duplicate events dropped."),
        ("on_time_rows_total", totals.on_time, "Events written to the stores."),
    ):
        metric(name, "counter", help_, [("", value)])
    if m.clock:
        clock = datetime.fromisoformat(m.clock).timestamp()
        metric("event_time_clock_seconds", "gauge", "Max event time accepted (epoch s).",
               [("", clock)])
    metric("last_batch_timestamp_seconds", "gauge", "When the latest batch was published.",
           [("", datetime.fromisoformat(m.timestamp).timestamp())])
    if heartbeat is not None:
        metric("heartbeat_timestamp_seconds", "gauge",
               f"When the running job last stamped its heartbeat (every {HEARTBEAT_SECONDS:.0f} s).",
               [("", heartbeat.timestamp())])
    if caught_up is not None:
        metric("caught_up", "gauge", "1 when no input was waiting at the latest heartbeat.",
               [("", 1.0 if caught_up else 0.0)])
    return "\n".join(lines) + "\n"


def read_progress(settings: Settings, client: Any | None = None, *,
                  redis_up: bool = True) -> dict[str, str]:
    """The latest published figures: from Redis (unless known to be down: its client's
    retries take seconds), else from the JSON file; ``{}`` if none."""
    if redis_up:
        try:
            if client is None:
                from pipelines.connections import redis_client

                client = redis_client(settings, timeout_ms=1000)
            raw = client.hgetall(stream_progress_key())
            if raw:
                return {k.decode(): v.decode() for k, v in raw.items()}
        except Exception as exc:  # noqa: BLE001 - status must work with Redis down
            log.debug("stream progress not readable from Redis: %s", exc)
    path = progress_path(settings)
    if path is not None and path.exists():
        doc = json.loads(path.read_text())
        return {k: "" if v is None else str(v) for k, v in doc.get("latest", {}).items()}
    return {}


def _offsets(value: Any) -> Any:
    """A source offset as Spark reports it (JSON text or already parsed), comparable."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def caught_up_of(progress: Mapping[str, Any] | None) -> bool | None:
    """Whether the latest micro-batch read all the input there was: each source's
    ``endOffset`` (what the batch read up to) is its ``latestOffset`` (what was there when
    it was planned), so nothing was left for later by ``maxOffsetsPerTrigger``. At a
    steady rate new input always arrives during a batch; that is keeping up, not falling
    behind. ``None`` before a batch, or when a source does not report its latest offset."""
    sources = (progress or {}).get("sources") or []
    if not sources:
        return None
    for source in sources:
        latest, end = source.get("latestOffset"), source.get("endOffset")
        if latest is None or end is None:
            return None
        if _offsets(latest) != _offsets(end):
            return False
    return True


@dataclass(frozen=True)
class StreamHealth:
    """``shopstream status``'s verdict on the streaming job, read from its progress hash.

    ``state``: ``none`` (no job has published anything), ``running``, ``stopped`` (a
    clean stop: a signal, ``--until-idle``, a timeout), ``failed`` (the job said why),
    ``silent`` (it says ``running`` but its heartbeat stopped: killed or hung),
    ``unknown`` (batch figures without a state: the progress file, read while Redis is down).
    """

    state: Literal["none", "running", "stopped", "failed", "silent", "unknown"]
    message: str

    @property
    def healthy(self) -> bool:
        """False when an operator has to act: the job failed, or died without a word."""
        return self.state not in ("failed", "silent")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _ago(then: datetime, now: datetime) -> str:
    seconds = max((now - then).total_seconds(), 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def stream_health(progress: Mapping[str, str], now: datetime,
                  stale_after_s: float = HEARTBEAT_STALE_SECONDS) -> StreamHealth:
    """The job's state in one sentence, from what it published (:func:`read_progress`).

    A job stamps a heartbeat every :data:`HEARTBEAT_SECONDS` while it runs, so a
    ``running`` state with an old heartbeat (or none since a start longer ago than
    ``stale_after_s``) means the process is gone or stuck, which the state alone
    cannot show. The rest says where it is: catching up or caught up, its last batch,
    its freshness, and in Real-time Mode the tile feed's.
    """
    state = progress.get("job_state", "")
    if not progress:
        return StreamHealth("none", "no streaming job has published progress yet")
    since = _parse_time(progress.get("job_state_since"))
    since_text = f" ({_ago(since, now)})" if since else ""
    if state.startswith("failed"):
        return StreamHealth("failed", f"{state}{since_text}; see the job's log, then start it "
                                      "again: it resumes from its checkpoint")
    if state.startswith("stopped"):
        return StreamHealth("stopped", f"{state}{since_text}")
    parts: list[str] = []
    if state == "running":
        beat = _parse_time(progress.get("job_heartbeat"))
        if beat is not None and since is not None and beat < since:
            beat = None  # an earlier run's
        last_sign = beat or since
        if last_sign is None or (now - last_sign).total_seconds() > stale_after_s:
            heard = (f"its last heartbeat was {_ago(beat, now)}" if beat else
                     f"it has sent no heartbeat since it started{since_text}")
            return StreamHealth(
                "silent", f"its state says running, but {heard}: the process was killed "
                "(kill -9, out of memory) or hangs. Start it again: it resumes from its "
                "checkpoint, with nothing lost or counted twice")
        caught_up = progress.get("job_caught_up")
        parts.append("running" + (", caught up" if caught_up == "yes" else
                                  ", catching up (its last batch left input for the next)" if caught_up == "no" else ""))
    else:  # only batch figures: the progress file, read while Redis is down
        parts.append("state unknown (Redis unreachable?)")
    mode = progress.get("mode")
    if mode:
        parts.append(f"mode {mode}")
    stamp = _parse_time(progress.get("timestamp"))
    if progress.get("batch_id") and stamp:
        batch = f"last batch {progress['batch_id']} {_ago(stamp, now)}"
        if progress.get("freshness_p99_s"):
            batch += f", freshness p99 {float(progress['freshness_p99_s']):.2f} s"
        parts.append(batch)
    feeds = []  # (p99, prefix, stamp) of each feed with figures of this run
    for prefix in realtime_feed_prefixes(progress):
        rt_stamp = _parse_time(progress.get(f"{prefix}updated"))
        p99 = progress.get(f"{prefix}freshness_p99_s")
        if rt_stamp and p99 and (since is None or rt_stamp >= since):
            feeds.append((float(p99), prefix, rt_stamp))
    if feeds:  # the worst feed's: a probe's freshness is that of the feed of its key
        p99, prefix, rt_stamp = max(feeds, key=lambda f: f[0])
        which = "" if len(feeds) == 1 else f"feed #{prefix[2:-1] or 0} of {len(feeds)}, "
        parts.append(f"real-time tiles p99 {p99:.2f} s ({which}query "
                     f"{float(progress.get(f'{prefix}query_p99_s') or 0):.2f}, feed "
                     f"{float(progress.get(f'{prefix}feed_p99_s') or 0):.2f}; "
                     f"{_ago(rt_stamp, now)})")
        lag = progress.get("rt_top_lag_max_s")  # the first feed keeps the top lists
        if lag and any(prefix == "rt_" for _, prefix, _ in feeds):
            parts.append(f"top lists at most {float(lag):.2f} s behind the sales tiles (a "
                         f"write {float(progress.get('rt_top_write_max_s') or 0):.2f} s at most)")
    escalated = _parse_time(progress.get("sinks_escalated"))
    if escalated and (since is None or escalated >= since):
        parts.append(f"Parquet sinks given the driver's priority {_ago(escalated, now)} "
                     f"({progress.get('sinks_escalation_why') or 'they had stalled'}: the cores "
                     "are full, and the online path's freshness pays for the offline store's)")
    if progress.get("clock"):
        parts.append(f"features as of {progress['clock']}")
    return StreamHealth("running" if state == "running" else "unknown", "; ".join(parts))


@dataclass
class MetricsRecorder:
    """Joins per-batch stats with Spark's progress and publishes them (thread-safe)."""

    settings: Settings
    mode: str = "microbatch"
    history: deque[BatchMetrics] = field(default_factory=lambda: deque(maxlen=10_000))
    totals: Totals = field(default_factory=Totals)
    _stats: dict[int, BatchStats] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _client: Any = None
    _last_beat: float = float("-inf")
    _beat: tuple[datetime, bool | None] | None = None
    _files_lock: threading.Lock = field(default_factory=threading.Lock)
    """The listener's thread (batches) and the job's (heartbeats) write the same files."""
    _last_eviction_warning: float = float("-inf")
    _last_spill_warning: float = float("-inf")

    def _warn_if_eviction_dominates(self, m: BatchMetrics, operators: list[dict[str, Any]]) -> None:
        """One WARNING (per :data:`EVICTION_WARN_EVERY_SECONDS`) when the dedup's pass over
        its state took :data:`EVICTION_WARN_SHARE` of the batch: the operator's cue to
        shorten the retention or let batches grow, before batches fall behind the trigger."""
        evict = m.state_evict_s
        if self.settings.stream_dedup != "spark":
            return  # the bucketed operator reads only what expires: no pass over the state
        tasks = max((int(op.get("numShufflePartitions") or 0) for op in operators), default=0)
        if evict is None or evict < EVICTION_WARN_MIN_SECONDS or not tasks or not m.batch_duration_ms:
            return
        share = evict / (m.batch_duration_ms / 1000 * tasks)
        now = time.monotonic()
        if share < EVICTION_WARN_SHARE or now - self._last_eviction_warning < EVICTION_WARN_EVERY_SECONDS:
            return
        self._last_eviction_warning = now
        log.warning(
            "batch %d: the dedup's eviction pass read all %s state rows in %.1fs of task time, "
            "%.0f%% of the batch's: it grows with the input rate x "
            "SHOPSTREAM_STREAM_DEDUP_RETENTION_SECONDS (%d s). SHOPSTREAM_STREAM_DEDUP=bucketed "
            "(on a new checkpoint) reads only what expires; a shorter retention, or larger "
            "batches (SHOPSTREAM_STREAM_MAX_OFFSETS_PER_TRIGGER), make it a smaller part",
            m.batch_id, f"{m.state_rows:,}", evict, 100 * share,
            self.settings.stream_dedup_retention_seconds)

    def _warn_if_spilled(self, m: BatchMetrics) -> None:
        """One WARNING (per :data:`EVICTION_WARN_EVERY_SECONDS`) when a batch's copy went to
        disk in part, naming the two settings that fix it; each batch's line says how much."""
        now = time.monotonic()
        if not m.spilled_bytes or now - self._last_spill_warning < EVICTION_WARN_EVERY_SECONDS:
            return
        self._last_spill_warning = now
        log.warning(
            "batch %d: %s MB of its rows did not fit in the driver's memory and went to disk, "
            "to be read back by every sink: raise SHOPSTREAM_SPARK_DRIVER_MEMORY (now %s; the "
            "executors' memory on a cluster) or lower SHOPSTREAM_STREAM_MAX_OFFSETS_PER_TRIGGER "
            "(now %s)", m.batch_id, f"{m.spilled_bytes / 2**20:,.0f}",
            self.settings.spark_driver_memory, f"{self.settings.stream_max_offsets_per_trigger:,}")

    def record_batch(self, stats: BatchStats) -> None:
        """Called by ``foreachBatch`` at the end of a batch."""
        with self._lock:
            self._stats[stats.batch_id] = stats

    def batch_stats(self) -> list[BatchStats]:
        with self._lock:
            return [self._stats[k] for k in sorted(self._stats)]

    def on_progress(self, progress: dict[str, Any]) -> BatchMetrics | None:
        """Called by the listener with ``StreamingQueryProgress.json`` as a dict."""
        if progress.get("name") == REALTIME_QUERY_NAME:
            log.info(format_epoch_line(progress))
            return None
        batch_id = int(progress.get("batchId", -1))
        with self._lock:
            stats = self._stats.get(batch_id)
        if stats is None:
            return None  # a no-data batch that foreachBatch never saw, or another query
        operators = progress.get("stateOperators") or []
        state_rows = sum(int(op.get("numRowsTotal", 0)) for op in operators)
        input_rows = int(progress.get("numInputRows", stats.rows))
        # the source's rows minus those that reached foreachBatch: what the dedup dropped
        duplicates = max(input_rows - stats.rows, 0)
        fresh = stats.freshness_s or (None, None, None)
        clock = (datetime.fromtimestamp(stats.clock_us / 1e6, tz=UTC).isoformat()
                 if stats.clock_us is not None else None)
        metrics = BatchMetrics(
            batch_id=batch_id,
            input_rows=input_rows,
            input_rows_per_second=float(progress.get("inputRowsPerSecond") or 0.0),
            processed_rows_per_second=float(progress.get("processedRowsPerSecond") or 0.0),
            batch_duration_ms=int(progress.get("batchDuration", 0)),
            quarantined=stats.quarantined,
            late=stats.late,
            duplicates_dropped=duplicates,
            on_time=stats.on_time,
            freshness_p50_s=fresh[0],
            freshness_p99_s=fresh[1],
            freshness_max_s=fresh[2],
            clock=clock,
            state_rows=state_rows,
            timestamp=datetime.now(UTC).isoformat(),
            mode=self.mode,
            read_s=stats.read_seconds,
            online_s=stats.online_seconds,
            offline_s=stats.offline_seconds,
            state_update_s=_task_seconds(operators, "allUpdatesTimeMs"),
            state_evict_s=_evict_seconds(operators),
            state_rows_removed=sum(int(op.get("numRowsRemoved") or 0) for op in operators),
            spilled_bytes=stats.spilled_bytes,
        )
        with self._lock:
            self.history.append(metrics)
            self._stats.pop(batch_id, None)
            t = self.totals
            t.batches += 1
            t.input_rows += metrics.input_rows
            t.quarantined += metrics.quarantined
            t.late += metrics.late
            t.duplicates_dropped += metrics.duplicates_dropped
            t.on_time += metrics.on_time
        log.info(format_batch_line(metrics))
        self._warn_if_eviction_dominates(metrics, operators)
        self._warn_if_spilled(metrics)
        self.publish(metrics)
        return metrics

    def latest(self) -> BatchMetrics | None:
        with self._lock:
            return self.history[-1] if self.history else None

    # -- publishing
    def publish_state(self, state: str) -> None:
        """The job's state in the progress hash, for ``shopstream status``: ``running``
        from the start of its query, then why it stopped (``stopped: SIGTERM``,
        ``stopped: idle``, ``failed: ...``). A job killed with SIGKILL cannot say so:
        its state stays ``running`` with an old ``job_state_since`` and ``timestamp``."""
        self._hset({"job_state": state, "job_state_since": datetime.now(UTC).isoformat()})

    def publish_sinks_escalation(self, why: str) -> None:
        """Real-time Mode's Parquet sinks' process was given the driver's priority after a
        stall (``pipelines.streaming.offline_process``): for ``shopstream status``."""
        self._hset({"sinks_escalated": datetime.now(UTC).isoformat(), "sinks_escalation_why": why})

    def heartbeat(self, caught_up: Callable[[], bool | None] | None = None) -> None:
        """Stamp ``job_heartbeat`` (and ``job_caught_up``: the last batch read all the input
        there was) at most every :data:`HEARTBEAT_SECONDS`; called from the job's wait loop,
        so it stops when the process does (:func:`stream_health`). ``caught_up`` is asked
        only when due (see :func:`caught_up_of`); ``None`` when the job cannot tell."""
        now = time.monotonic()
        if now - self._last_beat < HEARTBEAT_SECONDS:
            return
        self._last_beat = now
        at = datetime.now(UTC)
        up = caught_up() if caught_up is not None else None
        # "": not known (Real-time Mode), and not an earlier run's answer either
        fields = {"job_heartbeat": at.isoformat(),
                  "job_caught_up": "" if up is None else "yes" if up else "no"}
        self._beat = (at, up)
        self._hset(fields, quiet=True)  # a Redis outage is the batches' to report
        latest, prom = self.latest(), textfile_path(self.settings)
        if latest is not None and prom is not None:
            try:
                with self._files_lock:
                    write_textfile(prom, prometheus_text(latest, self.totals, at, up))
            except OSError as exc:
                log.warning("stream metrics: file write failed: %s", exc)
        self._last_beat = time.monotonic()  # from its end: a slow Redis cannot make each call one

    def _hset(self, fields: dict[str, str], quiet: bool = False) -> None:
        try:
            if self._client is None:
                from pipelines.connections import redis_client

                self._client = redis_client(self.settings, timeout_ms=2000)
            self._client.hset(stream_progress_key(), mapping=fields)
        except Exception as exc:  # noqa: BLE001 - metrics never fail the job
            (log.debug if quiet else log.warning)("stream metrics: Redis write failed: %s", exc)
            self._client = None

    def publish(self, m: BatchMetrics) -> None:
        fields = m.as_fields()
        fields.update({f"total_{k}": str(v) for k, v in asdict(self.totals).items()})
        self._hset(fields)
        try:
            with self._files_lock:
                self._write_files(m)
        except OSError as exc:
            log.warning("stream metrics: file write failed: %s", exc)

    def _write_files(self, m: BatchMetrics) -> None:
        path = progress_path(self.settings)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"latest": asdict(m), "totals": asdict(self.totals)}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=2))
            tmp.replace(path)
        prom = textfile_path(self.settings)
        if prom is not None:
            beat, up = self._beat if self._beat is not None else (None, None)
            write_textfile(prom, prometheus_text(m, self.totals, beat, up))

    def flush(self) -> None:
        """Close the Redis client (the latest figures are already published)."""
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


class ProgressListener(_ListenerBase):  # type: ignore[misc,valid-type]
    """Spark's ``StreamingQueryListener``, forwarding each batch's progress to the recorder.

    Spark calls it through :class:`_JsonProgressBridge`, which takes only the progress
    JSON from the JVM, instead of PySpark's own bridge, which rebuilds the whole
    progress object call by call (see there): ``onQueryProgress`` gets that JSON text,
    the other ``on*`` methods a small dict (``id``, and ``name`` or ``exception``).
    """

    def __init__(self, recorder: MetricsRecorder, query_names: tuple[str, ...] | None = None,
                 on_event: Callable[[Mapping[str, Any] | None], None] | None = None) -> None:
        self.recorder = recorder
        self.query_names = query_names
        self.on_event = on_event
        """Called on each progress event with the progress, and on each idle event with
        ``None``: the query is alive and getting CPU (Real-time Mode's Parquet sinks'
        pulse, ``pipelines.streaming.offline_process``)."""
        self._terminated: set[str] = set()
        self._ended = threading.Condition()

    def wait_terminated(self, query_id: str, timeout: float = 10.0) -> bool:
        """Wait until Spark's listener bus delivered the end of query ``query_id``.

        The bus is asynchronous: a query can end before the progress of its last batch
        reached this listener, and removing the listener then loses that batch's figures
        (seen: an available-now run's history came back empty). The bus delivers a
        query's events in order, so once its end is here, so is all its progress.
        Returns whether it came within ``timeout`` seconds.
        """
        with self._ended:
            return self._ended.wait_for(lambda: query_id in self._terminated, timeout)

    @property
    def _jlistener(self) -> Any:
        """What ``spark.streams.addListener`` registers in the JVM (PySpark's hook)."""
        if getattr(self, "_jbridge", None) is None:
            from pyspark import SparkContext

            jvm = SparkContext._jvm
            assert jvm is not None
            wrapper = getattr(jvm, "org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper")
            self._jbridge = wrapper(_JsonProgressBridge(self))
        return self._jbridge

    def onQueryStarted(self, event: Any) -> None:
        log.debug("query started: %s (%s)", event.get("name"), event.get("id"))

    def _pulse(self, progress: Mapping[str, Any] | None) -> None:
        if self.on_event is not None:
            try:
                self.on_event(progress)
            except Exception:  # noqa: BLE001 - a listener must not break the query
                log.exception("stream metrics: the event hook failed")

    def onQueryProgress(self, event: Any) -> None:
        try:
            progress = json.loads(event)
        except ValueError:
            log.exception("stream metrics: a progress that is not JSON")
            self._pulse({})
            return
        self._pulse(progress)
        try:
            if self.query_names and progress.get("name") not in self.query_names:
                return
            self.recorder.on_progress(progress)
        except Exception:  # noqa: BLE001 - a listener must not break the query
            log.exception("stream metrics: progress handling failed")

    def onQueryIdle(self, event: Any) -> None:
        self._pulse(None)

    def onQueryTerminated(self, event: Any) -> None:
        if event.get("exception"):
            log.error("query %s terminated: %s", event.get("id"),
                      event["exception"].splitlines()[0])
        with self._ended:
            self._terminated.add(str(event.get("id")))
            self._ended.notify_all()


class _JsonProgressBridge:
    """The Py4J callback Spark's listener bus calls: hands each progress on as its JSON.

    PySpark's bridge converts every event into Python objects field by field: dozens of
    JVM round trips, and each Java map or list it walks ends in an exception that
    PySpark translates with more lookups -- about 20 ms per map, 0.1-0.2 s of CPU per
    micro-batch at 2 cores, the same whether the batch held 10 events or 10,000. One
    ``progress().json()`` call carries all of it.
    """

    def __init__(self, listener: ProgressListener) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        self.listener.onQueryStarted({"id": jevent.id().toString(), "name": jevent.name()})

    def onQueryProgress(self, jevent: Any) -> None:
        self.listener.onQueryProgress(jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:
        self.listener.onQueryIdle({"id": jevent.id().toString()})

    def onQueryTerminated(self, jevent: Any) -> None:
        exception = jevent.exception()
        self.listener.onQueryTerminated({
            "id": jevent.id().toString(),
            "exception": exception.get() if exception.isDefined() else None})

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]

