"""A Spark standalone cluster on this machine: one master and one worker, from pyspark's own jars.

The same ``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``
processes a real standalone cluster runs, started from the installed pyspark
(``SPARK_HOME`` = the pyspark package), on loopback, tracked by pid files like
the other local servers. Jobs reach it with ``spark_master =
spark://127.0.0.1:<spark_standalone_port>``; executors are separate JVMs with
their own Python workers, so anything that only works because the driver and
the executors share a process shows up here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

from pipelines.infra.process import ManagedProcess, ensure_ports_free, log_size, wait_until
from pipelines.settings import Settings

__all__ = ["SparkStandalone", "spark_home"]

log = logging.getLogger(__name__)


def spark_home() -> Path:
    """The installed pyspark package, which is a complete Spark distribution (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkStandalone:
    """Lifecycle of the local master + worker described by ``settings``."""

    def __init__(self, settings: Settings, host: str = "127.0.0.1") -> None:
        self.settings = settings
        self.host = host
        self.home = settings.run_path / "spark-standalone"
        self.master = ManagedProcess("spark-master", self.home / "master.pid",
                                     self.home / "master.out")
        self.worker = ManagedProcess("spark-worker", self.home / "worker.pid",
                                     self.home / "worker.out")

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.settings.spark_standalone_port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.settings.spark_standalone_ui_port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOG_DIR=str(self.home / "logs"),
            SPARK_WORKER_DIR=str(self.home / "work"),
            # executors start Python workers with this interpreter (the venv)
            PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable),
        )
        return env

    def _spark_class(self) -> str:
        path = spark_home() / "bin" / "spark-class"
        if not path.exists():
            raise RuntimeError(f"{path} not found; is pyspark installed completely?")
        return str(path)

    def start(self, timeout: float = 90.0) -> None:
        """Start the master, then the worker; return once the worker has registered."""
        if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
            raise RuntimeError("Java is not on PATH (Spark needs a JDK 17)")
        s = self.settings
        self.home.mkdir(parents=True, exist_ok=True)
        env = self._env()
        master_log, worker_log = log_size(self.master.log_file), log_size(self.worker.log_file)
        if not self.master.is_running():
            # Spark would bind the next port instead, and the worker look for it on this one
            ensure_ports_free("the Spark master", [(self.host, s.spark_standalone_port)],
                              "SHOPSTREAM_SPARK_STANDALONE_PORT")
            ensure_ports_free("the Spark master's web UI", [(self.host, s.spark_standalone_ui_port)],
                              "SHOPSTREAM_SPARK_STANDALONE_UI_PORT")
            self.master.start([self._spark_class(), "org.apache.spark.deploy.master.Master",
                               "--host", self.host, "--port", str(s.spark_standalone_port),
                               "--webui-port", str(s.spark_standalone_ui_port)],
                              env=env, cwd=self.home)
            log.info("spark master starting on %s", self.master_url)
        wait_until(self._master_state, timeout=timeout, what=f"Spark master {self.master_url}",
                   alive=self.master.is_running, log_file=self.master.log_file,
                   log_from=master_log)
        if not self.worker.is_running():
            self.worker.start([self._spark_class(), "org.apache.spark.deploy.worker.Worker",
                               self.master_url, "--host", self.host,
                               "--cores", str(s.spark_standalone_worker_cores),
                               "--memory", s.spark_standalone_worker_memory,
                               "--webui-port", "0",
                               "--work-dir", str(self.home / "work")],
                              env=env, cwd=self.home)
            log.info("spark worker starting (%d cores, %s)", s.spark_standalone_worker_cores,
                     s.spark_standalone_worker_memory)
        wait_until(self._worker_alive, timeout=timeout, what="Spark worker registration",
                   alive=self.worker.is_running, log_file=self.worker.log_file,
                   log_from=worker_log)

    def _master_state(self) -> dict[str, Any] | None:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=2) as response:  # noqa: S310
            state = json.loads(response.read())
        return state if state.get("status") == "ALIVE" else None

    def _worker_alive(self) -> bool:
        state = self._master_state() or {}
        return any(w.get("state") == "ALIVE" for w in state.get("workers", []))

    def stop(self) -> dict[str, bool]:
        """Stop the worker (and its executors), then the master."""
        return {"worker": self.worker.stop(timeout=20), "master": self.master.stop(timeout=20)}

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {"address": self.master_url, "pid": self.master.pid}
        try:
            state = self._master_state() or {}
            info.update(healthy=bool(state), workers=len(state.get("workers", [])),
                        cores=state.get("cores"), active_apps=len(state.get("activeapps", [])))
        except Exception as exc:  # noqa: BLE001 - status reports, never raises
            info.update(healthy=False, error=str(exc).splitlines()[0][:200])
        return info
