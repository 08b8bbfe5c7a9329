"""The streaming benchmark's wait for a mode to catch up, against a real redis-server:
a run that never catches up says how far behind it was, and where."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from benchmarks import streaming_throughput as st
from features.online_keys import stream_progress_key
from pipelines.settings import Settings
from pipelines.streaming.realtime import rt_clock_key

pytestmark = pytest.mark.integration


def test_a_realtime_run_behind_names_the_lag_and_its_parts(
        settings: Settings, redis_client: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "WAIT_STATUS_S", 0.3)
    redis_client.set(rt_clock_key(), int((time.time() - 42) * 1e6))
    redis_client.hset(stream_progress_key(), mapping={
        "rt_query_p50_s": "30.100", "rt_query_p99_s": "35.000",
        "rt_feed_p50_s": "0.200", "rt_feed_p99_s": "0.900", "clock": "ignored"})

    caught_up, last = st._wait_for_clock(settings, "realtime", lambda: True, 1.0)

    assert caught_up is None
    behind = float(last.split(" s behind")[0])
    assert 42 <= behind < 45
    assert "(query p50/p99 30.100/35.000 s; feed p50/p99 0.200/0.900 s)" in last
    assert "realtime: waiting to catch up" in capsys.readouterr().out  # progress while waiting


def test_a_clock_that_stays_within_the_lag_counts_once_held(settings: Settings,
                                                             redis_client: Any) -> None:
    stop = threading.Event()

    def tick() -> None:  # a mode that keeps up: its clock moves with now
        while not stop.wait(0.1):
            redis_client.set(rt_clock_key(), int(time.time() * 1e6))

    redis_client.set(rt_clock_key(), int(time.time() * 1e6))
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        caught_up, last = st._wait_for_clock(settings, "realtime", lambda: True, 10.0, hold_s=1.0)
    finally:
        stop.set()
        ticker.join()

    assert caught_up is not None and 1.0 <= caught_up < 5
    assert last.endswith("s behind")


def test_a_clock_that_touches_now_once_has_not_caught_up(settings: Settings,
                                                          redis_client: Any) -> None:
    redis_client.set(rt_clock_key(), int(time.time() * 1e6))  # then no more tiles: still draining

    caught_up, last = st._wait_for_clock(settings, "realtime", lambda: True, 3.0, hold_s=2.0)

    assert caught_up is None
    assert float(last.split(" s behind")[0]) > st.CAUGHT_UP_LAG_S["realtime"]


def test_no_clock_at_all_says_so(settings: Settings, redis_client: Any) -> None:
    assert st._wait_for_clock(settings, "microbatch", lambda: True, 0.5) == (None, "no clock yet")


def test_the_parquet_sinks_count_as_caught_up_within_their_trigger(
        settings: Settings, redis_client: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real-time Mode's Parquet sinks' process publishes the micro-batch clock of its last
    batch (a 30 s trigger by default): 32 s behind is caught up for it, 40 s is not, and
    the wait says what it waits for."""
    from datetime import UTC, datetime

    monkeypatch.setattr(st, "WAIT_STATUS_S", 0.2)
    assert st.sinks_lag_s(settings) == settings.stream_realtime_offline_trigger_seconds + 5.0 == 35.0
    for behind, expected in ((32, True), (40, False)):
        clock = datetime.fromtimestamp(time.time() - behind, tz=UTC).isoformat()
        redis_client.hset(stream_progress_key(), "clock", clock)
        caught_up, last = st._wait_for_clock(settings, "microbatch", lambda: True, 0.5,
                                             lag_s=st.sinks_lag_s(settings), label="the sinks")
        assert (caught_up is not None) is expected, last
    assert "the sinks: waiting to catch up" in capsys.readouterr().out
