"""Redis with TLS (rediss://, a CA the test makes) and with an ACL user, started for real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from pipelines.connections import redis_client
from pipelines.infra import RedisServer
from pipelines.settings import Settings
from tests.tls import make_certificates

pytestmark = pytest.mark.integration


def test_redis_tls_connects_with_ca_and_refuses_plaintext(
    make_settings: Callable[..., Settings], start_redis: Callable[..., RedisServer], tmp_path: Path
) -> None:
    certs = make_certificates(tmp_path / "certs")
    server = start_redis(scheme="rediss", redis_password="tls-pw-123", redis_tls_ca_cert=certs.ca_cert,
                       redis_tls_cert=certs.cert, redis_tls_key=certs.key)
    client = redis_client(server.settings, timeout_ms=2000)
    client.set("tls:k", "v")
    assert client.get("tls:k") == b"v"
    assert client.connection_pool.connection_kwargs.get("ssl_ca_certs") == str(certs.ca_cert)
    plain = redis.Redis(host="127.0.0.1", port=server.port, password="tls-pw-123", socket_timeout=2)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    other_ca = make_certificates(tmp_path / "other")
    wrong = redis_client(
        make_settings(redis_url=f"rediss://127.0.0.1:{server.port}/0", redis_password="tls-pw-123",
                      redis_tls_ca_cert=other_ca.ca_cert),
        timeout_ms=2000,
    )
    with pytest.raises(redis.ConnectionError):
        wrong.ping()


def test_redis_acl_user_only(start_redis: Callable[..., RedisServer], tmp_path: Path) -> None:
    server = start_redis(redis_username="shopstream", redis_password="acl-pw-456")
    client = redis_client(server.settings, timeout_ms=2000)
    assert client.acl_whoami() == "shopstream"
    default_user = redis.Redis(host="127.0.0.1", port=server.port, password="acl-pw-456", socket_timeout=2)
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        default_user.ping()
    wrong = redis.Redis(host="127.0.0.1", port=server.port, username="shopstream", password="nope",
                        socket_timeout=2)
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    conf = (tmp_path / "run" / "redis" / "redis.conf")
    assert oct(conf.stat().st_mode & 0o777) == "0o600"


def test_a_wrong_redis_password_is_named_at_once_without_the_password(
        make_settings: Callable[..., Settings], start_redis: Callable[..., RedisServer]) -> None:
    """What ``shopstream stream`` and ``shopstream status`` say before anything else runs."""
    from pipelines.connections import redis_unreachable

    server = start_redis(redis_password="right-pw-789")
    assert redis_unreachable(server.settings) is None
    wrong = make_settings(redis_url=server.settings.redis_url, redis_password="wrong-pw-789",
                          run_dir=server.settings.run_dir)
    problem = redis_unreachable(wrong)
    assert problem is not None and problem.startswith(f"Redis at 127.0.0.1:{server.port} refused the login")
    assert "SHOPSTREAM_REDIS_PASSWORD" in problem and "wrong-pw-789" not in problem
    status = RedisServer(wrong).status()
    assert status["healthy"] is False and status["error"] == problem
