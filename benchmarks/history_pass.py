"""Live micro-batches after a day of history: what the stream's per-key pass costs a batch.

Each micro-batch's online update (:meth:`pipelines.stream_state.TileStore.apply`: the
batch's tiles folded, merged into the tile store in Redis, the touched users' and items'
features computed as of the batch's clock and written in Feast's layout) reads what it
needs of each touched key's history. A store whose users were active all day holds a tile
per user and minute, up to 1,440 in the 24h window; if a batch read and summed all of
them, a live batch would cost more with every hour the job has run. Users and items keep
a base over their closed tiles (:class:`pipelines.streaming.pyfeatures.UserBase`,
:class:`~pipelines.streaming.pyfeatures.ItemBase`), so a batch reads the base, the open
tiles and the tiles the base moves over.

Setup, not timed: a redis-server and a Spark session (``local[2]``) of the benchmark's
own; ``--hours`` of history for ``--users`` users, one event per user and minute (the
generator's event mix, 2,000 items, 40 categories), applied as the stream applies it, in
micro-batches of two hours each.

Measured, ``--live`` batches of ``--events`` events each (a second of traffic: at 1,000
events/s), the clock moving a second a batch, on three stores in turn, batch by batch
(so an hour's noise falls on all three alike):

- **after a day**: the store with the history;
- **an empty store**: the same batches on a Redis of their own with no history (each
  user's first tiles), what a batch costs a job that has just started;
- **the peer, raw Redis**: the rows the pass wrote for the batch's touched users and items
  (read back beforehand, not timed), written again with one pipelined ``HSET`` each to
  the history's redis-server: the cost of writing the batch's features alone, with no
  tiles read and nothing computed.

Reported per store: the median and p90 wall time of a live batch (the first
``WARM_BATCHES`` are not counted: Python workers and the JVM warming up), its Python
workers' and redis-server's CPU; the ratios after a day / empty store (what a day of
history costs a live batch: 1.0 means nothing) and after a day / raw Redis.

Usage: ``python -m benchmarks.history_pass [--users N] [--hours H] [--live L] [--events E]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    BenchResult,
    bench_settings,
    child_pids,
    plot_series,
    process_command,
    process_tree_cpu_s,
    reaped_children_cpu_s,
)

__all__ = ["main"]

WARM_BATCHES = 5
"""Live batches not counted (each store's first: workers and the JVM warming up)."""
HISTORY_BATCH_HOURS = 2
"""Hours of history per setup micro-batch."""
ITEMS, CATEGORIES = 2000, 40
DAY = "shopstream pass, after the history"
EMPTY = "shopstream pass, an empty store"
RAW = "raw Redis: one pipelined HSET per touched user and item (peer)"


def _say(text: str) -> None:
    print(f"[history pass] {text}", flush=True)


def _events(spark: Any, first_s: float, span_s: float, count: int, seed: int, users: int) -> Any:
    """``count`` events spread evenly over ``span_s`` seconds from ``first_s`` (epoch s),
    users, items and categories drawn by hash: a view, view, view, add to cart, purchase
    mix, priced when not a view."""
    step = span_s / count
    return spark.sql(f"""
      SELECT concat('e{seed}-', id) AS event_id,
             element_at(array('view', 'view', 'view', 'add_to_cart', 'purchase'),
                        cast(pmod(hash(id, {seed}), 5) + 1 AS int)) AS event_type,
             timestamp_micros(cast(({first_s} + id * {step}) * 1000000 AS bigint)) AS event_time,
             concat('u', pmod(hash(id, {seed} + 1), {users})) AS user_id,
             concat('s', pmod(hash(id, {seed} + 1), {users})) AS session_id,
             concat('i', pmod(hash(id, {seed} + 2), {ITEMS})) AS item_id,
             concat('c', pmod(hash(id, {seed} + 3), {CATEGORIES})) AS category_id,
             element_at(array('UK', 'FR', 'DE'), cast(pmod(hash(id, {seed} + 4), 3) + 1 AS int))
               AS region,
             CAST(CASE WHEN pmod(hash(id, {seed}), 5) >= 3 THEN 9.99 + pmod(id, 7) END AS double)
               AS price,
             cast(1 AS int) AS quantity, 'web' AS device
      FROM range({count})""")


def _workers_cpu_s() -> float:
    """CPU seconds of this process's Python workers (``pyspark.daemon`` under its JVM)."""
    total = 0.0
    todo = list(child_pids(os.getpid()))
    while todo:
        pid = todo.pop()
        command = process_command(pid)
        if "pyspark.daemon" in command and not command.split(" ", 1)[0].endswith("java"):
            total += process_tree_cpu_s(pid) + reaped_children_cpu_s(pid)
        elif command.split(" ", 1)[0].endswith("java"):
            todo.extend(child_pids(pid))
    return total


class _Store:
    """One Redis (its server, a client) and the tile store writing to it."""

    def __init__(self, settings: Any) -> None:
        from pipelines.connections import redis_client, redis_kwargs
        from pipelines.infra import RedisServer
        from pipelines.stream_state import TileStore

        self.server = RedisServer(settings)
        self.server.start()
        self.client = redis_client(settings, timeout_ms=30_000)
        self.client.flushdb()
        self.tiles = TileStore(redis_kwargs(settings, timeout_ms=30_000), slide_seconds=60,
                               last_items_n=settings.feature_last_items_n,
                               top_n=settings.feature_top_n, long_window_seconds=86_400,
                               ttl_seconds=7 * 86_400, dirty_ttl_seconds=3600)
        self.lateness_us = settings.feature_allowed_lateness_seconds * 1_000_000
        self.clock_us: int | None = None
        self.batch_id = 0

    def redis_cpu_s(self) -> float:
        pid = self.server.process.pid
        return process_tree_cpu_s(pid) if pid else 0.0

    def apply(self, spark: Any, events: Any, clock_us: int) -> None:
        """One micro-batch as the stream runs it: ``open_from`` from the clock before."""
        open_from = (None if self.clock_us is None
                     else self.tiles.tile_of(self.clock_us - self.lateness_us))
        self.tiles.apply(spark, events, batch_id=self.batch_id, as_of_us=clock_us,
                         open_from=open_from)
        self.clock_us = clock_us
        self.batch_id += 1

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def _timed(store: _Store, step: Callable[..., None], *args: Any) -> dict[str, float]:
    """Wall time of ``step(*args)``, with the Python workers' and ``store``'s Redis's CPU."""
    workers, redis_cpu, started = _workers_cpu_s(), store.redis_cpu_s(), time.perf_counter()
    step(*args)
    return {"wall_s": time.perf_counter() - started, "workers_s": _workers_cpu_s() - workers,
            "redis_s": store.redis_cpu_s() - redis_cpu}


def _feature_rows(client: Any, batch: list[Any]) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The Feast hashes of a batch's touched users and items, as the pass wrote them."""
    from features.feast_layout import ITEM_STATS, USER_ACTIVITY

    keys = sorted({USER_ACTIVITY.redis_key(r["user_id"]) for r in batch}
                  | {ITEM_STATS.redis_key(r["item_id"]) for r in batch})
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    return [(k, v) for k, v in zip(keys, pipe.execute(), strict=True) if v]


def _raw_write(client: Any, rows: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
    pipe = client.pipeline(transaction=False)
    for key, mapping in rows:
        pipe.hset(key, mapping=mapping)
    pipe.execute()


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    counted = runs[WARM_BATCHES:] or runs
    walls = sorted(r["wall_s"] for r in counted)
    return {"batches": len(counted), "p50_s": statistics.median(walls),
            "p90_s": walls[min(len(walls) - 1, int(len(walls) * 0.9))],
            "workers_cpu_s": statistics.median(r["workers_s"] for r in counted),
            "redis_cpu_s": statistics.median(r["redis_s"] for r in counted)}


def main(argv: list[str] | None = None) -> BenchResult:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1000, help="users in the history")
    parser.add_argument("--hours", type=int, default=24, help="hours of history")
    parser.add_argument("--live", type=int, default=30, help="live batches per store")
    parser.add_argument("--events", type=int, default=1000, help="events per live batch")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where plots go")
    args = parser.parse_args(argv)
    if args.hours < HISTORY_BATCH_HOURS or args.hours % HISTORY_BATCH_HOURS:
        parser.error(f"--hours must be a multiple of {HISTORY_BATCH_HOURS}")
    if args.live <= WARM_BATCHES:
        parser.error(f"--live must be over {WARM_BATCHES} (the first ones warm up)")

    from pipelines.spark import spark_session

    # pyspark starts its Python workers with PYSPARK_PYTHON, read when the context starts
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = bench_settings("history_pass", spark_shuffle_partitions=2)
    empty_settings = bench_settings("history_pass_empty")
    spark = spark_session(settings, app_name="bench-history-pass")
    day, empty = _Store(settings), _Store(empty_settings)
    history_events = args.users * 60 * args.hours
    result = BenchResult(
        "history_pass",
        f"Micro-batch online pass after {args.hours} h of history ({args.users:,} users, "
        f"a tile per user and minute), live batches of {args.events:,} events")
    try:
        start_s = int(time.time()) - args.hours * 3600 - 60
        _say(f"history: {history_events:,} events over {args.hours} h for {args.users:,} users")
        per_batch = history_events * HISTORY_BATCH_HOURS // args.hours
        for n, first in enumerate(range(start_s, start_s + args.hours * 3600,
                                        HISTORY_BATCH_HOURS * 3600)):
            events = _events(spark, first, HISTORY_BATCH_HOURS * 3600, per_batch, n, args.users)
            started = time.perf_counter()
            day.apply(spark, events, (first + HISTORY_BATCH_HOURS * 3600) * 1_000_000 - 1)
            _say(f"  history batch {n + 1}: {per_batch:,} events in "
                 f"{time.perf_counter() - started:.1f} s")
        tiles = sum(1 for _ in day.client.scan_iter("ss:v1:tiles:user:*", count=1000))
        _say(f"history in: {tiles:,} users' tile hashes")
        now_s = start_s + args.hours * 3600
        runs: dict[str, list[dict[str, float]]] = {DAY: [], EMPTY: [], RAW: []}
        for i in range(args.live):
            events = _events(spark, now_s + i, 1.0, args.events, 1000 + i, args.users).cache()
            batch = events.select("user_id", "item_id").collect()
            clock_us = (now_s + i + 1) * 1_000_000 - 1
            runs[DAY].append(_timed(day, day.apply, spark, events, clock_us))
            runs[EMPTY].append(_timed(empty, empty.apply, spark, events, clock_us))
            runs[RAW].append(_timed(day, _raw_write, day.client, _feature_rows(day.client, batch)))
            events.unpersist()
            if (i + 1) % 10 == 0 or i + 1 == args.live:
                _say(f"  live batch {i + 1}/{args.live}: " + ", ".join(
                    f"{name} {r[-1]['wall_s']:.3f} s" for name, r in runs.items()))
        summary = {name: _summary(r) for name, r in runs.items()}
        for name, s in summary.items():
            result.rows.append({"system": name, "live batches": s["batches"],
                                "p50_s": round(s["p50_s"], 3), "p90_s": round(s["p90_s"], 3),
                                "Python workers CPU s": round(s["workers_cpu_s"], 3),
                                "redis-server CPU s": round(s["redis_cpu_s"], 3)})
        day_p50 = summary[DAY]["p50_s"]
        result.ratios["live batch p50: after the history / an empty store"] = (
            day_p50 / summary[EMPTY]["p50_s"])
        result.ratios["live batch p50: after the history / raw Redis writing its rows"] = (
            day_p50 / summary[RAW]["p50_s"])
        result.notes.append(
            f"history: {history_events:,} events, {args.hours // HISTORY_BATCH_HOURS} "
            f"micro-batches of {HISTORY_BATCH_HOURS} h, {tiles:,} users; live: the clock a "
            f"second a batch; the first {WARM_BATCHES} batches of each store not counted; "
            "raw Redis rewrites the Feast hashes the pass wrote for the batch's touched users "
            "and items (one pipelined HSET each)")
        series = {name: ([float(n) for n in range(len(r))], [x["wall_s"] for x in r])
                  for name, r in runs.items()}
        path = plot_series(series, args.results_dir / "history_pass.png",
                           title="Live micro-batch online update, seconds (x: batch number)",
                           ylabel="seconds")
        result.plots.append(str(path))
        for name, s in summary.items():
            _say(f"{name}: p50 {s['p50_s']:.3f} s, p90 {s['p90_s']:.3f} s, workers "
                 f"{s['workers_cpu_s']:.3f} s, redis {s['redis_cpu_s']:.3f} s CPU")
    finally:
        day.close()
        empty.close()
        spark.stop()
    return result


if __name__ == "__main__":
    print(main().markdown())
