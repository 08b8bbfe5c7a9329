"""Streaming: sustained events/s and feature freshness of ``shopstream stream`` at ``local[2]``.

Three measurements in one run, on this project's Kafka broker and redis-server:

1. **Throughput** -- a backlog of generated events (2 % malformed, duplicates),
   drained with ``--available-now``: events/s over the micro-batches (Spark
   start-up excluded), full pipeline (quarantine, dedup, raw Parquet, tiles,
   Feast-layout features, top sellers, snapshots). Each system drains it
   ``--drains`` times in a row; the drains after the first are its sustained
   rate, the JVM's JIT done with the job's code. The same backlog drained by
   Feast's own ``SparkKafkaProcessor`` (a much cheaper transformation: running
   counters, no validation, no offline sink) is the same-run peer. Each system
   first drains a smaller backlog of its own (``--cold-events``), reported as its
   cold start and left out of the ratios: a stream job runs for days in a warm
   JVM, and the first run of a fresh driver (JIT, Python workers, first state
   files) took about twice as long per event; without it the peer, which runs
   second, would have been measured warm and shopstream cold.
2. **Freshness, micro-batch** -- the stream runs with its trigger interval while
   background traffic flows at ``--rate`` events/s; every 0.5 s a probe purchase
   (event time = now) of a fresh item is sent and the time until Redis shows it
   (the item's ``purchases_1h`` in Feast's layout) is measured: event time ->
   readable in Redis, end to end.
3. **Freshness, Real-time Mode** -- the same probes with ``stream_mode=realtime``
   (the online path in Spark's Real-time Mode), run by ``shopstream stream`` as a
   driver of its own at ``local[N]``, N the task slots the mode holds at once.

Usage: ``python -m benchmarks.streaming_throughput [--quick] [--events N] [--rate R]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    BenchResult,
    bench_settings,
    child_pids,
    plot_series,
    process_command,
    process_cpu_s,
    process_tree_cpu_s,
    reaped_children_cpu_s,
    summarize,
    write_result,
)

__all__ = ["main"]

log = logging.getLogger(__name__)


def _topic(settings: Any, name: str) -> None:
    from kafka.admin import NewTopic

    from pipelines.connections import kafka_admin

    admin = kafka_admin(settings)
    try:
        admin.create_topics([NewTopic(name, settings.kafka_topic_partitions, 1)])
    finally:
        admin.close()


def traffic(users: int | None = None, items: int | None = None,
            random_ids: bool = False) -> Any:
    """The generator's config of the bench's traffic: the generator's store by default
    (10,000 users, 2,000 items), or one of the given size; ``random_ids``: UUIDv4 event
    ids instead of sequence numbers."""
    from pipelines.clickstream_model import GeneratorConfig

    sizes = {k: v for k, v in (("users", users), ("items", items)) if v}
    return GeneratorConfig(seed=11, bad_fraction=0.02, random_ids=random_ids, **sizes)


def _backlog(settings: Any, topic: str, count: int, config: Any = None,
             rate: float | None = None) -> int:
    """Generated traffic ending about now (so nothing is late or in the future).

    ``rate``: events per second of event time (default the generator's nominal 1,000): a
    backlog of a fast stream spans less event time, so its users and items fall into
    fewer tiles.
    """
    from pipelines.generate import generate_records
    from pipelines.producer import KafkaSink

    config = config or traffic()
    rate = rate or config.nominal_rate
    start_ms = int(time.time() * 1000) - int(count / rate * 1000)
    sink = KafkaSink(settings, topic)
    batch: list[tuple[bytes | None, bytes]] = []
    for record in generate_records(config, start_ms=start_ms, count=count, rate=rate):
        batch.append((record.key, record.value))
        if len(batch) == 5000:
            sink.send_batch(batch)
            batch = []
    if batch:
        sink.send_batch(batch)
    sink.close()
    return count


def _fresh_checkpoints(settings: Any, topic: str) -> str:
    """A checkpoint folder of its own per query run (never one left by another topic or run)."""
    return str(Path(settings.data_dir) / "checkpoints" / topic)


def _empty_redis(settings: Any) -> None:
    """Start a run on an empty Redis, as a new deployment does.

    The bench's Redis keeps its data between runs (its data dir persists), and what it
    holds changes the work: tiles left by earlier runs are read and merged into, and
    before the tiles' markers named the checkpoint's run, an earlier run's markers made
    the next run skip every key they covered (the micro-batch freshness runs did a
    fraction of the online work).
    """
    from pipelines.connections import redis_client

    client = redis_client(settings, timeout_ms=30_000)
    try:
        client.flushdb()
    finally:
        client.close()


def _throughput(settings: Any, spark: Any, count: int, config: Any = None,
                rate: float | None = None, drains: int = 1) -> list[dict[str, Any]]:
    """Drain one backlog ``drains`` times in a row, each time from a fresh checkpoint into
    an empty Redis, as a new deployment would; one result per drain (the first also
    holds the plain consumer's read of the topic)."""
    from benchmarks.raw_peers import kafka_consumer_rate

    topic = f"bench.tp.{uuid.uuid4().hex[:8]}"
    _topic(settings, topic)
    _backlog(settings, topic, count, config, rate)
    raw = kafka_consumer_rate(settings, topic, count)
    _say(f"plain Kafka consumer: {raw['events']:,} events at {raw['events_per_s']:,.0f}/s")
    runs = []
    for drain in range(drains):
        run_settings = settings.model_copy(update={
            "kafka_topic_events": topic,
            "checkpoint_dir": _fresh_checkpoints(settings, f"{topic}.{drain}")})
        if drains > 1:
            _say(f"drain {drain + 1} of {drains}")
        runs.append({**_drain(spark, run_settings), "raw": raw})
    return runs


def _drain(spark: Any, run_settings: Any) -> dict[str, Any]:
    from pipelines.stream import StreamOptions, run_stream

    _empty_redis(run_settings)
    cpu = DrainCpu(run_settings)
    started = time.monotonic()
    recorder = run_stream(run_settings, spark=spark,
                          options=StreamOptions(stop="available_now"))
    wall = time.monotonic() - started
    cpu_s = cpu.stop()
    batches = list(recorder.history)
    busy = sum(m.batch_duration_ms for m in batches) / 1000
    rows = sum(m.input_rows for m in batches)
    warm = warm_rate([(m.input_rows, m.batch_duration_ms) for m in batches])
    _say(f"shopstream stream: {rows:,} events in {len(batches)} batches, {busy:.1f} s busy "
         f"({rows / busy if busy else 0:,.0f}/s; after the first batch "
         f"{f'{warm:,.0f}/s' if warm else 'n/a'}), {wall:.0f} s wall")
    _say(drain_cpu_note("the drain (shopstream stream)", cpu_s, rows))
    phases = {name: sum(getattr(m, f"{name}_s") or 0.0 for m in batches)
              for name in ("read", "online", "offline")}
    return {"events": rows, "batches": len(batches), "busy_s": busy, "wall_s": wall,
            "events_per_s": rows / busy if busy else 0.0, "warm_events_per_s": warm,
            "phases": phases, "cpu_s": cpu_s,
            "series": [(m.batch_id, m.processed_rows_per_second) for m in batches]}


def sustained(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Events/s over the drains after the first, from ``events`` and ``busy_s`` per
    drain; ``None`` with fewer than two.

    A stream job runs for days in a warm JVM. The first full drain after the cold
    start still pays for the JIT compiling Spark's code (about 4,500 compile tasks
    in a 400k drain, their threads a quarter of the JVM's CPU); the drains after it
    are the job as it runs for days.
    """
    later = runs[1:]
    busy = sum(r["busy_s"] for r in later)
    if not later or busy <= 0:
        return None
    events = sum(r["events"] for r in later)
    return {"events": events, "batches": sum(r["batches"] for r in later), "busy_s": busy,
            "events_per_s": events / busy, "drains": len(later)}


def _stream_row(system: str, run: dict[str, Any]) -> dict[str, Any]:
    """A result row of one :func:`_throughput` run."""
    return {"system": system, "events": run["events"], "batches": run["batches"],
            "busy_s": run["busy_s"], "events_per_s": run["events_per_s"],
            "events_per_s_after_first_batch": run["warm_events_per_s"]}


def _sustained_row(system: str, run: dict[str, Any]) -> dict[str, Any]:
    """A result row of :func:`sustained`: the drains after a system's first."""
    drains = "drain 2" if run["drains"] == 1 else f"drains 2-{run['drains'] + 1}"
    return {"system": f"{system}, sustained: {drains} of the same backlog, warm driver",
            "events": run["events"], "batches": run["batches"],
            "busy_s": run["busy_s"], "events_per_s": run["events_per_s"],
            "events_per_s_after_first_batch": None}


def _peer_rate(peer: dict[str, Any]) -> float:
    """Events/s of a Feast processor run over its busy time (wall time if unknown)."""
    return peer.get("busy_events_per_s") or peer["events_per_s"]


def _peer_row(system: str, peer: dict[str, Any]) -> dict[str, Any]:
    """A result row of one Feast processor run."""
    return {"system": system, "events": peer["events"], "batches": len(peer.get("points", [])),
            "busy_s": peer.get("busy_s") or peer["seconds"], "events_per_s": _peer_rate(peer),
            "events_per_s_after_first_batch": warm_rate(peer.get("batches", []))}


def warm_rate(batches: list[tuple[int, float]]) -> float | None:
    """Events/s over the batches after the first one that had events, from
    ``(input rows, duration ms)`` per batch; ``None`` without two such batches.

    The first batch of a fresh driver pays for the JVM's JIT, the Python workers'
    start and the first state-store files: at the default sizes it took about 1.6x
    as long per event as the next one. Both systems are reported with and without
    it, each excluding its own first batch (Feast's processor runs second, in a JVM
    this run has already warmed up).
    """
    busy = [(rows, ms) for rows, ms in batches if rows > 0]
    if len(busy) < 2:
        return None
    rows = sum(r for r, _ in busy[1:])
    ms = sum(m for _, m in busy[1:])
    return rows / (ms / 1000) if ms > 0 else None


def _say(text: str) -> None:
    print(f"[streaming] {text}", flush=True)


def _send_live(settings: Any, topic: str, rate: float, stop: threading.Event) -> None:
    """Background traffic with event time = now, paced in ticks of :data:`LIVE_TICK_S`.

    It is load, not measured (the probes are, each sent on its own): its producer
    batches (``linger_ms`` :data:`LIVE_LINGER_MS`) and it wakes once a tick, not once an
    event, so that it and the broker leave the machine's two cores to the job (at
    500 events/s with 5 ms linger and a sleep per event they took 0.3-0.4 and 0.25 cores).
    """
    import random

    import orjson

    from pipelines.connections import kafka_producer

    producer = kafka_producer(settings, linger_ms=LIVE_LINGER_MS)
    rnd = random.Random(5)
    n = 0
    t0 = time.perf_counter()
    while not stop.is_set():
        due = int((time.perf_counter() - t0) * rate)
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        while n < due:
            user = f"u{rnd.randrange(10_000)}"
            doc = {"event_id": f"bg-{n}-{uuid.uuid4().hex[:6]}", "event_type": "view",
                   "event_time": now, "user_id": user, "session_id": "s",
                   "item_id": f"i{rnd.randrange(2000)}", "category_id": f"c{rnd.randrange(40)}",
                   "region": "UK"}
            producer.send(topic, key=user.encode(), value=orjson.dumps(doc))
            n += 1
        stop.wait(LIVE_TICK_S)
    producer.flush()
    producer.close()


LIVE_TICK_S = 0.02
"""The background sender's pace: the events due are sent every 20 ms."""
LIVE_LINGER_MS = 50
"""The background producer's batching delay (the probes' producer sends at once)."""


PROBE_JITTER_S = 2.5
"""Up to this much random pause between freshness probes (more than a micro-batch cycle)."""


def _probe(settings: Any, topic: str, probes: int, gap_s: float, timeout_s: float,
           budget_s: float | None = None) -> tuple[list[float], int]:
    """Send one purchase of a fresh item at a time; time until Redis holds its features.

    Returns the latencies seen and the probes sent: none is sent once ``budget_s`` has
    passed (a mode that lags at this rate would otherwise take ``probes`` x its lag).

    The pause before the next probe is ``gap_s`` plus a random part of up to
    :data:`PROBE_JITTER_S`: with a fixed pause every probe left at the same point of
    the micro-batch cycle (just after the batch that made the last one visible), and
    the figures measured that point, not the cycle.
    """
    import random

    rnd = random.Random(11)
    from features.feast_layout import ITEM_STATS, timestamp_field
    from pipelines.connections import kafka_producer, redis_client

    producer = kafka_producer(settings, linger_ms=0)
    client = redis_client(settings, timeout_ms=2000)
    # connect both clients before the first timed probe: a new producer's first send
    # waits for the topic's metadata (0.1 s idle, more under load), which a store's
    # long-lived producer has long had; it belonged to probe 0 alone
    producer.partitions_for(topic)
    client.ping()
    latencies: list[float] = []
    sent_count = 0
    started = time.monotonic()
    try:
        for i in range(probes):
            if budget_s is not None and time.monotonic() - started > budget_s:
                break
            sent_count += 1
            item = f"probe-{uuid.uuid4().hex[:10]}"
            sent = datetime.now(UTC)
            doc = {"event_id": f"probe-{i}-{item}", "event_type": "purchase",
                   "event_time": sent.isoformat().replace("+00:00", "Z"), "user_id": "prober",
                   "session_id": "s", "item_id": item, "category_id": "probe", "region": "UK",
                   "price": 1.0}
            producer.send(topic, key=b"prober", value=json.dumps(doc).encode())
            producer.flush()
            key = ITEM_STATS.redis_key(item)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if client.hexists(key, timestamp_field(ITEM_STATS.name)):
                    latencies.append((datetime.now(UTC) - sent).total_seconds())
                    if latencies[-1] > 1.0:  # when, to set beside the driver's log
                        print(f"[streaming] probe {i} sent {sent:%H:%M:%S.%f}: "
                              f"{latencies[-1]:.2f} s", flush=True)
                    break
                time.sleep(0.005)
            else:
                print(f"[streaming] probe {i} sent {sent:%H:%M:%S.%f}: not seen within "
                      f"{timeout_s:.0f} s", flush=True)
            time.sleep(gap_s + rnd.uniform(0.0, PROBE_JITTER_S))
    finally:
        producer.close()
        client.close()
    return latencies, sent_count


def _realtime_driver(run_settings: Any, log_path: Path) -> subprocess.Popen[bytes]:
    """``shopstream stream`` in Real-time Mode as its own driver, on the task slots it needs.

    Real-time Mode holds all its tasks at once (Kafka partitions + stateful stages), more
    than ``local[2]`` has; threads beyond the cores are how it runs on this machine (the
    CPU is still 2 cores, shared with the probes and the Parquet sinks' process).
    """
    from pipelines.streaming.realtime import required_slots

    slots = required_slots(run_settings)
    env = run_settings.model_copy(update={"spark_master": f"local[{slots}]"}).child_env()
    env["PYSPARK_PYTHON"] = sys.executable
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "stream"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_driver(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the driver only: it stops its JVM itself, cleanly
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


CPU_PARTS = {
    "query_jvm": "the Real-time query's JVM",
    "driver": "its driver (tile feed #0, the query's control)",
    "feeds": "the other tile feeds' processes",
    "sinks": "the Parquet sinks' process (its JVM, Python workers)",
    "stream": "shopstream stream (its JVM and Python workers, in this process)",
    "kafka": "the Kafka broker",
    "redis": "redis-server",
    "bench": "this benchmark's Python (live sender, probes)",
}
"""The parts whose CPU a freshness run reports (:func:`cpu_note`), in the note's order."""


def server_pids(settings: Any) -> dict[str, int | None]:
    """The pids of the broker and Redis this benchmark started (its children, so they are
    counted apart from the stream's processes); ``None`` for one not running."""
    from pipelines.infra import KafkaBroker, RedisServer

    return {"kafka": KafkaBroker(settings).process.pid,
            "redis": RedisServer(settings).process.pid}


class CpuWindow:
    """The CPU each part of a freshness run used, from ``/proc``, in cores (CPU seconds
    per second of the run). Why: on a 2-core machine shared by the query, the feeds, the
    Parquet sinks, the broker, Redis and this benchmark's sender, a mode that falls behind
    may be short of CPU rather than slow, and the lag alone does not say which part took
    the cores (one slow-hour run: the query's JVM 0.72 cores, the feeds 0.59, this
    benchmark 0.27, of the 2).

    The servers and this process are measured from :meth:`start`; a Real-time driver
    (``driver_pid``) and its children are started inside the window, so all their CPU
    counts (each child by what its command runs)."""

    def __init__(self, settings: Any) -> None:
        self.servers = server_pids(settings)
        self.before: dict[str, float] = {}
        self.started = 0.0
        self.cores: dict[str, float] = {}

    def _servers(self, in_process_stream: bool) -> dict[str, float]:
        used = {name: process_tree_cpu_s(pid) for name, pid in self.servers.items() if pid}
        used["bench"] = process_cpu_s(os.getpid())
        if in_process_stream:  # the micro-batch stream runs in this process's JVM and workers
            parts = stream_cpu_s(os.getpid(), exclude=set(self.servers.values()))
            used["stream"] = parts["jvm"] + parts["workers"]
        return used

    def start(self, in_process_stream: bool = False) -> None:
        self.before = self._servers(in_process_stream)
        self.started = time.monotonic()

    def stop(self, driver_pid: int | None = None) -> dict[str, float]:
        """Fill :attr:`cores` (and return it): the window ends now. Call it before the
        driver stops, while its children are alive."""
        used = {name: cpu - self.before.get(name, 0.0)
                for name, cpu in self._servers(driver_pid is None and "stream" in self.before).items()}
        if driver_pid is not None:
            used |= realtime_cpu_s(driver_pid)
        wall = max(time.monotonic() - self.started, 1e-9)
        self.cores.update({name: cpu / wall for name, cpu in used.items()})
        self.cores["seconds"] = wall
        return self.cores


def realtime_cpu_s(driver_pid: int) -> dict[str, float]:
    """CPU seconds a Real-time driver's process and each of its children have used, by
    part (:data:`CPU_PARTS`): its JVM, its feed processes, its Parquet sinks' process
    (with their own children)."""
    used = {"query_jvm": 0.0, "driver": process_cpu_s(driver_pid), "feeds": 0.0, "sinks": 0.0}
    for child in child_pids(driver_pid):
        command = process_command(child)
        part = ("sinks" if "--offline-only" in command else
                "feeds" if "feed_process" in command else
                "query_jvm" if command.split(" ", 1)[0].endswith("java") else "driver")
        used[part] += process_tree_cpu_s(child)
    return used


DRAIN_CPU_PARTS = {
    "jvm": "its JVM",
    "workers": "its Python workers",
    "driver": "its driver's Python (foreachBatch)",
    "redis": "redis-server",
    "kafka": "the Kafka broker",
}
"""The parts whose CPU a drain reports (:func:`drain_cpu_note`), in the note's order."""


def stream_cpu_s(pid: int, exclude: Collection[int] = ()) -> dict[str, float]:
    """CPU seconds an in-process micro-batch stream has used, by part: the driver's own
    Python (``pid``: foreachBatch, the top lists, py4j), its JVM (a ``java`` child, with
    its children but the Python workers) and the Python workers it forks
    (``pyspark.daemon``, with the workers it has reaped). Children in ``exclude`` (servers
    this process started: the broker, Redis) and other children of ``pid`` (this
    benchmark's helpers) are not the stream's.

    Why: a drain's batch is CPU-bound on the 2 cores, and its phases run one after the
    other, so what to make cheaper is whichever part takes the most CPU per event; the
    phase times alone mix the JVM's and the workers' share of the online path."""
    used = {"jvm": 0.0, "workers": 0.0, "driver": process_cpu_s(pid)}
    todo = [child for child in child_pids(pid) if child not in exclude
            and process_command(child).split(" ", 1)[0].endswith("java")]
    while todo:
        child = todo.pop()
        command = process_command(child)
        if not command.split(" ", 1)[0].endswith("java") and "pyspark.daemon" in command:
            used["workers"] += process_tree_cpu_s(child) + reaped_children_cpu_s(child)
            continue
        used["jvm"] += process_cpu_s(child)
        todo.extend(child_pids(child))
    return used


class DrainCpu:
    """CPU of each part (:data:`DRAIN_CPU_PARTS`) over one drain of the in-process stream,
    from ``/proc``: the stream's JVM, its Python workers and its driver, Redis and the
    broker."""

    def __init__(self, settings: Any) -> None:
        self.servers = server_pids(settings)
        self.before = self._now()

    def _now(self) -> dict[str, float]:
        used = stream_cpu_s(os.getpid(), exclude=set(self.servers.values()))
        used |= {name: process_tree_cpu_s(pid) for name, pid in self.servers.items() if pid}
        return used

    def stop(self) -> dict[str, float]:
        """CPU seconds each part used since this was made."""
        return {name: cpu - self.before.get(name, 0.0) for name, cpu in self._now().items()}


def drain_cpu_note(label: str, cpu_s: dict[str, float], events: int) -> str:
    """One line: each part's CPU seconds per million events over drains of ``events``."""
    per = 1e6 / events if events else 0.0
    parts = [(name, cpu_s[name] * per) for name in DRAIN_CPU_PARTS if name in cpu_s]
    return (f"{label}: CPU seconds per million events: "
            + "; ".join(f"{DRAIN_CPU_PARTS[n]} {c:.1f}" for n, c in parts)
            + f"; together {sum(c for _, c in parts):.1f}")


def cpu_note(label: str, cores: dict[str, float]) -> str:
    """One line: the cores each part used over a freshness run, and their sum."""
    parts = [(name, cores[name]) for name in CPU_PARTS if name in cores]
    return (f"{label}: CPU over the run's {cores['seconds']:.0f} s, in cores of the machine's "
            f"{os.cpu_count()}: " + "; ".join(f"{CPU_PARTS[n]} {c:.2f}" for n, c in parts)
            + f"; together {sum(c for _, c in parts):.2f}")


PROBE_TIMEOUT_S = 60.0
"""How long a freshness probe waits for its item to be online before it counts as missed."""
CAUGHT_UP_LAG_S = {"microbatch": 5.0, "realtime": 1.0}
"""Probes start once the mode's clock is this close to now (then the warm-up).

Per mode, because the clock means different things: the micro-batch clock is the
newest event time of the last batch, which is a trigger interval plus a batch behind
now even when nothing is waiting; the Real-time clock moves with every tile written,
so within 5 s of now it can still be draining the traffic sent while it started
(at 500 events/s the first three probes after a 5 s criterion and a 10 s warm-up took
3.7, 3.9 and 1.4 s, the next 57 at most 0.62 s)."""
CAUGHT_UP_HOLD_S = {"microbatch": 0.0, "realtime": 15.0}
"""...and has stayed that close for this long without a break. A Real-time clock that
touches now once may still be draining: in one run 7 of the 60 probes over 0.5 s came
in the first minute after it first did. (The micro-batch clock is the last batch's, a
trigger interval behind between batches: holding it would mean nothing.)"""


def _clock_key(mode: str) -> tuple[str, str | None]:
    """Where a mode publishes its event-time clock: (Redis key, hash field or None)."""
    if mode == "realtime":
        from pipelines.streaming.realtime import rt_clock_key

        return rt_clock_key(), None
    from features.online_keys import stream_progress_key

    return stream_progress_key(), "clock"


def _clear_clock(settings: Any, mode: str) -> None:
    """Forget the clock an earlier run left on this Redis, so that waiting for the clock
    waits for this run (a stale one let the probes start before the query did)."""
    from pipelines.connections import redis_client

    client = redis_client(settings, timeout_ms=2000)
    try:
        client.delete(_clock_key(mode)[0])
    finally:
        client.close()


def _clock_seconds(client: Any, mode: str) -> float | None:
    """The mode's event-time clock in epoch seconds (``None`` before its first write)."""
    key, field = _clock_key(mode)
    if field is None:
        raw = client.get(key)
        return None if raw is None else int(raw) / 1e6
    raw = client.hget(key, field)
    return None if not raw else datetime.fromisoformat(raw.decode()).timestamp()


WAIT_STATUS_S = 15.0
"""How often :func:`_wait_for_clock` says how far behind the mode is."""


def _realtime_parts(client: Any) -> str:
    """The Real-time feed's last report from the progress hash: where the lag is."""
    from features.online_keys import stream_progress_key

    fields = {k.decode(): v.decode() for k, v in client.hgetall(stream_progress_key()).items()
              if k.startswith(b"rt_")}
    parts = [f"{name} p50/p99 {fields[f'rt_{name}_p50_s']}/{fields[f'rt_{name}_p99_s']} s"
             for name in ("query", "feed") if f"rt_{name}_p99_s" in fields]
    return "; ".join(parts)


def _wait_for_clock(settings: Any, mode: str, alive: Callable[[], bool], timeout_s: float,
                    lag_s: float | None = None, hold_s: float | None = None,
                    label: str | None = None) -> tuple[float | None, str]:
    """Until the mode's event-time clock has been within ``lag_s`` (default
    :data:`CAUGHT_UP_LAG_S` of the mode) of now for ``hold_s`` (default
    :data:`CAUGHT_UP_HOLD_S`) without a break: the query has caught up with the live
    traffic sent while it started (probes measure the steady state, not the catching
    up). Returns the seconds that took (``None`` if it did not within ``timeout_s``) and
    the last lag seen, with the Real-time feed's parts (query, feed), so a run that did
    not catch up says where it was behind. Says the same every :data:`WAIT_STATUS_S`,
    naming what it waits for as ``label`` (default: the mode)."""
    from pipelines.connections import redis_client

    lag_s = CAUGHT_UP_LAG_S[mode] if lag_s is None else lag_s
    hold_s = CAUGHT_UP_HOLD_S[mode] if hold_s is None else hold_s
    client = redis_client(settings, timeout_ms=2000)
    start = time.monotonic()
    deadline = start + timeout_s
    next_status = start + WAIT_STATUS_S
    last = "no clock yet"
    close_since: float | None = None
    try:
        while time.monotonic() < deadline and alive():
            clock = _clock_seconds(client, mode)
            if clock is not None:
                behind = time.time() - clock
                if behind <= lag_s:
                    close_since = close_since or time.monotonic()
                    if time.monotonic() - close_since >= hold_s:
                        return time.monotonic() - start, f"{behind:.1f} s behind"
                else:
                    close_since = None
                parts = _realtime_parts(client) if mode == "realtime" else ""
                last = f"{behind:.1f} s behind" + (f" ({parts})" if parts else "")
            if time.monotonic() >= next_status:
                _say(f"{label or mode}: waiting to catch up, {time.monotonic() - start:.0f} s: "
                     f"{last}")
                next_status += WAIT_STATUS_S
            time.sleep(0.2)
    finally:
        client.close()
    return None, last


def probe_summary(latencies: list[float], sent: int,
                  timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """p50 / p99 / max of the probes, a missed probe counting as slower than ``timeout_s``.

    A quantile that falls on a missed probe cannot be stated as a number: it is the
    text ``"> 60"`` (the table shows it as is), never NaN and never the quantile of
    the probes that happened to arrive.
    """
    ordered = sorted(latencies) + [float("inf")] * max(0, sent - len(latencies))

    def pick(q: float) -> float | str | None:
        if not ordered:
            return None
        value = ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
        return value if value != float("inf") else f"> {timeout_s:.0f}"

    exact = summarize(latencies, elapsed_s=1.0) if len(latencies) == len(ordered) else None
    return {
        "probes": sent, "seen": len(latencies), "latencies": latencies,
        "p50_s": exact.p50_ms / 1000 if exact and exact.count else pick(0.5),
        "p99_s": exact.p99_ms / 1000 if exact and exact.count else pick(0.99),
        "max_s": exact.max_ms / 1000 if exact and exact.count else pick(1.0),
        "error": None,
    }


def _seconds(value: float | str | None) -> str:
    return f"{value:.2f} s" if isinstance(value, float) else f"{value} s"


def _freshness(settings: Any, spark: Any, mode: str, rate: float, probes: int,
               warmup_s: float = 10.0, budget_s: float | None = None) -> dict[str, Any]:
    from pipelines.stream import StreamOptions, run_stream, stop_gracefully

    topic = f"bench.fresh.{mode}.{uuid.uuid4().hex[:8]}"
    _topic(settings, topic)
    # a tile topic of its own too: the feed's group outlives a run, and a run that ended
    # behind (2,000 events/s) would leave the next one its tiles to write first
    run_settings = settings.model_copy(update={"kafka_topic_events": topic, "stream_mode": mode,
                                               "kafka_topic_rt_tiles": f"{topic}.tiles",
                                               "stream_starting_offsets": "latest",
                                               "checkpoint_dir": _fresh_checkpoints(settings, topic)})
    _empty_redis(settings)
    if mode == "realtime":
        return _realtime_freshness(run_settings, topic, rate, probes, warmup_s, budget_s)
    stop = threading.Event()
    started = threading.Event()
    queries: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            run_stream(run_settings, spark=spark, options=StreamOptions(stop="never"),
                       on_started=lambda q: (queries.append(q), started.set()))
        except BaseException as exc:  # noqa: BLE001 - reported below
            error.append(exc)
            started.set()

    _clear_clock(run_settings, mode)
    cpu = CpuWindow(run_settings)
    cpu.start(in_process_stream=True)
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    started.wait(300)
    if error:
        return {"error": str(error[0]).splitlines()[0][:300]}
    sender = threading.Thread(target=_send_live, args=(settings, topic, rate, stop), daemon=True)
    sender.start()
    try:
        caught_up_s, last = _wait_for_clock(run_settings, mode, lambda: not error, 300)
        if caught_up_s is None:
            return {"cpu": cpu.cores,  # filled in by the finally clause
                    "error": "the micro-batch query did not catch up with the live traffic "
                             f"(clock within {CAUGHT_UP_LAG_S[mode]:.0f} s of now) within 300 s; "
                             f"at the end {last}"
                             + (f": {str(error[0]).splitlines()[0][:300]}" if error else "")}
        time.sleep(warmup_s)  # warm up: first batches, Python workers
        latencies, sent = _probe(settings, topic, probes, 0.5, PROBE_TIMEOUT_S, budget_s)
    finally:
        cpu.stop()
        stop.set()
        sender.join()
        for query in queries:
            stop_gracefully(query)  # query.stop() mid-batch can overflow Spark's stack
        runner.join(120)
    return {**probe_summary(latencies, sent), "caught_up_s": caught_up_s, "cpu": cpu.cores}


def _realtime_freshness(run_settings: Any, topic: str, rate: float, probes: int,
                        warmup_s: float, budget_s: float | None = None) -> dict[str, Any]:
    """Probes once both of Real-time Mode's processes have caught up: the Parquet sinks'
    process first (:func:`sinks_lag_s`), then the Real-time clock, held
    (:data:`CAUGHT_UP_HOLD_S`). The sinks' process is niced, so it starts later and
    catches up its own backlog after the online path has: in one run its first
    batches (43,005 and 37,938 events) ran through the first minute of probes, and the
    feed's part rose to 1-2 s while they did. That is the start, not the steady state."""
    log_path = Path(run_settings.data_dir) / f"{topic}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    sender = threading.Thread(target=_send_live, args=(run_settings, topic, rate, stop), daemon=True)
    _clear_clock(run_settings, "realtime")
    _clear_clock(run_settings, "microbatch")  # the sinks' process publishes it
    cpu = CpuWindow(run_settings)
    cpu.start()
    proc = _realtime_driver(run_settings, log_path)
    started = time.monotonic()

    # a niced sinks' process that stops catching up gets the driver's priority after
    # stream_realtime_offline_stall_seconds (pipelines.streaming.offline_process): give it
    # the same 300 s from then
    sinks_wait = 300 + run_settings.stream_realtime_offline_stall_seconds

    def failed(what: str, lag_s: float, last: str, waited: float = 300) -> dict[str, Any]:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        return {"cpu": cpu.cores,  # filled in by the finally clause
                "error": f"{what} did not catch up with the live traffic (clock within "
                         f"{lag_s:.0f} s of now) within {waited:.0f} s; at the end {last}"
                         + (f" (exit {proc.returncode}: {' | '.join(tail)[:300]})"
                            if proc.poll() is not None else "")}

    try:
        sender.start()
        sinks_lag = sinks_lag_s(run_settings)
        sinks_s, last = _wait_for_clock(run_settings, "microbatch", lambda: proc.poll() is None,
                                        sinks_wait, lag_s=sinks_lag,
                                        label="realtime, its Parquet sinks' process")
        if sinks_s is None:
            return failed("the Parquet sinks' process", sinks_lag, last, sinks_wait)
        caught_up_s, last = _wait_for_clock(run_settings, "realtime",
                                            lambda: proc.poll() is None, 300)
        if caught_up_s is None:
            return failed("the Real-time path", CAUGHT_UP_LAG_S["realtime"], last)
        caught_up_s = time.monotonic() - started
        time.sleep(warmup_s)
        epochs_before = epochs_logged(log_path)
        latencies, sent = _probe(run_settings, topic, probes, 0.5, PROBE_TIMEOUT_S, budget_s)
        boundaries = epochs_logged(log_path) - epochs_before
        top = _top_writes(run_settings)
    finally:
        cpu.stop(proc.pid)
        stop.set()
        if sender.is_alive():
            sender.join()
        _stop_driver(proc)
    logged = " ".join(log_path.read_text(errors="replace").split())  # the console wraps lines
    niced = re.search(r"caught up with the topic (\d+) s after its start", logged)
    return {**probe_summary(latencies, sent), "caught_up_s": caught_up_s,
            "sinks_caught_up_s": sinks_s, "epoch_boundaries": boundaries,
            "sinks_niced_after_s": int(niced.group(1)) if niced else None,
            "sinks_escalations": logged.count("has not caught up with the topic for"),
            "top": top, "cpu": cpu.cores}


def _top_writes(settings: Any) -> dict[str, str]:
    """The top-list writes of the feed's last report (``rt_top_*`` of the progress hash:
    how many, how long, the longest a sales change waited for them), read after the probes."""
    from features.online_keys import stream_progress_key
    from pipelines.connections import redis_client

    client = redis_client(settings, timeout_ms=2000)
    try:
        return {k.decode().removeprefix("rt_top_"): v.decode()
                for k, v in client.hgetall(stream_progress_key()).items()
                if k.startswith(b"rt_top_")}
    finally:
        client.close()


def epochs_logged(log_path: Path) -> int:
    """How many Real-time epochs the driver's log says have ended: each end is a boundary,
    when the query plans the next epoch and relaunches its tasks and no tile comes out
    for 2-3 s. Whether the probes met one decides their tail, so the result says."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return 0
    return text.count("real-time epoch ")


def sinks_lag_s(settings: Any) -> float:
    """How close to now the Parquet sinks' clock must be for that process to count as
    caught up: its trigger interval plus the micro-batch margin (its clock is its last
    batch's newest event)."""
    return settings.stream_realtime_offline_trigger_seconds + CAUGHT_UP_LAG_S["microbatch"]


def rates(text: str) -> list[float]:
    """``--realtime-rates``: comma-separated positive events/s (``"300,500"``)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            rate = float(part)
        except ValueError:
            rate = float("nan")
        if not rate > 0:  # NaN too
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a positive number of events/s (expected e.g. 300,500,700)")
        out.append(rate)
    return out


def main(argv: list[str] | None = None) -> BenchResult:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small backlog, few probes")
    parser.add_argument("--events", type=int, default=None,
                        help="backlog size (default: three batches at the job's cap, SHOPSTREAM_STREAM_MAX_OFFSETS_PER_TRIGGER)")
    parser.add_argument("--cold-events", type=int, default=None,
                        help="backlog of each system's cold-start run before the measured one "
                             "(default 100,000; 0: none)")
    parser.add_argument("--rate", type=float, default=1000.0, help="background events/s")
    parser.add_argument("--users", type=int, default=None,
                        help="users in the backlogs' store (default the generator's 10,000)")
    parser.add_argument("--items", type=int, default=None,
                        help="items in the backlogs' store (default the generator's 2,000)")
    parser.add_argument("--random-ids", action="store_true",
                        help="UUIDv4 event ids, as real clients send (default: sequence numbers)")
    parser.add_argument("--event-rate", type=float, default=None,
                        help="events per second of event time in the backlogs (default the "
                             "generator's 1,000): a fast stream's backlog spans fewer tiles")
    parser.add_argument("--realtime-rates", type=rates, default=[],
                        help="more background rates (events/s, comma-separated) to probe "
                             "Real-time Mode at, each a row of its own: where it stops keeping up")
    parser.add_argument("--drains", type=int, default=None,
                        help="times each system drains the backlog in a row (default 3, 1 with "
                             "--quick); the drains after the first give the sustained rate")
    parser.add_argument("--no-peer", action="store_true", help="skip Feast's processor")
    parser.add_argument("--no-realtime", action="store_true", help="skip Real-time Mode")
    parser.add_argument("--probes", type=int, default=None, help="freshness probes per mode (default 40)")
    parser.add_argument("--probe-budget", type=float, default=300.0,
                        help="seconds of probing per mode at most (a lagging mode sends fewer)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of traffic before probing")
    parser.add_argument("--peer-timeout", type=float, default=1800.0, help="seconds for Feast's processor")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where plots go")
    args = parser.parse_args(argv if argv is not None else [])
    settings = bench_settings("streaming_throughput", kafka_topic_partitions=2,
                              spark_master="local[2]", spark_shuffle_partitions=2,
                              stream_trigger_seconds=1.0)
    # three full micro-batches at the job's default cap, so the rate after the first
    # batch is a figure of its own
    events = args.events or (50_000 if args.quick else 3 * settings.stream_max_offsets_per_trigger)
    cold_events = args.cold_events if args.cold_events is not None else (
        10_000 if args.quick else 100_000)
    probes = args.probes or (10 if args.quick else 40)
    drains = args.drains if args.drains is not None else (1 if args.quick else 3)
    for name in ("users", "items", "event_rate", "drains"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    store = traffic(args.users, args.items, args.random_ids)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pipelines.infra import KafkaBroker, RedisServer
    from pipelines.spark import spark_session

    broker, redis = KafkaBroker(settings), RedisServer(settings)
    redis.start()
    broker.start()
    result = BenchResult(
        name="streaming_throughput",
        title="Streaming: sustained events/s and freshness (event time -> readable in Redis), local[2]",
        targets={"throughput": ">= 50,000 events/s sustained",
                 "freshness": "p99 <= 1 s in Real-time Mode; never above 5 s in micro-batch"},
    )
    try:
        event_rate = args.event_rate or store.nominal_rate
        shape = (f"{store.users:,} users, {store.items:,} items, event time at "
                 f"{event_rate:,.0f} events/s, "
                 f"{'UUIDv4' if store.random_ids else 'sequential'} event ids")
        _say(f"backlog of {events:,} events ({shape}); Spark {settings.spark_master}; "
             f"dedup {settings.stream_dedup}")
        result.notes.append(f"backlogs' traffic: {shape} (--users, --items, --event-rate, --random-ids); each "
                            "micro-batch rewrites the features of every user and item it touched")
        result.notes.append(f"shopstream's dedup: SHOPSTREAM_STREAM_DEDUP={settings.stream_dedup}")
        if drains > 1:
            result.notes.append(
                f"each system drains its backlog {drains} times in a row in its warm driver "
                "(shopstream: a fresh checkpoint and an empty Redis each time); the first "
                "drain is the row without 'sustained', the others the sustained row")
        spark = spark_session(settings, app_name="bench-streaming")
        if cold_events:
            _say(f"cold start: shopstream stream on a backlog of {cold_events:,} events")
            result.rows.append(_stream_row(
                "cold start (not in the ratios): shopstream stream, the first run of a fresh driver",
                _throughput(settings, spark, cold_events, store, args.event_rate)[0]))
        tps = _throughput(settings, spark, events, store, args.event_rate, drains)
        tp = tps[0]
        result.rows.append(_stream_row("shopstream stream (micro-batch, full pipeline)", tp))
        ours = sustained(tps)
        if ours:
            result.rows.append(_sustained_row("shopstream stream", ours))
        phases = tp["phases"]
        result.notes.append(
            f"shopstream's {tp['busy_s']:.1f} s busy, summed over its batches: Kafka read, "
            f"validation and dedup {phases['read']:.1f} s; online path {phases['online']:.1f} s; "
            f"Parquet sinks {phases['offline']:.1f} s (beside the online path)")
        result.notes.append(drain_cpu_note("shopstream's first drain", tp["cpu_s"], tp["events"]))
        if ours:
            later = tps[1:]
            result.notes.append(drain_cpu_note(
                "shopstream's sustained drains",
                {name: sum(r["cpu_s"].get(name, 0.0) for r in later) for name in DRAIN_CPU_PARTS},
                ours["events"]))
        raw = tp["raw"]
        result.rows.append({"system": "plain Kafka consumer, same topic (read and discard: the raw limit)",
                            "events": raw["events"], "batches": None, "busy_s": raw["seconds"],
                            "events_per_s": raw["events_per_s"],
                            "events_per_s_after_first_batch": None})
        if raw["events_per_s"]:
            result.ratios["throughput: shopstream / plain Kafka consumer"] = (
                tp["events_per_s"] / raw["events_per_s"])
        series: dict[str, tuple[list[float], list[float]]] = {
            "shopstream stream": ([float(b) for b, _ in tp["series"]], [r for _, r in tp["series"]])}
        if not args.no_peer:
            from benchmarks.feast_stream_peer import run_feast_spark_processor

            def feast_runs(count: int, times: int = 1) -> list[dict[str, Any]]:
                topic = f"bench.peer.{uuid.uuid4().hex[:8]}"
                _topic(settings, topic)
                _backlog(settings, topic, count, store, args.event_rate)
                runs = []
                for drain in range(times):
                    if times > 1:
                        _say(f"Feast SparkKafkaProcessor: drain {drain + 1} of {times}")
                    cpu = DrainCpu(settings)
                    run = run_feast_spark_processor(
                        settings, spark, topic=topic, expected_events=count,
                        max_seconds=args.peer_timeout,
                        workdir=Path(settings.data_dir).resolve().parent)
                    runs.append({**run, "cpu_s": cpu.stop()})
                    _say(drain_cpu_note("the drain (Feast SparkKafkaProcessor)", runs[-1]["cpu_s"],
                                        run["events"]))
                return runs

            if cold_events:
                _say(f"cold start: Feast SparkKafkaProcessor on a backlog of {cold_events:,} events")
                result.rows.append(_peer_row(
                    "cold start (not in the ratios): Feast SparkKafkaProcessor, its first run",
                    feast_runs(cold_events)[0]))
            _say(f"Feast SparkKafkaProcessor on a backlog of {events:,} events")
            peers = feast_runs(events, drains)
            peer = peers[0]
            peer_row = _peer_row("Feast SparkKafkaProcessor (running counters only)", peer)
            peer_rate, peer_warm = peer_row["events_per_s"], peer_row["events_per_s_after_first_batch"]
            _say(f"Feast SparkKafkaProcessor: {peer['events']:,} events, {peer_rate:,.0f}/s busy")
            result.rows.append(peer_row)
            if peer.get("error"):
                result.notes.append(f"Feast SparkKafkaProcessor: {peer['error']}")
            if not peer.get("drained", True):
                result.notes.append(f"Feast's processor drained {peer['events']:,} of {events:,} events "
                                    f"within {args.peer_timeout:.0f} s")
            if peer_rate:
                result.ratios["throughput: shopstream / Feast processor"] = tp["events_per_s"] / peer_rate
            if peer_warm and tp["warm_events_per_s"]:
                result.ratios["throughput after each one's first batch: shopstream / Feast processor"] = (
                    tp["warm_events_per_s"] / peer_warm)
            theirs = sustained([{"events": p["events"], "batches": len(p.get("batches", [])),
                                 "busy_s": p.get("busy_s") or p["seconds"]} for p in peers])
            if theirs:
                result.rows.append(_sustained_row("Feast SparkKafkaProcessor", theirs))
                their_cpu = {name: sum(p["cpu_s"].get(name, 0.0) for p in peers[1:])
                             for name in DRAIN_CPU_PARTS}
                result.notes.append(drain_cpu_note(
                    "Feast's processor's sustained drains", their_cpu, theirs["events"]))
                our_cpu = sum(sum(r["cpu_s"].values()) for r in tps[1:])
                if ours and their_cpu and sum(their_cpu.values()) > 0:
                    result.ratios["CPU per event over the sustained drains (every part, the "
                                  "broker and Redis too): shopstream / Feast processor"] = (
                        (our_cpu / ours["events"]) / (sum(their_cpu.values()) / theirs["events"]))
                if ours:
                    result.ratios["sustained throughput (the drains after the first): "
                                  "shopstream / Feast processor"] = (
                        ours["events_per_s"] / theirs["events_per_s"])
            series["Feast SparkKafkaProcessor"] = (
                [float(n) for n in range(len(peer.get("points", [])))],
                [r for _, r in peer.get("points", [])])
        result.plots.append(str(plot_series(
            series, args.results_dir / "streaming_throughput.png",
            title="Rows/s per micro-batch (x: batch number)", ylabel="rows/s")))
        result.notes.append(
            "freshness probes start once the mode has caught up with the live traffic "
            f"(clock within {CAUGHT_UP_LAG_S['microbatch']:.0f} s of now in micro-batch, "
            f"{CAUGHT_UP_LAG_S['realtime']:.0f} s in Real-time Mode, held there for "
            f"{CAUGHT_UP_HOLD_S['realtime']:.0f} s, after its Parquet sinks' process has caught up "
            f"too: clock within {sinks_lag_s(settings):.0f} s; caught_up_s: how long that took "
            f"from the start) and {args.warmup:.0f} s of traffic more")
        freshness: dict[str, list[float]] = {}
        runs = [("microbatch", args.rate)]
        if not args.no_realtime:
            runs += [("realtime", rate) for rate in
                     [args.rate, *(r for r in args.realtime_rates if r != args.rate)]]
        for mode, rate in runs:
            label = mode if rate == args.rate else f"{mode}, {rate:,.0f} events/s"
            _say(f"freshness, {label}: {probes} probes at {rate:,.0f} background events/s")
            fresh = _freshness(settings, spark, mode, rate, probes, args.warmup,
                               args.probe_budget)
            _say(f"freshness, {label}: " + (f"could not run: {fresh['error']}" if fresh.get("error") else
                 f"{fresh['seen']}/{fresh['probes']} seen, p50 {_seconds(fresh['p50_s'])}, "
                 f"p99 {_seconds(fresh['p99_s'])} (caught up after {fresh['caught_up_s']:.0f} s)"))
            if not fresh.get("error") and fresh["probes"] < probes:
                result.notes.append(
                    f"{label}: {fresh['probes']} of {probes} probes sent within the "
                    f"{args.probe_budget:.0f} s probing budget (each waits until its item is "
                    f"online, up to {PROBE_TIMEOUT_S:.0f} s: the mode lags at this rate)")
            if fresh.get("latencies"):
                freshness[label] = fresh["latencies"]
            row = {"system": f"freshness, {label}", "events": fresh.get("seen", 0),
                   "batches": fresh.get("probes", 0), "busy_s": None, "events_per_s": None,
                   "p50_s": fresh.get("p50_s"), "p99_s": fresh.get("p99_s"),
                   "max_s": fresh.get("max_s"), "rate": rate,
                   "caught_up_s": fresh.get("caught_up_s")}
            if fresh.get("cpu"):
                result.notes.append(cpu_note(label, fresh["cpu"]))
                _say(cpu_note(label, fresh["cpu"]))
            if fresh.get("error"):
                result.notes.append(f"{label}: could not run: {fresh['error']}")
            elif mode == "realtime":
                if not any(n.startswith("realtime: a driver") for n in result.notes):
                    from pipelines.streaming.realtime import required_slots

                    result.notes.append(
                        f"realtime: a driver of its own at local[{required_slots(settings)}] "
                        "(Real-time Mode holds every stage's tasks at once; the threads share "
                        "the 2 cores); the query sends its feeds "
                        + ("role rows to fold (SHOPSTREAM_STREAM_REALTIME_SHAPE=roles)"
                           if settings.stream_realtime_shape == "roles" else "whole tiles"))
                if fresh.get("top"):
                    top = fresh["top"]
                    apart = (f", at most {top['lag_max_s']} s behind the sales tiles"
                             if "lag_max_s" in top else "")
                    result.notes.append(
                        f"{label}: the feed's last report: top-list writes "
                        f"{top.get('writes', '?')}, p50 {top.get('write_p50_s', '?')} s, max "
                        f"{top.get('write_max_s', '?')} s{apart}")
                result.notes.append(
                    f"{label}: {fresh['epoch_boundaries']} Real-time epoch boundaries during the "
                    f"probes (an epoch lasts {settings.stream_realtime_checkpoint_seconds} s; "
                    "each boundary holds the tiles back 2-3 s)")
                result.notes.append(
                    f"{label}: the Parquet sinks' process caught up after "
                    f"{fresh['sinks_caught_up_s']:.0f} s"
                    + (f" (started at the driver's priority, its driver niced it "
                       f"{fresh['sinks_niced_after_s']} s after its start, once its query "
                       "had caught up)"
                       if fresh["sinks_niced_after_s"] is not None else "")
                    + (f", after its driver gave it its own priority "
                       f"({fresh['sinks_escalations']}x: not caught up at nice "
                       f"+{settings.stream_realtime_offline_nice} for "
                       f"{settings.stream_realtime_offline_stall_seconds:.0f} s)"
                       if fresh["sinks_escalations"] else ""))
            result.rows.append(row)
        if freshness:
            from benchmarks.common import plot_latency_histograms

            result.plots.append(str(plot_latency_histograms(
                freshness, args.results_dir / "streaming_freshness.png",
                title="Freshness: event time -> readable in Redis")))
    finally:
        broker.stop()
        redis.stop()
    result.notes.append(
        f"{os.cpu_count()} CPUs shared with other work; load average at the end: "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}. Same-run comparisons only.")
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("kafka", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    outcome = main(sys.argv[1:])
    path = write_result(outcome, Path(sys.argv[sys.argv.index("--results-dir") + 1])
                        if "--results-dir" in sys.argv else RESULTS_DIR)
    print(outcome.markdown())
    print(f"wrote {path}")
