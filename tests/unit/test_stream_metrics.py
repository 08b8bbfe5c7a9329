"""The streaming job's per-batch figures: joined, formatted, exported (no servers)."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.settings import Settings
from pipelines.stream_metrics import (
    REALTIME_QUERY_NAME,
    BatchStats,
    MetricsRecorder,
    format_batch_line,
    format_epoch_line,
    progress_path,
    prometheus_text,
    read_progress,
    textfile_path,
)


class DownRedis:
    """A Redis client whose server is gone: every call fails like a refused connection."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("Connection refused")

        return fail


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(_env_file=None, data_dir=str(tmp_path / "data"),  # type: ignore[call-arg]
                    redis_url="redis://127.0.0.1:1/0")


def _stats(batch_id: int = 7, *, rows: int = 95, freshness: Any = (0.4, 0.9, 1.2),
           online: float | None = 0.3) -> BatchStats:
    return BatchStats(batch_id=batch_id, rows=rows, valid=90, quarantined=8, late=3, on_time=87,
                      clock_us=1_717_243_200_000_000, freshness_s=freshness, foreach_seconds=0.8,
                      read_seconds=0.45, online_seconds=online, offline_seconds=0.2)


def _progress(batch_id: int = 7, input_rows: int = 100) -> dict[str, Any]:
    return {"batchId": batch_id, "name": "shopstream-events", "numInputRows": input_rows,
            "inputRowsPerSecond": 50.0, "processedRowsPerSecond": 80.0, "batchDuration": 1250,
            "stateOperators": [{"numRowsTotal": 4321, "allUpdatesTimeMs": 1280,
                                "allRemovalsTimeMs": 340, "numRowsRemoved": 17}]}


def test_record_joins_batch_stats_with_spark_progress(settings: Settings) -> None:
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    metrics = recorder.on_progress(_progress())
    assert metrics is not None
    assert (metrics.input_rows, metrics.duplicates_dropped, metrics.quarantined, metrics.late) == (
        100, 5, 8, 3)
    assert (metrics.freshness_p50_s, metrics.freshness_p99_s, metrics.freshness_max_s) == (0.4, 0.9, 1.2)
    assert metrics.clock == "2024-06-01T12:00:00+00:00"
    assert metrics.state_rows == 4321
    assert (metrics.state_update_s, metrics.state_evict_s, metrics.state_rows_removed) == (
        1.28, 0.34, 17)
    assert recorder.totals.late == 3 and recorder.totals.batches == 1


def test_the_bucketed_dedups_expiry_is_its_due_timers_task_time(settings: Settings) -> None:
    """``transformWithState`` reports no eviction pass: what the bucketed dedup spends
    expiring is its timers' processing (a custom metric), and that is ``state_evict_s``."""
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    progress = _progress()
    progress["stateOperators"] = [{
        "operatorName": "transformWithStateExec", "numRowsTotal": 2_000_000,
        "allUpdatesTimeMs": 11_000, "allRemovalsTimeMs": 0, "numRowsRemoved": 1_000_000,
        "customMetrics": {"timerProcessingTimeMs": 3_500, "numExpiredTimers": 64}}]
    metrics = recorder.on_progress(progress)
    assert metrics is not None
    assert (metrics.state_update_s, metrics.state_evict_s, metrics.state_rows_removed) == (
        11.0, 3.5, 1_000_000)
    assert "evict 3.50s" in format_batch_line(metrics)


def test_a_batch_without_state_timings_reports_none_not_zero(settings: Settings) -> None:
    """Spark leaves the dedup's timings out when it has none to give (a query without a
    stateful operator): the figures say unknown, and the line and the textfile leave them out."""
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    progress = _progress()
    progress["stateOperators"] = []
    metrics = recorder.on_progress(progress)
    assert metrics is not None
    assert (metrics.state_rows, metrics.state_update_s, metrics.state_evict_s) == (0, None, None)
    assert "dedup state" not in format_batch_line(metrics)
    assert "state_task_seconds" not in prometheus_text(metrics, recorder.totals)


