"""Real-time Mode's feature snapshots: written by the Parquet sinks' process, not the online one.

The tile feed asks for a snapshot when its clock enters a new tile (a Lua script records
the request in a Redis hash, atomically with the new boundary:
:data:`pipelines.streaming.realtime._SNAPSHOT_DUE_LUA`). Writing one reads every entity
touched in the last slide from Redis and runs small Spark jobs. In the Real-time driver
those jobs took the cores from the Real-time query's tasks and the feed's thread at
every slide boundary: at 1,000 events/s on 2 cores, snapshots off by hand gave p99
0.34 and 0.81 s, on 0.67 and 0.94 s (back-to-back pairs), and a probe that met a
snapshot and a Parquet batch together took 1.5-3 s. A request is only a Redis hash
field, so any process can write it: ``shopstream stream --offline-only
--realtime-snapshots`` (:mod:`pipelines.streaming.offline_process`, niced) polls the
hash and writes them (:class:`SnapshotPoller`), so they take only the cycles the
online path leaves.

Who writes which, so that every request is written exactly once:

* while the job runs, the sinks' process (one at a time, in a thread of its own);
* when the sinks' process stops (SIGTERM from the driver, the end of ``--until-idle``,
  the driver's death), it first writes what is asked for by then;
* the driver stops the sinks' process *before* its Real-time query and feed, so the
  feed's last flush may ask for one more: the driver writes those itself, once its
  query has stopped and its task slots are free (:meth:`AskedSnapshots.drain`);
* a request a crash or a Redis outage interrupted stays in the hash: the next start
  writes it, and :func:`pipelines.streaming.snapshot.write_served_snapshot` keeps a
  half-written one from being added twice.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from pipelines.settings import Settings
from pipelines.spark import detached
from pipelines.stream import is_redis_outage, redis_outage_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["AskedSnapshots", "SnapshotPoller", "rt_snapshot_keys", "POLL_SECONDS"]

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
"""How often the sinks' process looks for snapshots asked for (one ``HGETALL`` of a
hash of a few fields): a snapshot starts at most this long after its slide ends."""
_GROUP = "shopstream-rt-snapshot"


def rt_snapshot_keys() -> tuple[str, str]:
    """The tile of the last snapshot boundary, and the hash of snapshots asked for and
    not written yet (tile -> first tile covered)."""
    from features import online_keys

    return (online_keys.key("stream", "rt", "snapshot-tile"),
            online_keys.key("stream", "rt", "snapshots-due"))


class AskedSnapshots:
    """The snapshots asked for in Redis, written one at a time by a thread of this process
    (Spark jobs of their own group, so a stopping query does not cancel them).

    ``where`` names the writer in the log line of each snapshot. Not thread-safe: one
    thread calls :meth:`step`, :meth:`drain` and :meth:`close`.
    """

    def __init__(self, settings: Settings, spark: SparkSession, where: str) -> None:
        from pipelines.connections import redis_kwargs

        self.settings = settings
        self.spark = spark
        self.where = where
        self.redis_kwargs = redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms,
                                                                  5000))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rt-snapshot")
        self._running: dict[int, Future[None]] = {}  # tile -> its run, while it runs
        self._client: Any = None
        self.written = 0

    @property
    def busy(self) -> bool:
        """A snapshot is being written."""
        return bool(self._running)

    def asked(self) -> dict[int, int]:
        """The snapshots asked for and not written yet: tile -> the first tile covered."""
        import redis

        if self._client is None:
            self._client = redis.Redis(**self.redis_kwargs)
        try:
            asked = self._client.hgetall(rt_snapshot_keys()[1])
        except redis.RedisError:
            self._client.close()
            self._client = None  # a new connection next time
            raise
        return {int(tile): int(first) for tile, first in asked.items()}

    def step(self) -> int:
        """Collect the finished snapshot (raising its error unless Redis was unreachable:
        then it is still asked for, and written by a later step); start those asked
        for. Returns how many are asked for and not written (running included)."""
        self._collect()
        asked = self.asked()
        for tile in sorted(asked):
            if tile not in self._running:
                self._running[tile] = self._pool.submit(
                    detached(self.spark, self._write, _GROUP), tile, asked[tile])
        return len(asked)

    def _collect(self) -> None:
        for tile, future in list(self._running.items()):
            if future.done():
                del self._running[tile]
                if (outage := redis_outage_of(future)) is not None:
                    log.warning("real-time: the snapshot of tile %d was not written (Redis "
                                "unreachable: %s); trying again", tile, outage)
                else:
                    self.written += 1

    def drain(self, timeout_s: float) -> bool:
        """Write every snapshot asked for, then return True; False when Redis is
        unreachable or ``timeout_s`` passed first (those left are written by the next
        start)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not self.step():
                    return True
            except Exception as exc:
                if not is_redis_outage(exc):
                    raise
                log.warning("real-time: snapshots asked for are left for the next start (Redis "
                            "unreachable: %s)", exc)
                return False
            wait(list(self._running.values()), timeout=max(0.0, deadline - time.monotonic()),
                 return_when=FIRST_COMPLETED)
        log.warning("real-time: snapshots still asked for after %.0f s are left for the next "
                    "start", timeout_s)
        return False

    def close(self) -> None:
        """Wait for the snapshot under way; one Redis interrupted is left for the next start."""
        self._pool.shutdown(wait=True)
        for tile, future in sorted(self._running.items()):
            if (outage := redis_outage_of(future)) is not None:
                log.warning("real-time: the snapshot of tile %d was not written (Redis "
                            "unreachable: %s); the next start writes it", tile, outage)
        self._running = {}
        if self._client is not None:
            self._client.close()
            self._client = None

    def _write(self, tile: int, first: int) -> None:
        import redis

        from pipelines.streaming.snapshot import write_served_snapshot

        slide = self.settings.feature_slide_seconds
        kwargs = self.redis_kwargs

        def done() -> None:
            client = redis.Redis(**kwargs)
            try:
                client.hdel(rt_snapshot_keys()[1], str(tile))
            finally:
                client.close()

        log.info("real-time: feature snapshot of the tiles %d..%d (%s)", first, tile - slide,
                 self.where)
        write_served_snapshot(self.spark, self.settings, kwargs, range(first, tile, slide),
                              f"rt-{tile}", done)


