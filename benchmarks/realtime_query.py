"""Real-time query: its JVM's CPU at a fixed event rate, by the shape of what it sends.

The Real-time query (``shopstream stream --mode realtime``) reads the events topic,
validates, deduplicates within the watermark and sends to a Kafka topic for the tile feed.
Two shapes of it, on the same live traffic:

- **tiles** (what the stream runs with ``SHOPSTREAM_STREAM_REALTIME_SHAPE=tiles``,
  :func:`pipelines.streaming.realtime.realtime_tiles`):
  one streaming aggregation (``keyed_tiles``) in update mode; every event sends the whole
  row of each tile it changes.
- **role rows** (:func:`pipelines.streaming.realtime.realtime_roles`): no aggregation; each
  event once per role (user, item, sale), which a feed folds into the same tiles
  (``pyfeatures.role_row`` / ``merge_keyed``; ``tests/integration/test_stream_state.py``):
  what the stream runs by default (``SHOPSTREAM_STREAM_REALTIME_SHAPE=roles``,
  :mod:`pipelines.streaming.folding`).

The peer, **raw Kafka**: a plain kafka-python consumer reads the same events and parses
each one's JSON, in a process of its own: the cost of only reading the events.

Every run is a process of its own (a fresh driver and JVM); the shapes alternate
(``--repeats`` each). A run waits ``--warmup`` seconds (the query's start and its JIT),
then reads its JVM's CPU from ``/proc`` over ``--window`` seconds. Traffic: ``shopstream
generate --rate R`` (the generator's store and mix) for the whole benchmark.

Usage: ``python -m benchmarks.realtime_query [--rate R] [--repeats N] [--warmup S] [--window S]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    BenchResult,
    bench_settings,
    plot_bars,
    process_cpu_s,
    process_tree_cpu_s,
)

__all__ = ["main"]

SHAPES = {"tiles": "tiles (keyed_tiles aggregation)",
          "roles": "role rows (no aggregation; what the stream runs by default)"}
TOPIC_PARTITIONS = 2


def _say(text: str) -> None:
    print(f"[realtime query] {text}", flush=True)


def _run_query(shape: str, warmup_s: float, window_s: float) -> dict[str, Any]:
    """In a child process: start one shape's query on the live topic, then measure."""
    from pipelines.settings import Settings
    from pipelines.spark import spark_session
    from pipelines.streaming.realtime import realtime_roles, realtime_tiles, tile_sink_options

    settings = Settings()
    spark = spark_session(settings, "bench-realtime-query", latency=True)
    jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # as start_realtime runs it
    build = realtime_tiles if shape == "tiles" else realtime_roles
    checkpoint = Path(settings.data_dir) / "checkpoints" / f"bench-{shape}-{uuid.uuid4().hex[:8]}"
    query = (build(spark, settings, {"startingOffsets": "latest"}).writeStream
             .queryName(f"bench-{shape}").outputMode("update").format("kafka")
             .options(**tile_sink_options(settings))
             .option("checkpointLocation", str(checkpoint))
             .trigger(realTime=f"{settings.stream_realtime_checkpoint_seconds} seconds").start())
    try:
        time.sleep(warmup_s)
        before, started = process_cpu_s(jvm), time.monotonic()
        time.sleep(window_s)
        cores = (process_cpu_s(jvm) - before) / (time.monotonic() - started)
        progress = query.lastProgress  # an epoch's (one per checkpoint interval)
        rate = progress.get("processedRowsPerSecond") if progress else None
        return {"cores": cores, "rows_per_s": rate, "error": str(query.exception() or "")}
    finally:
        query.stop()
        spark.stop()


def _run_peer(window_s: float) -> dict[str, Any]:
    """In a child process: a plain consumer of the events topic, from its end, parsing each
    record's JSON, over ``window_s`` (after a few seconds to join)."""
    import orjson

    from pipelines.connections import kafka_consumer
    from pipelines.settings import Settings

    settings = Settings()
    consumer = kafka_consumer(settings, settings.kafka_topic_events, auto_offset_reset="latest",
                              enable_auto_commit=False)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        consumer.poll(timeout_ms=200)
    before, started, count = process_cpu_s(os.getpid()), time.monotonic(), 0
    while time.monotonic() - started < window_s:
        for records in consumer.poll(timeout_ms=100).values():
            for record in records:
                orjson.loads(record.value)
                count += 1
    seconds = time.monotonic() - started
    consumer.close()
    return {"cores": (process_cpu_s(os.getpid()) - before) / seconds,
            "rows_per_s": count / seconds, "error": ""}


