"""Redis with TLS (rediss://, a CA the test makes) and with an ACL user, started for real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from pipelines.connections import redis_client
from pipelines.infra import RedisServer
from pipelines.settings import Settings
from tests.conftest import free_port
from tests.tls import make_certificates

pytestmark = pytest.mark.integration


def test_redis_tls_connects_with_ca_and_refuses_plaintext(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    certs = make_certificates(tmp_path / "certs")
    port = free_port()
    settings = make_settings(
        redis_url=f"rediss://127.0.0.1:{port}/0",
        redis_password="tls-pw-123",
        redis_tls_ca_cert=certs.ca_cert,
        redis_tls_cert=certs.cert,
        redis_tls_key=certs.key,
        run_dir=str(tmp_path / "run"),
    )
    server = RedisServer(settings)
    server.start()
    try:
        client = redis_client(settings, timeout_ms=2000)
        client.set("tls:k", "v")
        assert client.get("tls:k") == b"v"
        assert client.connection_pool.connection_kwargs.get("ssl_ca_certs") == str(certs.ca_cert)
        plain = redis.Redis(host="127.0.0.1", port=port, password="tls-pw-123", socket_timeout=2)
        with pytest.raises(redis.ConnectionError):
            plain.ping()
        other_ca = make_certificates(tmp_path / "other")
        wrong = redis_client(
            make_settings(redis_url=f"rediss://127.0.0.1:{port}/0", redis_password="tls-pw-123",
                          redis_tls_ca_cert=other_ca.ca_cert),
            timeout_ms=2000,
        )
        with pytest.raises(redis.ConnectionError):
            wrong.ping()
    finally:
        server.stop()


def test_redis_acl_user_only(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    port = free_port()
    settings = make_settings(
        redis_url=f"redis://127.0.0.1:{port}/0",
        redis_username="shopstream",
        redis_password="acl-pw-456",
        run_dir=str(tmp_path / "run"),
    )
    server = RedisServer(settings)
    server.start()
    try:
        client = redis_client(settings, timeout_ms=2000)
        assert client.acl_whoami() == "shopstream"
        default_user = redis.Redis(host="127.0.0.1", port=port, password="acl-pw-456", socket_timeout=2)
        with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
            default_user.ping()
        wrong = redis.Redis(host="127.0.0.1", port=port, username="shopstream", password="nope",
                            socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
        conf = (tmp_path / "run" / "redis" / "redis.conf")
        assert oct(conf.stat().st_mode & 0o777) == "0o600"
    finally:
        server.stop()


def test_a_wrong_redis_password_is_named_at_once_without_the_password(
        make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    """What ``shopstream stream`` and ``shopstream status`` say before anything else runs."""
    from pipelines.connections import redis_unreachable

    port = free_port()
    settings = make_settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_password="right-pw-789",
                             run_dir=str(tmp_path / "run"))
    server = RedisServer(settings)
    server.start()
    try:
        assert redis_unreachable(settings) is None
        wrong = make_settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_password="wrong-pw-789",
                              run_dir=str(tmp_path / "run"))
        problem = redis_unreachable(wrong)
        assert problem is not None and problem.startswith(f"Redis at 127.0.0.1:{port} refused the login")
        assert "SHOPSTREAM_REDIS_PASSWORD" in problem and "wrong-pw-789" not in problem
        status = RedisServer(wrong).status()
        assert status["healthy"] is False and status["error"] == problem
    finally:
        server.stop()
