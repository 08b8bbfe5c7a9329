"""Clients for Redis and Kafka, built from :class:`~pipelines.settings.Settings`.

The one place that turns settings into connection options (AUTH, ACL user, TLS,
SASL), so the stream, the training job and the API connect the same way.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pipelines.settings import Settings

__all__ = ["redis_client", "redis_kwargs", "redis_pool_kwargs", "kafka_producer", "kafka_admin",
           "kafka_consumer", "kafka_topic_id", "kafka_unreachable", "redis_unreachable", "servers_unreachable",
           "mlflow_unreachable", "Unreachable"]


def redis_kwargs(settings: Settings, *, timeout_ms: int | None = None) -> dict[str, Any]:
    """Keyword arguments for :class:`redis.Redis` (picklable: safe to ship to executors)."""
    host, port = settings.redis_address
    timeout = (timeout_ms or settings.redis_socket_timeout_ms) / 1000.0
    kwargs: dict[str, Any] = {
        "host": host,
        "port": port,
        "db": settings.redis_db,
        "password": settings.redis_secret(),
        "username": settings.redis_username,
        "socket_timeout": timeout,
        "socket_connect_timeout": max(timeout, 1.0),
        "health_check_interval": 30,
    }
    if settings.redis_tls:
        kwargs["ssl"] = True
        kwargs["ssl_cert_reqs"] = "required" if settings.redis_tls_ca_cert else "none"
        if settings.redis_tls_ca_cert:
            kwargs["ssl_ca_certs"] = str(settings.redis_tls_ca_cert)
        if settings.redis_tls_cert:
            kwargs["ssl_certfile"] = str(settings.redis_tls_cert)
        if settings.redis_tls_key:
            kwargs["ssl_keyfile"] = str(settings.redis_tls_key)
    return kwargs


def redis_pool_kwargs(kwargs: dict[str, Any], *, asyncio: bool = False) -> dict[str, Any]:
    """:func:`redis_kwargs` made fit for an explicit ``ConnectionPool`` (sync or asyncio).

    ``redis.Redis(ssl=True)`` picks the TLS connection class itself; a pool built
    by hand does not know ``ssl`` and needs ``connection_class=SSLConnection``.
    """
    out = dict(kwargs)
    if out.pop("ssl", False):
        if asyncio:
            from redis.asyncio.connection import SSLConnection as AsyncSSLConnection

            out["connection_class"] = AsyncSSLConnection
        else:
            out["connection_class"] = redis.SSLConnection
    return out


def redis_client(settings: Settings, *, timeout_ms: int | None = None, **overrides: Any) -> redis.Redis:
    """A pooled Redis client (hiredis parser when installed, which redis-py picks itself)."""
    kwargs = redis_kwargs(settings, timeout_ms=timeout_ms)
    kwargs.update(overrides)
    return redis.Redis(**kwargs)


REACH_TIMEOUT_S = 3.0
"""How long a reachability check waits for a server to accept a connection."""


def kafka_unreachable(settings: Settings, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why no Kafka bootstrap server accepts a TCP connection (one line naming the
    addresses and the setting), or ``None`` when one does.

    A refused connection answers at once, where kafka-python's bootstrap backs off for up
    to 30 s and logs each attempt (``shopstream status`` took 47 s and printed some 40 lines
    before its table), and Spark's Kafka source retries for minutes with a stack trace a
    minute. A server that accepts the connection may still fail later (TLS, SASL): the
    clients report that themselves.
    """
    reasons = []
    for host, port in settings.kafka_bootstrap:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as exc:
            reasons.append(f"{host}:{port} ({_reason(exc)})")
    return (f"cannot reach Kafka at {', '.join(reasons)}: start it with `shopstream infra up` "
            "or set SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS")


def kafka_silent(settings: Settings) -> str:
    """What to say of a Kafka call that timed out while a bootstrap server accepts
    connections (:func:`kafka_unreachable` found nothing wrong): a broker that takes them
    but does not answer, whose timeout kafka-python tells as ``KafkaTimeoutError: None``."""
    servers = ", ".join(f"{host}:{port}" for host, port in settings.kafka_bootstrap)
    return (f"Kafka at {servers} accepts connections but did not answer in time (a broker "
            "hung or starting, a partition without a leader, or a proxy with no broker behind "
            "it; check SHOPSTREAM_KAFKA_SECURITY_PROTOCOL if TLS or SASL changed)")


