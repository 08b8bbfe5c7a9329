"""Local infrastructure: a real Kafka broker and a real redis-server, started as processes.

``up`` is idempotent, ``status`` reports health and addresses, ``down`` stops
only what ``up`` started (by pid file) and leaves data unless ``purge``.
"""

from __future__ import annotations

import shutil
from typing import Any

from pipelines.infra.jars import kafka_broker_jars, spark_kafka_jars
from pipelines.infra.jvm_jar import shopstream_jar
from pipelines.infra.kafka_broker import KafkaBroker
from pipelines.infra.redis_server import RedisServer
from pipelines.settings import Settings

__all__ = ["up", "down", "status", "resolve_jars", "KafkaBroker", "RedisServer"]


def resolve_jars(settings: Settings) -> dict[str, str]:
    """Resolve (or find cached) the broker's and Spark's Kafka jars, and build the
    shopstream's jar; returns name -> version (the jar's file name for the last, or
    ``not built (no javac)``)."""
    broker = kafka_broker_jars(settings)
    spark = spark_kafka_jars(settings)
    contract = shopstream_jar(settings)
    return {"kafka-broker": broker.version, "spark-sql-kafka": spark.version,
            "shopstream-jvm": contract.name if contract is not None else "not built (no javac)"}


def up(settings: Settings, *, kafka: bool = True, redis: bool = True) -> None:
    if redis:
        RedisServer(settings).start()
    if kafka:
        KafkaBroker(settings).start()


def down(settings: Settings, *, purge: bool = False) -> dict[str, bool]:
    stopped = {
        "kafka": KafkaBroker(settings).stop(),
        "redis": RedisServer(settings).stop(),
    }
    if purge:
        shutil.rmtree(KafkaBroker(settings).home, ignore_errors=True)
        shutil.rmtree(RedisServer(settings).home, ignore_errors=True)
    return stopped


def status(settings: Settings) -> dict[str, Any]:
    return {
        "kafka": KafkaBroker(settings).status(),
        "redis": RedisServer(settings).status(),
    }
