"""Real-time Mode's second and further tile feeds, each a process of its own.

The tile feed (:class:`pipelines.streaming.realtime.TileFeed`) is Python: one thread,
so at most one core, and less while it waits for Redis and Kafka. At 2,000 events/s
about 4,000 tile rows a second reach it, at about 142 µs of its CPU each
(``benchmarks/tile_feed.py``); on a slow hour, with the query, Kafka and Redis
beside it, it fell 5-9 s behind (docs/streaming-performance.md). The tile topic is
keyed by entity, and a user's or an item's features need only its own tiles, so
``stream_realtime_feeds`` feeds share the topic's partitions (``p % feeds``), each
with the running sums of its own entities: the first in the driver, the others here.
Every sales tile goes to partition 0 (:func:`pipelines.streaming.realtime.tile_messages`),
the first feed's, which keeps the sales totals and the top lists.

What every feed shares goes through Redis, atomically: the clock (the largest event
time any feed has written, a Lua max), the snapshot boundary (a Lua step), the sets of
touched entities. Each feed commits its own partitions' offsets in the feeds' consumer
group after their rows are in Redis, so a restart of any of them replays full tiles,
which rewrite the same values.

Like the Parquet sinks' process (:mod:`pipelines.streaming.offline_process`) a feed
process stays in the driver's session (with autogroup scheduling a session is a CPU
share of its own), stops on SIGTERM after writing what the topic holds, and dies with
the driver (the kernel's parent-death signal, taken as the same stop).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

from pipelines.log_repeats import CollapseRepeats
from pipelines.settings import Settings
from pipelines.stream import StreamFailed

__all__ = ["FeedProcess", "FeedProcessFailed", "main"]

log = logging.getLogger(__name__)


class FeedProcessFailed(StreamFailed):
    """A tile feed's process stopped on its own, with an error or unexpectedly."""


class FeedProcess:
    """Tile feed #``index`` of ``feeds`` as ``python -m pipelines.streaming.feed_process``."""

    def __init__(self, settings: Settings, index: int, feeds: int, *,
                 new_checkpoint: bool = False) -> None:
        self.settings = settings
        self.index = index
        self.feeds = feeds
        self.new_checkpoint = new_checkpoint
        self._proc: subprocess.Popen[bytes] | None = None
        self._consumer: Any = None
        self._tps: list[Any] | None = None
        self._asked = False

    def start(self) -> None:
        from pipelines.streaming.offline_process import PARENT_PID_ENV

        args = [sys.executable, "-m", "pipelines.streaming.feed_process",
                "--index", str(self.index), "--feeds", str(self.feeds)]
        if self.new_checkpoint:
            args.append("--new-checkpoint")
        env = self.settings.child_env()
        env[PARENT_PID_ENV] = str(os.getpid())
        # its own process group (a Ctrl-C reaches the driver, which stops it once), the
        # driver's session (its CPU share: module docstring)
        self._proc = subprocess.Popen(args, env=env, process_group=0)
        log.info("real-time tile feed #%d of %d: process %d", self.index, self.feeds,
                 self._proc.pid)

    def check(self) -> None:
        """Raise :class:`FeedProcessFailed` when the process has ended: a feed runs until
        it is stopped."""
        code = None if self._proc is None else self._proc.poll()
        if code is not None:
            raise FeedProcessFailed(
                f"real-time tile feed #{self.index} (process {self._proc.pid}) exited with "  # type: ignore[union-attr]
                f"{code}; see its log above")

    def caught_up(self) -> bool:
        """Every tile of its partitions the query has sent so far is in Redis: the feed
        commits its offsets at once when it reaches the end, so its committed offsets are
        at the partitions' ends."""
        from kafka import TopicPartition

        from pipelines.connections import kafka_consumer
        from pipelines.streaming.realtime import (
            FEED_GROUP,
            _partitions,
            feed_partitions,
            feed_topic,
        )

        self.check()
        if self._consumer is None:
            self._consumer = kafka_consumer(self.settings, group_id=FEED_GROUP)
        consumer, topic = self._consumer, feed_topic(self.settings)
        if self._tps is None:  # the topic's partitions are fixed while the job runs
            self._tps = [TopicPartition(topic, p) for p in
                         feed_partitions(_partitions(consumer, topic), self.index, self.feeds)]
        tps = self._tps
        ends = consumer.end_offsets(tps)
        return all((consumer.committed(tp) or 0) >= ends[tp] for tp in tps)

    def ask_stop(self) -> None:
        """SIGTERM, once (a second one stops a feed at once): it writes what the topic
        holds, then exits."""
        if self._proc is not None and self._proc.poll() is None and not self._asked:
            self._asked = True
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 120.0) -> None:
        """:meth:`ask_stop`, then SIGKILL after ``timeout_s``; raises
        :class:`FeedProcessFailed` when it did not end cleanly."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self.ask_stop()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("real-time tile feed #%d: process %d still running after %.0f s; "
                            "killing it (its tiles are replayed on the next start)",
                            self.index, proc.pid, timeout_s)
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            raise FeedProcessFailed(f"real-time tile feed #{self.index} (process {proc.pid}) "
                                    f"exited with {proc.returncode}; see its log above")


def main(argv: list[str] | None = None) -> int:
    """Run tile feed #``--index`` of ``--feeds`` until SIGTERM (or the driver's death)."""
    from pipelines.signals import GracefulStop
    from pipelines.streaming.offline_process import die_with_parent
    from pipelines.streaming.realtime import TileFeed

    parser = argparse.ArgumentParser(prog="python -m pipelines.streaming.feed_process",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--feeds", type=int, required=True)
    parser.add_argument("--new-checkpoint", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [tile feed #{args.index}] %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:  # as the driver's: while Kafka is away
        handler.addFilter(CollapseRepeats(("kafka",)))
    die_with_parent()
    settings = Settings()
    started = time.monotonic()
    with GracefulStop(f"real-time tile feed #{args.index}",
                      finishing="writing the tiles the topic holds") as stop:
        # the driver's death (the parent-death signal) stops it after its running flush: the
        # topic keeps growing once a new driver starts, so a drain could run beside that
        # driver's own feed #k indefinitely
        feed = TileFeed(settings, new_checkpoint=args.new_checkpoint, index=args.index,
                        feeds=args.feeds, stop=stop.requested,
                        abandoned=lambda: stop.signal_name == "parent died")
        try:
            feed.run()
        except Exception as exc:  # noqa: BLE001 - logged by the feed; the exit code tells the driver
            log.error("stopped after %.0f s: %s", time.monotonic() - started, exc)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