def redis_unreachable(settings: Settings, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why Redis does not answer a ``PING`` with the job's options (AUTH, TLS), in one line
    naming the address and the settings, or ``None`` when it does. The password is never
    part of it."""
    host, port = settings.redis_address
    # one try: redis-py's default retries with backoff took 11 s to give up on a refusal
    client = redis.Redis(**{**redis_kwargs(settings, timeout_ms=int(timeout_s * 1000)),
                            "socket_connect_timeout": timeout_s,
                            "retry": Retry(NoBackoff(), 0)})
    try:
        client.ping()
        return None
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        return (f"Redis at {host}:{port} refused the login ({_reason(exc)}): check "
                "SHOPSTREAM_REDIS_USERNAME and SHOPSTREAM_REDIS_PASSWORD")
    except (redis.RedisError, OSError) as exc:
        return (f"cannot reach Redis at {host}:{port} ({_reason(exc)}): start it with "
                "`shopstream infra up` or set SHOPSTREAM_REDIS_URL")
    finally:
        client.close()


class Unreachable(ConnectionError):
    """A server a command needs does not answer; the message is one line naming it and the
    setting (what :func:`kafka_unreachable` and the others say)."""


def mlflow_unreachable(settings: Settings, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why the MLflow tracking server does not accept a connection (one line), or ``None``
    when it does or the store is not a server (SQLite, a folder, Databricks).

    MLflow's client retries a refused request 7 times with a growing backoff: ``shopstream
    train`` took 4 min 15 s to end with a traceback when the server was down."""
    uri = settings.tracking_uri
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except OSError as exc:
        shown = parts._replace(netloc=f"{parts.hostname}:{port}", query="", fragment="").geturl()
        return (f"cannot reach the MLflow tracking server at {shown} ({_reason(exc)}): start "
                "it, or set SHOPSTREAM_MLFLOW_TRACKING_URI (unset: a local SQLite store)")


def servers_unreachable(settings: Settings, *, redis_too: bool = True) -> list[str]:
    """What :func:`kafka_unreachable` and :func:`redis_unreachable` say, of those that fail."""
    checks = [kafka_unreachable(settings)] + ([redis_unreachable(settings)] if redis_too else [])
    return [problem for problem in checks if problem]


def _reason(exc: BaseException) -> str:
    """An OS or client error in a few words: "connection refused", "timed out"."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, redis.ConnectionError) and isinstance(cause, OSError):
        exc = cause  # redis-py wraps the socket's error in a sentence of its own
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout | redis.TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.rstrip(".")


class _SlowLoopStep(logging.Filter):
    """Drops kafka-python 3's "Task ... ran for 0.2s (>0.100s threshold). It is blocking the
    event loop" warnings (``kafka.net.selector``).

    The client's network loop reports every step over 0.1 s, a threshold meant to catch
    its own livelocks. On 2 cores shared by Spark, the feed and the servers, a step waits
    for the GIL that long several times a minute, so the stream's and the benchmarks' logs
    carried a few of these a second under load (with an object address and "other
    pollers will time out") while nothing timed out. The client's option for it
    (``slow_task_threshold_secs``) is not among the consumer's and producer's configs, so
    it cannot be raised from here; a delay that matters shows in the tile feed's own
    freshness report (``rt_feed_*`` in ``shopstream status``). Other warnings pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "blocking the event loop" not in str(record.msg)


_SLOW_LOOP_STEP = _SlowLoopStep()


def _quiet_slow_loop_steps() -> None:
    logger = logging.getLogger("kafka.net.selector")
    if _SLOW_LOOP_STEP not in logger.filters:
        logger.addFilter(_SLOW_LOOP_STEP)


def kafka_producer(settings: Settings, **overrides: Any) -> Any:
    from kafka import KafkaProducer

    cfg: dict[str, Any] = settings.kafka_client_config()
    cfg.update(
        acks="all",
        linger_ms=20,
        batch_size=256 * 1024,
        compression_type=None,
        max_in_flight_requests_per_connection=5,
        retries=10,
    )
    cfg.update(overrides)
    _quiet_slow_loop_steps()
    return KafkaProducer(**cfg)


def kafka_admin(settings: Settings, **overrides: Any) -> Any:
    from kafka.admin import KafkaAdminClient

    cfg: dict[str, Any] = settings.kafka_client_config()
    cfg.update(request_timeout_ms=10_000)
    cfg.update(overrides)
    _quiet_slow_loop_steps()
    return KafkaAdminClient(**cfg)


def kafka_topic_id(settings: Settings, topic: str, *, wait_s: float = 5.0) -> str | None:
    """Kafka's id of ``topic`` (KIP-516): a topic deleted and created again under its name
    gets a new one, and its offsets start at 0 again. ``None`` when the broker does not
    tell (older than 2.8) or the topic is still unknown after ``wait_s`` (a topic just
    created is not in every broker's metadata at once)."""
    admin = kafka_admin(settings)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            described = [t for t in admin.describe_topics([topic]) if t.get("name") == topic]
            found = described[0].get("topic_id") if described else None
            if found is not None and int(uuid.UUID(str(found))) != 0:
                return str(found)
            if (described and not described[0].get("error_code")) or time.monotonic() > deadline:
                return None
            time.sleep(0.2)
    finally:
        admin.close()


def kafka_consumer(settings: Settings, *topics: str, **overrides: Any) -> Any:
    from kafka import KafkaConsumer

    cfg: dict[str, Any] = settings.kafka_client_config()
    cfg.update(auto_offset_reset="earliest", enable_auto_commit=False)
    cfg.update(overrides)
    _quiet_slow_loop_steps()
    return KafkaConsumer(*topics, **cfg)