def _child(settings: Any, role: str, args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.streaming.realtime import required_slots

    slots = required_slots(settings)
    env = settings.model_copy(update={"spark_master": f"local[{slots}]"}).child_env()
    env["PYSPARK_PYTHON"] = sys.executable
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.realtime_query", "--child", role,
         "--warmup", str(args.warmup), "--window", str(args.window)],
        env=env, capture_output=True, text=True, timeout=args.warmup + args.window + 300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{role} run failed ({out.returncode}): {out.stderr[-2000:]}")
    measured = json.loads(lines[-1])
    if measured["error"]:  # a query that failed used less CPU: no figure for it
        raise RuntimeError(f"{role} query failed: {measured['error'][:2000]}")
    return measured


def main(argv: list[str] | None = None) -> BenchResult:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1500.0, help="events/s sent")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each, alternating")
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds before a window")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where plots go")
    parser.add_argument("--child", choices=[*SHAPES, "peer"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if min(args.rate, args.repeats, args.warmup, args.window) <= 0:
        parser.error("--rate, --repeats, --warmup and --window must be positive")
    if args.child:
        measured = (_run_peer(args.window) if args.child == "peer"
                    else _run_query(args.child, args.warmup, args.window))
        print(json.dumps(measured), flush=True)
        return BenchResult(name="realtime_query_child", title=args.child)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pipelines.infra import KafkaBroker
    from pipelines.streaming.realtime import ensure_topic

    tag = uuid.uuid4().hex[:8]
    settings = bench_settings("realtime_query", kafka_topic_partitions=TOPIC_PARTITIONS,
                              kafka_topic_events=f"bench.rq.events.{tag}",
                              kafka_topic_rt_tiles=f"bench.rq.out.{tag}")
    broker = KafkaBroker(settings)
    broker.start()
    result = BenchResult(
        name="realtime_query",
        title=f"Real-time query: its JVM's CPU at {args.rate:,.0f} events/s, by what it sends",
        targets={"role rows": "well under the tiles' CPU (the feed then folds the rows)"})
    sender = None
    try:
        ensure_topic(settings)  # the broker made the events topic at its start
        env = settings.child_env()
        sender = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "generate", "--rate", str(args.rate),
             "--duration", str(24 * 3600)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        broker_before, sender_before, t0 = (process_tree_cpu_s(broker.process.pid),
                                            process_tree_cpu_s(sender.pid), time.monotonic())
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in (*SHAPES, "peer")}
        order = [s for r in range(args.repeats)
                 for s in ((*SHAPES, "peer") if r % 2 == 0 else ("peer", *reversed(SHAPES)))]
        for i, role in enumerate(order, 1):
            measured = _child(settings, role, args)
            runs[role].append(measured)
            _say(f"run {i}/{len(order)}, {role}: {measured['cores']:.3f} cores"
                 + (f" ({measured['rows_per_s']:,.0f} events/s)" if measured["rows_per_s"]
                    else " (no epoch ended yet)"))
        wall = time.monotonic() - t0
        median = {k: statistics.median(m["cores"] for m in v) for k, v in runs.items()}
        for role, label in (*SHAPES.items(), ("peer", "raw Kafka: plain consumer + JSON parse")):
            result.rows.append({
                "system": label, "runs": len(runs[role]),
                "median_cores": median[role],
                "ms_cpu_per_event": median[role] / args.rate * 1000,
                "events_per_s": statistics.median(m["rows_per_s"] or 0.0 for m in runs[role]),
                "runs_cores": ", ".join(f"{m['cores']:.3f}" for m in runs[role])})
        result.ratios["CPU: tiles / raw Kafka"] = median["tiles"] / median["peer"]
        result.ratios["CPU: role rows / raw Kafka"] = median["roles"] / median["peer"]
        result.ratios["CPU: tiles / role rows"] = median["tiles"] / median["roles"]
        result.notes.append(
            f"sender {(process_tree_cpu_s(sender.pid) - sender_before) / wall:.2f} cores, "
            f"broker {(process_tree_cpu_s(broker.process.pid) - broker_before) / wall:.2f} "
            f"cores over the benchmark; {args.warmup:.0f} s warm-up, {args.window:.0f} s "
            f"windows, {os.cpu_count()} cores")
        plot = plot_bars(["CPU (cores)"], {"cores": {
            label: [median[role]] for role, label in
            (("tiles", "tiles"), ("roles", "role rows"), ("peer", "raw Kafka"))}},
            args.results_dir / "realtime_query.png",
            title=f"Real-time query JVM CPU at {args.rate:,.0f} events/s")
        result.plots.append(str(plot))
    finally:
        if sender is not None:
            sender.terminate()
            sender.wait(30)
        broker.stop()
    return result


if __name__ == "__main__":
    print(main(sys.argv[1:]).markdown())
