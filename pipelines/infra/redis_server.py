"""A local ``redis-server`` (Debian package) with a generated config.

Loopback only, append-only persistence, a password and an ACL user when the
settings carry them, and TLS when the URL is ``rediss://`` (then the plain port
is closed). Production uses ElastiCache or a Redis cluster instead: only the
settings change.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, cast

from pipelines.connections import redis_client, redis_unreachable
from pipelines.infra.process import ManagedProcess, ensure_ports_free, log_size, wait_until
from pipelines.settings import Settings

__all__ = ["RedisServer", "redis_server_binary"]

log = logging.getLogger(__name__)


def redis_server_binary(settings: Settings) -> str:
    path = shutil.which(settings.redis_server_bin)
    if path is None:
        raise RuntimeError(
            f"{settings.redis_server_bin!r} is not on PATH; install Debian's redis-server "
            "package (apt-get install redis-server) or run `make setup`, which does when root"
        )
    return path


class RedisServer:
    """Lifecycle of the local Redis described by ``settings``."""

    def __init__(self, settings: Settings, name: str = "redis") -> None:
        self.settings = settings
        self.home = settings.run_path / name
        self.process = ManagedProcess(name, self.home / "redis.pid", self.home / "redis.out")
        self.host, self.port = settings.redis_address

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _config(self) -> str:
        s = self.settings
        data = self.home / "data"
        data.mkdir(parents=True, exist_ok=True)
        lines = [
            f"bind {self.host}",
            "protected-mode yes",
            f"dir {data}",
            f"logfile {self.home / 'redis.log'}",
            "daemonize no",
            "appendonly yes",
            "appendfsync everysec",
            f"auto-aof-rewrite-min-size {s.redis_aof_rewrite_min_mb}mb",
            "save ''",
            "maxmemory-policy noeviction",
            "tcp-keepalive 60",
        ]
        if s.redis_tls:
            if not (s.redis_tls_cert and s.redis_tls_key):
                raise RuntimeError("rediss:// needs redis_tls_cert and redis_tls_key for the local server")
            lines += [
                "port 0",
                f"tls-port {self.port}",
                f"tls-cert-file {s.redis_tls_cert}",
                f"tls-key-file {s.redis_tls_key}",
                "tls-auth-clients no",
            ]
            if s.redis_tls_ca_cert:
                lines.append(f"tls-ca-cert-file {s.redis_tls_ca_cert}")
        else:
            lines.append(f"port {self.port}")
        secret = s.redis_secret()
        if secret:
            if s.redis_username:
                # An ACL user for the project; the default user keeps no access.
                lines.append(f"user {s.redis_username} on >{secret} ~* &* +@all")
                lines.append("user default off")
            else:
                lines.append(f"requirepass {secret}")
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 30.0) -> None:
        log_from = log_size(self.home / "redis.log")
        if self.process.is_running():
            log.info("redis already running (pid %s) on %s", self.process.pid, self.address)
        else:
            ensure_ports_free("redis-server", [(self.host, self.port)], "SHOPSTREAM_REDIS_URL")
            binary = redis_server_binary(self.settings)
            self.home.mkdir(parents=True, exist_ok=True)
            conf = self.home / "redis.conf"
            conf.write_text(self._config())
            conf.chmod(0o600)  # it may hold a password
            pid = self.process.start([binary, str(conf)])
            log.info("redis starting (pid %s) on %s", pid, self.address)
        wait_until(
            self._ping, timeout=timeout, what=f"redis-server on {self.address}",
            alive=self.process.is_running, log_file=self.home / "redis.log", log_from=log_from,
        )

    def _ping(self) -> bool:
        client = redis_client(self.settings, timeout_ms=1000)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def stop(self) -> bool:
        return self.process.stop(timeout=20)

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {"address": self.address, "pid": self.process.pid}
        if (problem := redis_unreachable(self.settings)) is not None:
            return {**info, "healthy": False, "error": problem}  # at once, not after retries
        try:
            client = redis_client(self.settings, timeout_ms=1000)
            info.update(
                healthy=bool(client.ping()),
                keys=client.dbsize(),
                used_memory=cast(dict[str, Any], client.info("memory")).get("used_memory_human"),
            )
            client.close()
        except Exception as exc:  # noqa: BLE001 - status reports, never raises
            info.update(healthy=False, error=str(exc).splitlines()[0][:200])
        return info

    @property
    def log_path(self) -> Path:
        return self.home / "redis.log"