def test_an_eviction_pass_that_dominates_batches_is_warned_about_once(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """A pass over 18M state rows (5 s of task time in a 4 s batch on two tasks): one
    WARNING naming the setting and the figures; the next such batch, minutes before the
    next warning is due, stays at INFO; a pass that is a small share warns never, and
    neither does the bucketed operator, which has no such pass."""
    spark_dedup = settings.model_copy(update={"stream_dedup": "spark"})
    recorder = MetricsRecorder(spark_dedup, _client=DownRedis())
    big = _progress(batch_id=1)
    big["batchDuration"] = 4000
    big["stateOperators"] = [{"numRowsTotal": 18_000_000, "allRemovalsTimeMs": 5000,
                              "numShufflePartitions": 2}]
    with caplog.at_level(logging.INFO, logger="pipelines.stream_metrics"):
        for batch in (1, 2):
            recorder.record_batch(_stats(batch))
            recorder.on_progress({**big, "batchId": batch})
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "eviction" in r.getMessage()]
    assert warnings == [
        "batch 1: the dedup's eviction pass read all 18,000,000 state rows in 5.0s of task "
        "time, 62% of the batch's: it grows with the input rate x "
        "SHOPSTREAM_STREAM_DEDUP_RETENTION_SECONDS (900 s). SHOPSTREAM_STREAM_DEDUP=bucketed "
        "(on a new checkpoint) reads only what expires; a shorter retention, or larger "
        "batches (SHOPSTREAM_STREAM_MAX_OFFSETS_PER_TRIGGER), make it a smaller part"]

    caplog.clear()
    quiet = MetricsRecorder(spark_dedup, _client=DownRedis())
    small = {**big, "batchId": 3, "batchDuration": 12000}  # 5 s of 24 s: under a quarter
    bucketed = MetricsRecorder(settings, _client=DownRedis())
    with caplog.at_level(logging.INFO, logger="pipelines.stream_metrics"):
        quiet.record_batch(_stats(3))
        quiet.on_progress(small)
        bucketed.record_batch(_stats(4))
        bucketed.on_progress({**big, "batchId": 4})
    assert settings.stream_dedup == "bucketed"
    assert not [r for r in caplog.records if "eviction" in r.getMessage()]


def test_a_batch_whose_copy_went_to_disk_says_how_much_and_warns_once_with_the_fix(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """A batch too large for the driver's memory: its line and the textfile carry the bytes
    on disk, and one WARNING names the two settings to change with their values; the next
    such batch minutes before the next warning is due stays at INFO, and a batch that fit
    says nothing of it."""
    from dataclasses import replace

    recorder = MetricsRecorder(settings, _client=DownRedis())
    with caplog.at_level(logging.INFO, logger="pipelines.stream_metrics"):
        lines = []
        for batch, spilled in ((1, 327_155_712), (2, 10 * 2**20), (3, 0)):
            recorder.record_batch(replace(_stats(batch), spilled_bytes=spilled))
            metrics = recorder.on_progress(_progress(batch))
            assert metrics is not None and metrics.spilled_bytes == spilled
            lines.append(format_batch_line(metrics))
            text = prometheus_text(metrics, recorder.totals)
            samples = {s.name: s.value for f in text_string_to_metric_families(text)
                       for s in f.samples}
            assert samples["shopstream_stream_batch_spilled_bytes"] == spilled
    assert lines[0].endswith("; spilled 312 MB to disk")
    assert lines[1].endswith("; spilled 10 MB to disk")
    assert "spilled" not in lines[2]
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "disk" in r.getMessage()]
    assert warnings == [
        "batch 1: 312 MB of its rows did not fit in the driver's memory and went to disk, to "
        "be read back by every sink: raise SHOPSTREAM_SPARK_DRIVER_MEMORY (now "
        f"{settings.spark_driver_memory}; the executors' memory on a cluster) or lower "
        "SHOPSTREAM_STREAM_MAX_OFFSETS_PER_TRIGGER (now 1,000,000)"]


def test_progress_without_batch_stats_is_ignored(settings: Settings) -> None:
    recorder = MetricsRecorder(settings, _client=DownRedis())
    assert recorder.on_progress(_progress(batch_id=3)) is None
    assert recorder.totals.batches == 0


