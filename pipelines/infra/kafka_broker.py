"""An embedded Apache Kafka broker: one KRaft node (broker and controller) on loopback.

It is the real broker, run on the machine's JVM from jars that Maven resolves
(:mod:`pipelines.infra.jars`); only its lifecycle is ours: write a config,
format the storage once, start, wait until an admin request succeeds, create
the topics.
"""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.connections import kafka_admin, kafka_unreachable
from pipelines.infra.jars import kafka_broker_jars
from pipelines.infra.process import (
    ManagedProcess,
    StartupError,
    ensure_ports_free,
    log_size,
    wait_until,
)
from pipelines.settings import Settings

__all__ = ["KafkaBroker", "TopicInfo"]

log = logging.getLogger(__name__)

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def _java_error(stderr: str, limit: int = 800) -> str:
    """What a JVM tool's failure says, without its stack frames: the tail of a trace is
    ``at ...`` lines and would hide the exception's own message."""
    said = [line for line in stderr.strip().splitlines()
            if line.strip() and not line.lstrip().startswith(("at ", "..."))]
    text = " | ".join(line.strip() for line in said) or stderr.strip()
    return text[:limit]


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    messages: int


class KafkaBroker:
    """Lifecycle of the local broker described by ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.run_path / "kafka"
        self.data_dir = self.home / "data"
        self.process = ManagedProcess("kafka", self.home / "kafka.pid", self.home / "kafka.out")
        host, port = settings.kafka_bootstrap[0]
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _write_config(self) -> Path:
        s = self.settings
        ctl = f"{self.host}:{s.kafka_controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": ctl,
            "listeners": f"PLAINTEXT://{self.address},CONTROLLER://{ctl}",
            "advertised.listeners": f"PLAINTEXT://{self.address}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": str(s.kafka_topic_partitions),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
            "log.segment.bytes": str(256 * 1024 * 1024),
        }
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(LOG4J2.format(log_file=self.home / "kafka.log"))
        return path

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not on PATH; Kafka and Spark need a JDK 17+")
        return java

    def _base_cmd(self, classpath: str) -> list[str]:
        return [
            self._java(),
            f"-Xmx{self.settings.kafka_heap}",
            f"-Xms{self.settings.kafka_heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp",
            classpath,
        ]

    def _format_storage(self, classpath: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        import subprocess

        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        cmd = self._base_cmd(classpath) + [
            "kafka.tools.StorageTool", "format", "--standalone", "--ignore-formatted",
            # "=" form: a base64 id may start with "-", which argparse would read as an option.
            f"--cluster-id={cluster_id}", f"--config={self.home / 'server.properties'}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StartupError(f"formatting Kafka storage failed: {_java_error(result.stderr)}")

    def start(self, timeout: float = 90.0) -> None:
        """Start the broker (no-op when it is already running) and create the topics."""
        log_from = log_size(self.home / "kafka.log")
        if self.process.is_running():
            log.info("kafka already running (pid %s) on %s", self.process.pid, self.address)
        else:
            if self.settings.kafka_controller_port == self.port:
                raise StartupError(
                    f"cannot start the Kafka broker: SHOPSTREAM_KAFKA_CONTROLLER_PORT ({self.port}) is "
                    f"the port of SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS ({self.address}); the broker's "
                    "controller needs a port of its own")
            ensure_ports_free("the Kafka broker", [(self.host, self.port)],
                              "SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS")
            ensure_ports_free("the Kafka broker's controller",
                              [(self.host, self.settings.kafka_controller_port)],
                              "SHOPSTREAM_KAFKA_CONTROLLER_PORT")
            jars = kafka_broker_jars(self.settings)
            self._write_config()
            self._format_storage(jars.classpath)
            cmd = self._base_cmd(jars.classpath) + ["kafka.Kafka", str(self.home / "server.properties")]
            pid = self.process.start(cmd)
            log.info("kafka starting (pid %s) on %s", pid, self.address)
        wait_until(
            self._ready, timeout=timeout, what=f"Kafka broker on {self.address}",
            alive=self.process.is_running, log_file=self.home / "kafka.log", log_from=log_from,
        )
        self.ensure_topics()

    def _ready(self) -> bool:
        # A plain TCP connect first: until the listener is up, kafka-python would log
        # connection errors and back off for up to 30 s between its own retries.
        with socket.create_connection((self.host, self.port), timeout=1):
            pass
        admin = kafka_admin(self.settings, request_timeout_ms=3000, reconnect_backoff_max_ms=500)
        try:
            admin.list_topics()
            return True
        finally:
            admin.close()

    def topic_specs(self) -> dict[str, int]:
        s = self.settings
        return {s.kafka_topic_events: s.kafka_topic_partitions}

    def ensure_topics(self) -> None:
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = kafka_admin(self.settings)
        try:
            existing = set(admin.list_topics())
            new = [
                NewTopic(name, partitions, 1)
                for name, partitions in self.topic_specs().items()
                if name not in existing
            ]
            if new:
                try:
                    admin.create_topics(new)
                except TopicAlreadyExistsError:
                    pass
                log.info("created topics %s", [t.name for t in new])
        finally:
            admin.close()

    def stop(self) -> bool:
        return self.process.stop(timeout=30)

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {"address": self.address, "pid": self.process.pid}
        if (problem := kafka_unreachable(self.settings)) is not None:
            return {**info, "healthy": False, "error": problem}
        try:
            topics = topic_message_counts(self.settings)
            info.update(healthy=True, topics=topics)
        except Exception as exc:  # noqa: BLE001 - status reports, never raises
            info.update(healthy=False, error=str(exc).splitlines()[0][:200])
        return info


def topic_message_counts(settings: Settings, topics: list[str] | None = None) -> list[TopicInfo]:
    """Messages per topic (sum over partitions of end minus beginning offsets)."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer

    consumer = kafka_consumer(settings, request_timeout_ms=5000)
    try:
        names = topics or sorted(t for t in consumer.topics() if not t.startswith("__"))
        result = []
        for name in names:
            parts = consumer.partitions_for_topic(name) or set()
            tps = [TopicPartition(name, p) for p in parts]
            end = consumer.end_offsets(tps) if tps else {}
            begin = consumer.beginning_offsets(tps) if tps else {}
            result.append(TopicInfo(name, len(tps), sum(end[tp] - begin[tp] for tp in tps)))
        return result
    finally:
        consumer.close()
