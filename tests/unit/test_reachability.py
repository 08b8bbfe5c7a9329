"""The up-front reachability checks (pipelines.connections): what a command says, at once,
when its Kafka or Redis is not there. Real sockets; the Redis login case is in
``tests/integration/test_redis_security.py``."""

from __future__ import annotations

from pipelines.connections import (
    kafka_silent,
    kafka_unreachable,
    redis_unreachable,
    servers_unreachable,
)
from pipelines.settings import Settings
from tests.conftest import free_port


def _settings(**overrides: object) -> Settings:
    return Settings(_env_file=None, **overrides)  # type: ignore[arg-type]


def test_kafka_refused_names_the_address_the_reason_and_the_setting() -> None:
    port = free_port()
    problem = kafka_unreachable(_settings(kafka_bootstrap_servers=f"127.0.0.1:{port}"))
    assert problem == (f"cannot reach Kafka at 127.0.0.1:{port} (connection refused): start it "
                       "with `shopstream infra up` or set SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS")


def test_kafka_is_reachable_when_any_bootstrap_server_accepts(listening: int) -> None:
    servers = f"nohost.invalid:9092,127.0.0.1:{free_port()},127.0.0.1:{listening}"
    assert kafka_unreachable(_settings(kafka_bootstrap_servers=servers)) is None


def test_kafka_none_reachable_lists_each_server_with_its_reason() -> None:
    port = free_port()
    problem = kafka_unreachable(_settings(kafka_bootstrap_servers=f"nohost.invalid:9092,127.0.0.1:{port}"))
    assert problem is not None
    assert f"nohost.invalid:9092 (unknown host), 127.0.0.1:{port} (connection refused)" in problem


def test_kafka_silent_names_every_server_the_likely_causes_and_the_setting() -> None:
    """Said when a Kafka call timed out though a server takes connections."""
    problem = kafka_silent(_settings(kafka_bootstrap_servers="b-1.example:9096,127.0.0.1:9092",
                                     kafka_sasl_password="s3cret-pw",
                                     kafka_sasl_mechanism="PLAIN",
                                     kafka_security_protocol="SASL_SSL"))
    assert problem.startswith("Kafka at b-1.example:9096, 127.0.0.1:9092 accepts connections "
                              "but did not answer in time (")
    assert "a partition without a leader" in problem
    assert "SHOPSTREAM_KAFKA_SECURITY_PROTOCOL" in problem
    assert "s3cret-pw" not in problem


def test_redis_refused_and_hung_name_the_address_and_the_setting(listening: int) -> None:
    port = free_port()
    refused = redis_unreachable(_settings(redis_url=f"redis://127.0.0.1:{port}/0",
                                          redis_password="s3cret-pw"))
    assert refused == (f"cannot reach Redis at 127.0.0.1:{port} (connection refused): start it "
                       "with `shopstream infra up` or set SHOPSTREAM_REDIS_URL")
    hung = redis_unreachable(_settings(redis_url=f"redis://127.0.0.1:{listening}/0",
                                       redis_password="s3cret-pw"), timeout_s=0.5)
    assert hung is not None and f"127.0.0.1:{listening} (timed out)" in hung
    assert "s3cret-pw" not in refused + hung


def test_servers_unreachable_lists_only_those_that_fail(listening: int) -> None:
    settings = _settings(kafka_bootstrap_servers=f"127.0.0.1:{listening}",
                         redis_url=f"redis://127.0.0.1:{free_port()}/0")
    problems = servers_unreachable(settings)
    assert len(problems) == 1 and problems[0].startswith("cannot reach Redis")
    assert servers_unreachable(settings, redis_too=False) == []


def test_an_mlflow_server_that_refuses_is_named_with_the_setting(listening: int) -> None:
    """MLflow's client retried a refused request for 4 min 15 s, then raised a traceback."""
    from pipelines.connections import mlflow_unreachable

    port = free_port()
    problem = mlflow_unreachable(_settings(mlflow_tracking_uri=f"http://127.0.0.1:{port}/mlflow?x=1"))
    assert problem == (f"cannot reach the MLflow tracking server at http://127.0.0.1:{port}/mlflow "
                       "(connection refused): start it, or set SHOPSTREAM_MLFLOW_TRACKING_URI "
                       "(unset: a local SQLite store)")
    assert mlflow_unreachable(_settings(mlflow_tracking_uri=f"http://127.0.0.1:{listening}")) is None
    # not servers: nothing to reach
    assert mlflow_unreachable(_settings(mlflow_tracking_uri="sqlite:////tmp/x/mlflow.db")) is None
    assert mlflow_unreachable(_settings()) is None
    assert mlflow_unreachable(_settings(mlflow_tracking_uri="databricks")) is None
    unknown = mlflow_unreachable(_settings(mlflow_tracking_uri="https://nohost.invalid"))
    assert unknown is not None and unknown.startswith(
        "cannot reach the MLflow tracking server at https://nohost.invalid:443 (unknown host)")