class SnapshotPoller:
    """:class:`AskedSnapshots` polled every :data:`POLL_SECONDS` by a thread: what the
    Parquet sinks' process runs beside its micro-batch query in Real-time Mode.

    A Redis outage is waited out (the request stays in Redis); any other failure stops
    the poller and is raised by :meth:`check`, so the process fails with it.
    """

    def __init__(self, settings: Settings, spark: SparkSession,
                 where: str = "Parquet sinks' process") -> None:
        self.snapshots = AskedSnapshots(settings, spark, where)
        self.grace_seconds = settings.stream_stop_grace_seconds
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rt-snapshot-poll", daemon=True)

    def start(self) -> None:
        from pipelines.streaming.snapshot import warm_reader

        warm_reader()
        self._thread.start()

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"real-time feature snapshots failed: {self._error}") from self._error

    def stop(self, drain: bool = True) -> None:
        """Stop polling; with ``drain``, first write what is asked for by now (within the
        stop grace), else only finish the one under way."""
        self._stop.set()
        self._thread.join()
        try:
            if drain and self._error is None:
                self.snapshots.drain(self.grace_seconds)
        finally:
            self.snapshots.close()
        self.check()

    def _run(self) -> None:
        outage_logged = False
        while not self._stop.is_set():
            try:
                self.snapshots.step()
                outage_logged = False
            except Exception as exc:
                if not is_redis_outage(exc):
                    log.error("real-time feature snapshots failed: %s", exc)
                    self._error = exc
                    return
                if not outage_logged:
                    log.warning("real-time snapshots: Redis unreachable (%s); polling on", exc)
                    outage_logged = True
            self._stop.wait(POLL_SECONDS)
