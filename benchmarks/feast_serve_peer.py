"""The serving peer: Feast's Python feature server (``feast serve``) on the same Redis.

It answers ``POST /get-online-features`` for the same entities and features that
shopstream's API reads, from the same Redis keys (the features are written once,
in Feast's layout, and both read them).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from pipelines.infra.process import ManagedProcess, wait_until

__all__ = ["FeastServer"]


class FeastServer:
    """``feast serve`` as a managed process, configured from shopstream's settings."""

    def __init__(self, settings: Any, workdir: Path, port: int) -> None:
        self.settings = settings
        self.workdir = workdir
        self.port = port
        self.process = ManagedProcess("feast-serve", workdir / "feast.pid", workdir / "feast.log")

    def _write_config(self) -> None:
        from pipelines.feast_store import feature_store, redis_connection_string, registry_path

        feature_store(self.settings, apply=True)  # registers the definitions in the registry file
        config = {
            "project": "shopstream",
            "provider": "local",
            "registry": registry_path(self.settings),
            "online_store": {
                "type": "redis",
                "connection_string": redis_connection_string(self.settings),
            },
            "offline_store": {"type": "file"},
            "entity_key_serialization_version": 3,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "feature_store.yaml").write_text(yaml.safe_dump(config))

    def start(self, timeout: float = 90) -> None:
        self._write_config()
        feast = shutil.which("feast", path=str(Path(sys.executable).parent)) or "feast"
        self.process.start(
            [feast, "-c", str(self.workdir), "serve", "-h", "127.0.0.1", "-p", str(self.port),
             "--no-access-log", "-w", "1", "--max-requests", "0", "-r", "3600"],
            cwd=self.workdir,
        )
        import httpx

        wait_until(
            lambda: httpx.get(f"{self.url}/health", timeout=2).status_code == 200,
            timeout=timeout, what="feast serve", alive=self.process.is_running,
            log_file=self.process.log_file,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.stop()

    @staticmethod
    def request_body(features: list[str], entity: str, entity_id: str) -> dict[str, Any]:
        return {"features": features, "entities": {entity: [entity_id]}}
