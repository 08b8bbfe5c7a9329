"""The raw limits a benchmark is read against: a plain Kafka consumer, one Redis round trip."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import LatencySummary, open_loop, summarize

__all__ = ["kafka_consumer_rate", "redis_round_trip"]


def kafka_consumer_rate(settings: Any, topic: str, expected: int, max_seconds: float = 120) -> dict[str, float]:
    """How fast a plain kafka-python consumer reads (and discards) ``expected`` records."""
    from pipelines.connections import kafka_consumer

    consumer = kafka_consumer(
        settings, topic, group_id=None, fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024, consumer_timeout_ms=5000,
    )
    consumer.poll(timeout_ms=1000, max_records=1)  # join and fetch metadata outside the clock
    consumer.seek_to_beginning()
    count = 0
    started = time.perf_counter()
    deadline = started + max_seconds
    while count < expected and time.perf_counter() < deadline:
        batches = consumer.poll(timeout_ms=500, max_records=50_000)
        for records in batches.values():
            count += len(records)
    elapsed = time.perf_counter() - started
    consumer.close()
    return {"events": count, "seconds": elapsed, "events_per_s": count / elapsed if elapsed else 0.0}


def redis_round_trip(settings: Any, *, rate: float, count: int, max_seconds: float) -> tuple[LatencySummary, list[float]]:
    """Latency of one Redis round trip (a ZREVRANGE of a 100-member set) at a fixed rate."""
    from pipelines.connections import redis_client

    client = redis_client(settings, timeout_ms=1000)
    client.zadd("bench:raw:zset", {f"item{i}": i for i in range(100)})

    def call(_: int) -> None:
        client.zrevrange("bench:raw:zset", 0, 9, withscores=True)

    latencies, errors, elapsed = open_loop(call, rate=rate, count=count, max_seconds=max_seconds)
    client.delete("bench:raw:zset")
    client.close()
    return summarize(latencies, elapsed_s=elapsed, errors=errors), latencies