def test_one_info_line_per_batch_says_what_happened(settings: Settings) -> None:
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    line = format_batch_line(recorder.on_progress(_progress()))  # type: ignore[arg-type]
    assert line.startswith("batch 7: 100 rows in 1.25s")
    for part in ("87 on time", "8 quarantined (3 late)", "5 duplicates",
                 "freshness p50 0.40s p99 0.90s max 1.20s", "clock 2024-06-01T12:00:00",
                 "; read+validate 0.45s, online 0.30s, Parquet 0.20s",
                 "; dedup state 4,321 rows (update 1.28s, evict 0.34s of task time)"):
        assert part in line


def test_a_realtime_epoch_gets_its_own_line_with_the_time_between_epochs(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """Real-time epochs reach no ``foreachBatch``: one line says how long the epoch ran and
    what Spark spent around it, largest first (where the tiles stopped between epochs)."""
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())  # a micro-batch of the same id must not be taken for it
    progress = {"name": REALTIME_QUERY_NAME, "batchId": 7, "numInputRows": 30_012,
                "durationMs": {"triggerExecution": 31_960, "addBatch": 30_020,
                               "queryPlanning": 410, "walCommit": 55, "commitOffsets": 1_200,
                               "latestOffset": 0},
                "stateOperators": [{"operatorName": "dedupe", "commitTimeMs": 310},
                                   {"operatorName": "stateStoreSave", "commitTimeMs": 0}]}
    with caplog.at_level(logging.INFO, logger="pipelines.stream_metrics"):
        assert recorder.on_progress(progress) is None
    assert recorder.totals.batches == 0
    lines = [r.getMessage() for r in caplog.records if "real-time epoch" in r.getMessage()]
    assert lines == ["real-time epoch 7: 30,012 rows in 32.0s (running 30.0s; commitOffsets "
                     "1.20s, queryPlanning 0.41s, walCommit 0.06s; state commits dedupe 0.31s)"]
    assert format_epoch_line({"batchId": 0, "numInputRows": 0}) == (
        "real-time epoch 0: 0 rows in 0.0s (running 0.0s)")


def test_batch_line_names_only_the_parts_that_ran(settings: Settings) -> None:
    """A batch without the online path (``--no-online``, or no clock yet) says so by
    leaving it out, not by a zero."""
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats(online=None))
    metrics = recorder.on_progress(_progress())
    assert metrics is not None
    line = format_batch_line(metrics)
    assert "; read+validate 0.45s, Parquet 0.20s; dedup state" in line
    text = prometheus_text(metrics, recorder.totals)
    phases = {s.labels["phase"]: s.value for family in text_string_to_metric_families(text)
              for s in family.samples if s.name == "shopstream_stream_batch_phase_seconds"}
    assert phases == {"read": 0.45, "offline": 0.2}


def test_prometheus_textfile_parses_and_carries_totals(settings: Settings) -> None:
    recorder = MetricsRecorder(settings, _client=DownRedis())
    for batch in (1, 2):
        recorder.record_batch(_stats(batch))
        recorder.on_progress(_progress(batch))
    text = prometheus_text(recorder.latest(), recorder.totals)  # type: ignore[arg-type]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("shopstream_stream_late_rows_total", ())] == 6
    assert samples[("shopstream_stream_input_rows_total", ())] == 200
    assert samples[("shopstream_stream_freshness_seconds", (("quantile", "0.99"),))] == 0.9
    assert samples[("shopstream_stream_batch_duration_seconds", ())] == 1.25
    assert samples[("shopstream_stream_batch_phase_seconds", (("phase", "online"),))] == 0.3
    assert samples[("shopstream_stream_state_task_seconds", (("part", "evict"),))] == 0.34
    assert samples[("shopstream_stream_state_task_seconds", (("part", "update"),))] == 1.28
    assert samples[("shopstream_stream_state_rows_removed", ())] == 17


