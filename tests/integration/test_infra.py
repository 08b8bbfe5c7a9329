"""The project's own infra code starts a real Kafka broker and a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.connections import kafka_consumer, kafka_producer
from pipelines.infra import KafkaBroker, RedisServer
from pipelines.infra.kafka_broker import topic_message_counts
from pipelines.settings import Settings

pytestmark = pytest.mark.integration


def test_kafka_produce_and_read_back(settings: Settings, kafka_broker: KafkaBroker, topic: str) -> None:
    producer = kafka_producer(settings)
    for i in range(50):
        producer.send(topic, key=f"u{i % 5}".encode(), value=f'{{"n": {i}}}'.encode())
    producer.flush()
    producer.close()
    consumer = kafka_consumer(settings, topic, consumer_timeout_ms=5000)
    values = sorted(int(m.value.decode()[6:-1]) for m in consumer)
    consumer.close()
    assert values == list(range(50))
    [info] = topic_message_counts(settings, [topic])
    assert info.messages == 50 and info.partitions == settings.kafka_topic_partitions


def test_kafka_start_is_idempotent(settings: Settings, kafka_broker: KafkaBroker) -> None:
    pid = kafka_broker.process.pid
    KafkaBroker(settings).start()
    assert kafka_broker.process.pid == pid
    names = {t.name for t in topic_message_counts(settings)}
    assert settings.kafka_topic_events in names


def test_redis_roundtrip_and_persistence_config(redis_server: RedisServer, redis_client: Any) -> None:
    redis_client.set("k", "v")
    assert redis_client.get("k") == b"v"
    assert redis_client.config_get("appendonly")["appendonly"] == "yes"
    # the append-only file is rewritten only once it is large (the setting, 1 GB by default)
    rewrite_min = redis_client.config_get("auto-aof-rewrite-min-size")["auto-aof-rewrite-min-size"]
    assert int(rewrite_min) == redis_server.settings.redis_aof_rewrite_min_mb * 1024 * 1024
    assert Settings.model_fields["redis_aof_rewrite_min_mb"].default == 1024
    assert redis_client.config_get("bind")["bind"].startswith("127.0.0.1")


def test_redis_password_required(start_redis: Any, tmp_path: Any) -> None:
    import redis

    server = start_redis(redis_password="s3cret-pw")
    anonymous = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    status = server.status()
    assert status["healthy"] is True
    assert "s3cret-pw" not in (tmp_path / "run" / "redis" / "redis.log").read_text()
    server.stop()
    assert not server.process.is_running()
