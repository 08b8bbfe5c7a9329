"""Shared fixtures: real servers started by the project's own infra code, on free ports.

Session-scoped: one Kafka broker, one redis-server and one Spark session serve
the whole run (starting them costs seconds); each test isolates itself with its
own topic, Redis keys (or ``flushdb``) and temporary folders.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.infra.process import free_port
from pipelines.settings import Settings

__all__ = ["free_port"]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung server, or another
    program holding a port a server of ours wants)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shopstream")


@pytest.fixture(scope="session")
def make_settings(base_dir: Path) -> Callable[..., Settings]:
    """Build settings for a test: defaults from the session's servers, plus overrides."""
    ports = {
        "kafka": free_port(),
        "controller": free_port(),
        "redis": free_port(),
        "api": free_port(),
    }

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": str(base_dir / "data"),
            "run_dir": str(base_dir / "run"),
            "kafka_bootstrap_servers": f"127.0.0.1:{ports['kafka']}",
            "kafka_controller_port": ports["controller"],
            "redis_url": f"redis://127.0.0.1:{ports['redis']}/0",
            "api_port": ports["api"],
            "kafka_topic_partitions": 2,
            "spark_shuffle_partitions": 2,
            "spark_log_level": "ERROR",
            "spark_driver_memory": "1g",
        }
        values.update(overrides)
        return Settings(_env_file=None, **values)  # type: ignore[call-arg]

    return build


@pytest.fixture(scope="session")
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture(scope="session")
def redis_server(settings: Settings) -> Iterator[Any]:
    from pipelines.infra import RedisServer

    server = RedisServer(settings)
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def redis_client(settings: Settings, redis_server: Any) -> Iterator[Any]:
    """A client on a freshly emptied database."""
    from pipelines.connections import redis_client as make_client

    client = make_client(settings, timeout_ms=2000)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture()
def start_redis(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start a redis-server of the test's own, for settings the shared one lacks (AUTH, TLS, ACL).

    Call it with settings overrides (``redis_password=...``, ``scheme="rediss"``); it
    returns the started ``RedisServer`` (``.settings``, ``.port``), stopped after the test.
    """
    from pipelines.infra import RedisServer

    started: list[Any] = []

    def start(scheme: str = "redis", **overrides: Any) -> Any:
        settings = make_settings(redis_url=f"{scheme}://127.0.0.1:{free_port()}/0",
                                 run_dir=str(tmp_path / "run"), **overrides)
        server = RedisServer(settings)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def kafka_broker(settings: Settings) -> Iterator[Any]:
    from pipelines.infra import KafkaBroker

    broker = KafkaBroker(settings)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture()
def topic(settings: Settings, kafka_broker: Any) -> str:
    """A fresh topic for one test (same partition count as the events topic)."""
    from kafka.admin import NewTopic

    from pipelines.connections import kafka_admin

    name = f"test.{uuid.uuid4().hex[:12]}"
    admin = kafka_admin(settings)
    try:
        admin.create_topics([NewTopic(name, settings.kafka_topic_partitions, 1)])
    finally:
        admin.close()
    return name


@pytest.fixture(scope="session")
def spark(settings: Settings) -> Any:
    from pipelines.spark import spark_session

    session = spark_session(settings, app_name="shopstream-tests")
    yield session
    session.stop()