def test_files_are_written_when_redis_is_down_and_status_reads_them(settings: Settings) -> None:
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    recorder.on_progress(_progress())  # Redis write fails: a warning, not an error
    path = progress_path(settings)
    assert path is not None and json.loads(path.read_text())["latest"]["batch_id"] == 7
    prom = textfile_path(settings)
    assert prom is not None and "shopstream_stream_batch_id 7" in prom.read_text()
    shown = read_progress(settings, client=DownRedis())
    assert shown["batch_id"] == "7" and shown["late"] == "3"


def test_batch_without_online_write_has_no_freshness(settings: Settings) -> None:
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats(freshness=None))
    metrics = recorder.on_progress(_progress())
    assert metrics is not None and metrics.freshness_p99_s is None
    assert "freshness p50 - p99 - max -" in format_batch_line(metrics)
    assert "freshness_seconds" not in prometheus_text(metrics, recorder.totals)


def test_textfile_location_follows_settings(tmp_path: Path) -> None:
    remote = Settings(_env_file=None, data_dir="s3a://bucket/shopstream")  # type: ignore[call-arg]
    assert textfile_path(remote) is None and progress_path(remote) is None
    explicit = Settings(_env_file=None, data_dir="s3a://bucket/shopstream",  # type: ignore[call-arg]
                        stream_metrics_textfile=str(tmp_path / "node" / "stream.prom"))
    assert textfile_path(explicit) == tmp_path / "node" / "stream.prom"


def test_realtime_textfile_sits_beside_the_jobs_and_parses(tmp_path: Path) -> None:
    """The feed's figures in their own file of the collector's directory, per part."""
    from datetime import UTC, datetime

    from pipelines.stream_metrics import realtime_prometheus_text, realtime_textfile_path

    explicit = Settings(_env_file=None,  # type: ignore[call-arg]
                        stream_metrics_textfile=str(tmp_path / "node" / "stream.prom"))
    assert realtime_textfile_path(explicit) == tmp_path / "node" / "stream_rt.prom"
    assert realtime_textfile_path(explicit, 1) == tmp_path / "node" / "stream_rt1.prom"
    remote = Settings(_env_file=None, data_dir="s3a://bucket/shopstream")  # type: ignore[call-arg]
    assert realtime_textfile_path(remote) is None
    at = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    text = realtime_prometheus_text({"total": (0.2, 1.5, 2.0), "query": (0.08, 0.15, 0.3),
                                     "feed": (0.1, 1.4, 1.9)}, 4980, at)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    fresh = "shopstream_stream_rt_freshness_seconds"
    first = (("feed", "0"),)
    assert samples[(fresh, (*first, ("part", "feed"), ("quantile", "0.99")))] == 1.4
    assert samples[(fresh, (*first, ("part", "query"), ("quantile", "1")))] == 0.3
    assert samples[(fresh, (*first, ("part", "total"), ("quantile", "0.5")))] == 0.2
    assert samples[("shopstream_stream_rt_tiles_written", first)] == 4980
    assert samples[("shopstream_stream_rt_last_report_timestamp_seconds", first)] == at.timestamp()
    assert not any(name.startswith("shopstream_stream_rt_top") for name, _ in samples)
    # the feed that keeps the top lists: its top writes too
    with_top = realtime_prometheus_text({"total": (0.2, 1.5, 2.0)}, 10, at, top={
        "writes": 7.0, "write_p50_s": 0.031, "write_max_s": 0.09, "lag_max_s": 0.42})
    top = {(s.name, s.labels.get("quantile")): s.value
           for family in text_string_to_metric_families(with_top) for s in family.samples
           if s.name.startswith("shopstream_stream_rt_top")}
    assert top == {("shopstream_stream_rt_top_write_seconds", "0.5"): 0.031,
                   ("shopstream_stream_rt_top_write_seconds", "1"): 0.09,
                   ("shopstream_stream_rt_top_writes", None): 7.0,
                   ("shopstream_stream_rt_top_lag_max_seconds", None): 0.42}
    # a second feed's file: the same series, told apart by the label
    second = realtime_prometheus_text({"total": (0.3, 0.9, 1.0)}, 12, at, feed=1)
    labels = {tuple(sorted(s.labels.items())) for family in text_string_to_metric_families(second)
              for s in family.samples}
    assert (("feed", "1"),) in labels and all(dict(lab)["feed"] == "1" for lab in labels)


