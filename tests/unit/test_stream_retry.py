"""The stream's bounded retry of its online writes while Redis is unreachable."""

from __future__ import annotations

import pytest
import redis

from pipelines.settings import Settings
from pipelines.stream import BatchProcessor, is_redis_outage
from pipelines.stream_metrics import MetricsRecorder


def _processor(tmp_path, outage_seconds: float) -> BatchProcessor:
    settings = Settings(_env_file=None, data_dir=str(tmp_path),
                        stream_redis_outage_seconds=outage_seconds)
    return BatchProcessor(settings, str(tmp_path / "cp"), MetricsRecorder(settings))


@pytest.mark.parametrize("error", [
    redis.ConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused."),
    redis.TimeoutError("Timeout reading from socket"),
    ConnectionRefusedError(111, "Connection refused"),
    RuntimeError("org.apache.spark.api.python.PythonException: Traceback ...\n"
                 "redis.exceptions.ConnectionError: Error 111 connecting to localhost:6399."),
])
def test_redis_unreachable_is_an_outage(error: BaseException) -> None:
    assert is_redis_outage(error)


@pytest.mark.parametrize("error", [
    ValueError("bad tile"),
    RuntimeError("org.apache.spark.SparkException: Job aborted: KeyError: 'tile_start'"),
    redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
])
def test_other_failures_are_not(error: BaseException) -> None:
    assert not is_redis_outage(error)


def test_a_write_is_retried_until_redis_is_back(tmp_path) -> None:
    calls = []

    def write() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise redis.ConnectionError("Connection refused")
        return "written"

    assert _processor(tmp_path, 30)._redis_retrying(7, write) == "written"
    assert len(calls) == 3


def test_other_errors_and_an_exhausted_budget_fail_at_once(tmp_path) -> None:
    def broken() -> None:
        raise ValueError("bad tile")

    with pytest.raises(ValueError):
        _processor(tmp_path, 30)._redis_retrying(1, broken)

    def down() -> None:
        raise redis.ConnectionError("Connection refused")

    with pytest.raises(redis.ConnectionError):
        _processor(tmp_path, 0)._redis_retrying(1, down)


def _online(tmp_path):
    from pipelines.streaming.online import OnlineFeatures

    return OnlineFeatures(Settings(_env_file=None, data_dir=str(tmp_path)))


def _fail(error: BaseException) -> None:
    raise error


def test_top_lists_are_redone_by_a_new_process_and_after_an_outage(tmp_path) -> None:
    online = _online(tmp_path)
    try:
        # the first batch of a process redoes them (a crash may have lost a run),
        # and a batch that fails before starting its run leaves that to the next one
        assert online.finish_top() is True
        assert online.finish_top() is True
        online.submit_top(lambda: None)
        assert online.finish_top() is False
        online.submit_top(_fail, error=redis.ConnectionError("Error 111 connecting to 127.0.0.1."))
        assert online.finish_top() is True  # the next batch writes them
        assert online.finish_top() is True  # ... even when its first attempt fails
    finally:
        online.close()


def test_a_failed_top_run_that_is_not_an_outage_fails_the_batch(tmp_path) -> None:
    online = _online(tmp_path)
    online.submit_top(_fail, error=ValueError("corrupt top base"))
    with pytest.raises(ValueError, match="corrupt top base"):
        online.close()


def test_beside_a_real_time_query_the_parquet_query_triggers_at_its_own_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipelines.stream import trigger_seconds_of

    monkeypatch.delenv("SHOPSTREAM_STREAM_REALTIME_OFFLINE_TRIGGER_SECONDS", raising=False)
    assert trigger_seconds_of(Settings(_env_file=None), realtime=True) == 30.0
    monkeypatch.setenv("SHOPSTREAM_STREAM_REALTIME_OFFLINE_TRIGGER_SECONDS", "20")
    settings = Settings(_env_file=None, stream_trigger_seconds=0.5)
    assert trigger_seconds_of(settings, realtime=False) == 0.5
    assert trigger_seconds_of(settings, realtime=True) == 20.0


@pytest.mark.parametrize(("idle", "trigger", "wait"), [
    (12.0, 1.0, 12.0),   # the usual case: the idle time asked for
    (12.0, 10.0, 12.0),  # a trigger fires (and sees new input) within the idle time
    (5.0, 10.0, 12.0),   # shorter than a trigger: stretched past the next trigger's check
])
def test_until_idle_waits_past_the_next_trigger(idle: float, trigger: float, wait: float) -> None:
    from pipelines.stream import idle_wait_seconds

    assert idle_wait_seconds(idle, trigger) == wait


