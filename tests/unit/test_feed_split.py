"""Real-time Mode's tile feeds split by partition (pipelines.streaming.realtime.feed_partitions,
pipelines.streaming.feed_process): who applies what, and how a feed's failure is told."""

from __future__ import annotations

import sys
import time

import pytest

from pipelines.settings import Settings
from pipelines.streaming.feed_process import FeedProcess, FeedProcessFailed
from pipelines.streaming.realtime import SALES_PARTITION, Feeds, feed_partitions


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 7, 12])
def test_every_partition_has_exactly_one_feed_and_the_sales_go_to_the_first(
        partitions: int) -> None:
    for feeds in range(1, partitions + 1):
        shares = [feed_partitions(list(range(partitions)), k, feeds) for k in range(feeds)]
        assert sorted(p for share in shares for p in share) == list(range(partitions))
        assert SALES_PARTITION in shares[0]
        # as even as whole partitions allow
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_feed_without_a_partition_is_an_error_naming_the_setting() -> None:
    with pytest.raises(RuntimeError, match="SHOPSTREAM_STREAM_REALTIME_FEEDS to at most 2"):
        feed_partitions([0, 1], 2, 3)
    with pytest.raises(ValueError, match="not in 0..1"):
        feed_partitions([0, 1], 2, 2)


def test_more_feeds_than_the_topic_has_partitions_is_refused_before_anything_starts() -> None:
    settings = Settings(_env_file=None, kafka_topic_partitions=2,  # type: ignore[call-arg]
                        stream_realtime_feeds=3)
    with pytest.raises(ValueError, match="STREAM_REALTIME_FEEDS=3 is more than the tile topic's 2"):
        Feeds(settings)
    # the topic's own count counts, not the setting it would be created with
    with pytest.raises(ValueError, match="more than the tile topic's 1 partitions"):
        Feeds(settings.model_copy(update={"kafka_topic_partitions": 4}), partitions=1)


def test_the_default_number_of_feeds_fits_a_topic_with_fewer_partitions() -> None:
    """Unset, ``stream_realtime_feeds`` is cut to the partitions: one-partition topics work."""
    default = Settings(_env_file=None)  # type: ignore[call-arg]
    assert default.stream_realtime_feeds == 2
    assert Feeds(default, partitions=1).count == 1 and not Feeds(default, partitions=1).others
    assert Feeds(default, partitions=4).count == 2


def test_a_feed_process_that_exits_fails_the_check_with_its_exit_code() -> None:
    """A feed runs until it is stopped: its process ending by itself is a failure the driver
    reports, never taken as caught up."""
    import subprocess

    feed = FeedProcess(Settings(_env_file=None), 1, 2)  # type: ignore[call-arg]
    feed._proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + 30
    while feed._proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(FeedProcessFailed, match="feed #1 .* exited with 3"):
        feed.check()
    with pytest.raises(FeedProcessFailed, match="exited with 3"):
        feed.caught_up()
    with pytest.raises(FeedProcessFailed, match="exited with 3"):
        feed.stop(5)