def test_textfile_timestamps_are_exact(settings: Settings) -> None:
    """Epoch seconds keep every digit (``:g`` had rounded them to 1.79561e+09)."""
    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    metrics = recorder.on_progress(_progress())
    assert metrics is not None
    samples = {s.name: s.value for family in
               text_string_to_metric_families(prometheus_text(metrics, recorder.totals))
               for s in family.samples}
    published = samples["shopstream_stream_last_batch_timestamp_seconds"]
    assert published == datetime.fromisoformat(metrics.timestamp).timestamp()


# ------------------------------------------------------------------ shopstream status's verdict
def _running(now: datetime, **fields: str) -> dict[str, str]:
    from datetime import timedelta

    started = now - timedelta(minutes=10)
    return {"job_state": "running", "job_state_since": started.isoformat(),
            "job_heartbeat": (now - timedelta(seconds=3)).isoformat(), "job_caught_up": "yes",
            "batch_id": "812", "timestamp": (now - timedelta(seconds=2)).isoformat(),
            "freshness_p99_s": "1.734", "clock": "2026-11-27T19:04:53+00:00",
            "mode": "microbatch", **fields}


def test_a_running_job_with_a_recent_heartbeat_is_running() -> None:
    from datetime import UTC

    from pipelines.stream_metrics import stream_health

    now = datetime(2026, 11, 27, 20, 0, tzinfo=UTC)
    verdict = stream_health(_running(now), now)
    assert verdict.state == "running" and verdict.healthy
    assert verdict.message.startswith("running, caught up")
    assert "last batch 812 2 s ago, freshness p99 1.73 s" in verdict.message
    assert "features as of 2026-11-27T19:04:53+00:00" in verdict.message
    behind = stream_health(_running(now, job_caught_up="no"), now)
    assert behind.message.startswith("running, catching up (its last batch left input for the next)")


def test_a_killed_job_is_told_by_its_silent_heartbeat() -> None:
    """kill -9 leaves ``running`` behind: the heartbeat's age tells the truth."""
    from datetime import UTC, timedelta

    from pipelines.stream_metrics import HEARTBEAT_STALE_SECONDS, stream_health

    now = datetime(2026, 11, 27, 20, 0, tzinfo=UTC)
    later = now + timedelta(seconds=HEARTBEAT_STALE_SECONDS + 5)
    verdict = stream_health(_running(now), later)
    assert verdict.state == "silent" and not verdict.healthy
    assert "its last heartbeat was 38 s ago" in verdict.message
    assert "killed" in verdict.message and "resumes from its checkpoint" in verdict.message
    # a heartbeat older than the running state is an earlier run's, not this one's
    restarted = _running(now, job_heartbeat=(now - timedelta(hours=2)).isoformat(),
                         job_state_since=(now - timedelta(minutes=5)).isoformat())
    assert "no heartbeat since it started (5 min ago)" in stream_health(restarted, now).message
    # just started, no heartbeat yet: not silent
    fresh = _running(now, job_state_since=(now - timedelta(seconds=2)).isoformat())
    del fresh["job_heartbeat"]
    assert stream_health(fresh, now).state == "running"


def test_stopped_failed_and_unknown_states() -> None:
    from datetime import UTC, timedelta

    from pipelines.stream_metrics import stream_health

    now = datetime(2026, 11, 27, 20, 0, tzinfo=UTC)
    since = (now - timedelta(minutes=3)).isoformat()
    stopped = stream_health({"job_state": "stopped: SIGTERM", "job_state_since": since}, now)
    assert (stopped.state, stopped.message, stopped.healthy) == (
        "stopped", "stopped: SIGTERM (3 min ago)", True)
    failed = stream_health({"job_state": "failed: Kafka unreachable", "job_state_since": since}, now)
    assert failed.state == "failed" and not failed.healthy
    assert failed.message.startswith("failed: Kafka unreachable (3 min ago); see the job's log")
    assert stream_health({}, now).state == "none"
    # batch figures from the file while Redis is down: no state to judge
    only_batch = {k: v for k, v in _running(now).items() if not k.startswith("job_")}
    unknown = stream_health(only_batch, now)
    assert unknown.state == "unknown" and unknown.healthy
    assert unknown.message.startswith("state unknown")