@pytest.mark.parametrize("error", [
    "KafkaConnectionError", "KafkaTimeoutError", "NodeNotReadyError", "RequestTimedOutError",
    "CoordinatorNotAvailableError", "NotCoordinatorError",
])
def test_kafka_unreachable_or_not_ready_is_an_outage(error: str) -> None:
    import kafka.errors

    from pipelines.stream import is_kafka_outage

    assert is_kafka_outage(getattr(kafka.errors, error)("111 ECONNREFUSED"))


@pytest.mark.parametrize("error", [
    "CommitFailedError", "TopicAuthorizationFailedError", "SaslAuthenticationFailedError",
])
def test_kafka_failures_a_retry_cannot_mend_are_not(error: str) -> None:
    import kafka.errors

    from pipelines.stream import is_kafka_outage

    assert not is_kafka_outage(getattr(kafka.errors, error)("refused"))
    assert not is_kafka_outage(ConnectionRefusedError(111, "Connection refused"))  # Redis's


def test_a_tile_feed_waits_out_kafka_as_long_as_the_source_then_fails_with_the_cause(
        caplog: pytest.LogCaptureFixture) -> None:
    import time

    from kafka.errors import KafkaConnectionError

    from pipelines.stream import StreamFailed
    from pipelines.streaming.realtime import _Outage

    settings = Settings(_env_file=None, stream_kafka_attempts=2, stream_kafka_timeout_seconds=0.1)
    assert settings.kafka_outage_seconds == pytest.approx(2.2)  # 2 x (0.1 s + 1 s)
    outage = _Outage.of_kafka(settings, index=1)
    cause = KafkaConnectionError("111 ECONNREFUSED")
    with caplog.at_level("INFO", logger="pipelines.streaming.realtime"):
        outage.down(cause)
        outage.down("cannot reach Kafka at 127.0.0.1:9 (connection refused)")  # within the bound
        outage.back()
        outage.back()  # no outage: nothing said
        outage.down(cause)  # a new outage: its own bound
        time.sleep(2.3)
        with pytest.raises(KafkaConnectionError):
            outage.down(cause)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == ("real-time tile feed #1: Kafka unreachable (KafkaConnectionError: 111 "
                       "ECONNREFUSED); retrying for up to 2 s (SHOPSTREAM_STREAM_KAFKA_ATTEMPTS x "
                       "(SHOPSTREAM_STREAM_KAFKA_TIMEOUT_SECONDS + 1 s))")
    assert len(said) == 3 and said[1] == (
        "real-time tile feed #1: Kafka is back after 0 s; the tiles since the last commit are "
        "written again")
    late = _Outage.of_kafka(settings, index=0)
    late.down(cause)
    time.sleep(2.3)
    with pytest.raises(StreamFailed, match=r"Kafka unreachable for 2 s: cannot reach Kafka at"):
        late.down("cannot reach Kafka at 127.0.0.1:9 (connection refused)")


def test_a_tile_feed_waits_out_redis_for_the_batches_bound_saying_so_every_30_s(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis outage said once a retry (every second) flooded the log; it is now told as
    Kafka's is: when it begins, every ``OUTAGE_REPORT_S``, when it ends."""
    import time

    from pipelines.streaming import realtime

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    settings = Settings(_env_file=None, stream_redis_outage_seconds=90)
    outage = realtime._Outage.of_redis(settings, index=0)
    cause = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    with caplog.at_level("INFO", logger="pipelines.streaming.realtime"):
        for _ in range(80):  # a retry a second, 80 s
            outage.down(cause)
            now[0] += 1.0
        outage.back()
        outage.down(cause)
        now[0] += 91.0
        with pytest.raises(redis.ConnectionError):
            outage.down(cause)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == ("real-time tile feed #0: Redis unreachable (Error 111 connecting to "
                       "127.0.0.1:6379. Connection refused.); retrying for up to 90 s "
                       "(SHOPSTREAM_STREAM_REDIS_OUTAGE_SECONDS)")
    assert [m.split(" (")[0] for m in said[1:3]] == [
        "real-time tile feed #0: Redis still unreachable after 30 s of 90 s",
        "real-time tile feed #0: Redis still unreachable after 60 s of 90 s"]
    assert said[3].startswith("real-time tile feed #0: Redis is back after 80 s")
    assert len(said) == 5  # and the next outage's first line