def test_realtime_figures_of_an_earlier_run_are_not_shown() -> None:
    from datetime import UTC, timedelta

    from pipelines.stream_metrics import stream_health

    now = datetime(2026, 11, 27, 20, 0, tzinfo=UTC)
    rt = {"rt_updated": (now - timedelta(seconds=4)).isoformat(), "rt_freshness_p99_s": "0.412",
          "rt_query_p99_s": "0.130", "rt_feed_p99_s": "0.301"}
    shown = stream_health(_running(now, **rt), now).message
    assert "real-time tiles p99 0.41 s (query 0.13, feed 0.30; 4 s ago)" in shown
    assert "top lists" not in shown  # no top write in the report (a first report, no sales)
    top = {"rt_top_writes": "9", "rt_top_write_max_s": "0.052", "rt_top_lag_max_s": "0.318"}
    assert ("top lists at most 0.32 s behind the sales tiles (a write 0.05 s at most)"
            in stream_health(_running(now, **rt, **top), now).message)
    old = {**rt, "rt_updated": (now - timedelta(hours=1)).isoformat()}
    assert "real-time" not in stream_health(_running(now, **old), now).message
    assert "top lists" not in stream_health(_running(now, **old, **top), now).message
    # feeds side by side: the worst one's figures, named
    second = {"rt1_updated": (now - timedelta(seconds=2)).isoformat(),
              "rt1_freshness_p99_s": "0.950", "rt1_query_p99_s": "0.140", "rt1_feed_p99_s": "0.800"}
    both = stream_health(_running(now, **rt, **second), now).message
    assert "real-time tiles p99 0.95 s (feed #1 of 2, query 0.14, feed 0.80; 2 s ago)" in both
    slower_first = {**second, "rt1_freshness_p99_s": "0.200"}
    assert ("real-time tiles p99 0.41 s (feed #0 of 2, query 0.13, feed 0.30; 4 s ago)"
            in stream_health(_running(now, **rt, **slower_first), now).message)


def test_status_tells_of_parquet_sinks_given_priority_after_a_stall_in_this_run_only() -> None:
    from datetime import UTC, timedelta

    from pipelines.stream_metrics import stream_health

    now = datetime(2026, 11, 27, 20, 0, tzinfo=UTC)
    escalated = {"sinks_escalated": (now - timedelta(minutes=4)).isoformat(),
               "sinks_escalation_why": "no progress for 301 s at nice +19"}
    shown = stream_health(_running(now, mode="realtime", **escalated), now)
    assert shown.state == "running" and shown.healthy  # nothing is lost: it keeps up again
    assert ("Parquet sinks given the driver's priority 4 min ago (no progress for 301 s "
            "at nice +19: the cores are full" in shown.message)
    earlier = {**escalated, "sinks_escalated": (now - timedelta(hours=1)).isoformat()}
    assert "Parquet sinks" not in stream_health(_running(now, **earlier), now).message


def test_a_second_feeds_progress_fields_carry_its_index() -> None:
    from pipelines.stream_metrics import realtime_feed_prefixes, realtime_fields

    fields = {"rt_updated": "t", "rt_freshness_p99_s": "0.5", "rt_gc_pause_max_s": "0.010"}
    assert realtime_fields(fields, 0) == fields
    assert realtime_fields(fields, 2) == {"rt2_updated": "t", "rt2_freshness_p99_s": "0.5",
                                          "rt2_gc_pause_max_s": "0.010"}
    assert realtime_feed_prefixes({**fields, **realtime_fields(fields, 1), "clock": "x"}) == [
        "rt_", "rt1_"]


def test_the_heartbeat_reaches_prometheus_and_is_throttled(settings: Settings) -> None:
    """An alert on ``time() - shopstream_stream_heartbeat_timestamp_seconds`` tells a dead
    job from an idle one; the heartbeat asks whether input waits only when it is due."""
    from datetime import UTC

    recorder = MetricsRecorder(settings, _client=DownRedis())
    recorder.record_batch(_stats())
    recorder.on_progress(_progress())
    asked: list[int] = []

    def caught_up() -> bool:
        asked.append(1)
        return True

    before = datetime.now(UTC).timestamp()
    recorder._client = DownRedis()  # Redis is down: the file still gets the heartbeat
    recorder.heartbeat(caught_up)
    recorder.heartbeat(caught_up)  # within HEARTBEAT_SECONDS: nothing
    assert len(asked) == 1
    prom = textfile_path(settings)
    assert prom is not None
    samples = {s.name: s.value for family in text_string_to_metric_families(prom.read_text())
               for s in family.samples}
    assert before <= samples["shopstream_stream_heartbeat_timestamp_seconds"] <= before + 60
    assert samples["shopstream_stream_caught_up"] == 1.0
    assert samples["shopstream_stream_batch_id"] == 7
    # the next batch keeps the heartbeat in the file
    recorder._client = DownRedis()
    recorder.record_batch(_stats(batch_id=8))
    recorder.on_progress(_progress(batch_id=8))
    assert "shopstream_stream_heartbeat_timestamp_seconds" in prom.read_text()


def test_caught_up_means_the_last_batch_took_all_there_was() -> None:
    """At a steady rate input always arrives during a batch: keeping up. Behind is a batch
    that ``maxOffsetsPerTrigger`` stopped short of what was there."""
    from pipelines.stream_metrics import caught_up_of

    def progress(end: str, latest: str | None) -> dict[str, Any]:
        return {"sources": [{"description": "KafkaV2[Subscribe[t]]", "endOffset": end,
                             "latestOffset": latest}]}

    took_all = '{"t":{"0":500,"1":480}}'
    assert caught_up_of(progress(took_all, '{"t":{"1":480,"0":500}}')) is True
    assert caught_up_of(progress(took_all, '{"t":{"0":900,"1":480}}')) is False
    assert caught_up_of(progress(took_all, None)) is None
    assert caught_up_of(None) is None and caught_up_of({"sources": []}) is None


def test_the_listener_tells_when_a_querys_end_has_reached_it(settings: Settings) -> None:
    """Spark's listener bus is asynchronous: run_stream waits for the query's end to reach
    the listener (after its progress, in the bus's order) before it removes the listener,
    so the last batch's figures are not lost. Another query's end does not count."""
    import threading

    from pipelines.stream_metrics import ProgressListener

    listener = ProgressListener(MetricsRecorder(settings, _client=DownRedis()))
    assert listener.wait_terminated("q-1", timeout=0.05) is False
    listener.onQueryTerminated({"id": "q-other", "exception": None})
    assert listener.wait_terminated("q-1", timeout=0.05) is False
    timer = threading.Timer(0.2, listener.onQueryTerminated, args=({"id": "q-1", "exception": None},))
    timer.start()
    assert listener.wait_terminated("q-1", timeout=5.0) is True
    timer.join()


def test_the_listener_pulses_on_each_event_with_its_progress(settings: Settings) -> None:
    """Real-time Mode's Parquet sinks' process: its driver nices it once caught up, and gives
    it its priority back when it goes too long without (pipelines.streaming.offline_process)."""
    import json

    from pipelines.stream_metrics import ProgressListener

    beats: list[Any] = []
    listener = ProgressListener(MetricsRecorder(settings, _client=DownRedis()), on_event=beats.append)
    progress = {"id": "q", "name": "shopstream-events", "batchId": 3, "numInputRows": 0,
                "sources": [{"description": "KafkaV2[Subscribe[t]]", "endOffset": '{"t":{"0":500}}',
                             "latestOffset": '{"t":{"0":900}}'}]}
    listener.onQueryProgress(json.dumps(progress))
    listener.onQueryIdle({"id": "q"})
    assert beats == [progress, None]
