"""Shared pieces of the reliability suite: sizes, real CLI subprocesses, topic read-back.

Sizes
    Every test has a default size (what ``make test`` / CI runs: small but real)
    and a full size (``make reliability``, which sets ``SHOPSTREAM_RELIABILITY_FULL=1``;
    the variable is read only here, never by the project's settings).

Subprocesses
    The jobs run as the user runs them: ``python -m pipelines.cli <command>``,
    each in its own process group (driver and JVM killed together), configured only
    by ``SHOPSTREAM_*`` environment variables built from a :class:`Settings`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pipelines.settings import Settings

REPO = Path(__file__).resolve().parents[2]
FULL = os.environ.get("SHOPSTREAM_RELIABILITY_FULL", "") not in ("", "0", "false", "no")

T = TypeVar("T")


def size(default: T, full: T) -> T:
    """The CI size, or the full one under ``make reliability``."""
    return full if FULL else default


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment without any ``SHOPSTREAM_*``, plus every setting the
    test set explicitly (secrets included: the child must connect like the parent)."""
    env = {k: v for k, v in settings.child_env().items() if not k.startswith("PROMETHEUS_MULTIPROC")}
    env["PYSPARK_PYTHON"] = sys.executable
    env.update(extra)
    return env


class CliProcess:
    """``shopstream <args>`` as its own process group, output appended to ``log_path``."""

    def __init__(self, settings: Settings, args: list[str], log_path: Path, *,
                 cwd: Path | None = None, **extra_env: str) -> None:
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in wait/kill
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", *args],
            cwd=cwd or REPO, env=cli_env(settings, **extra_env), stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Signal the whole group (driver, JVM, Python workers), wait for the leader."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.log.close()
            if sig == signal.SIGKILL:
                _reap_group(self.proc.pid)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"shopstream {' '.join(self.args)} did not finish within {timeout} s; "
                f"log tail:\n{tail(self.log_path)}") from None
        finally:
            if not self.log.closed:
                self.log.close()

    def stop(self) -> None:
        """Best-effort clean-up for ``finally`` blocks."""
        if self.alive():
            self.kill()
        elif not self.log.closed:
            self.log.close()


def _reap_group(pgid: int) -> None:
    """Children of a killed group may outlive the leader for a moment (the JVM): wait."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def wait_for(probe: Callable[[], Any], *, timeout: float, what: str, poll: float = 0.2,
             alive: Callable[[], bool] | None = None, log: Path | None = None) -> Any:
    """Poll ``probe`` until it returns something truthy (bounded in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise AssertionError(f"process exited while waiting for {what}; log tail:\n"
                                 f"{tail(log) if log else ''}")
        try:
            value = probe()
        except Exception:  # noqa: BLE001 - a probe may fail until the thing is ready
            value = None
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout} s" + (f"; log tail:\n{tail(log)}" if log else ""))


def read_topic(settings: Settings, topic: str, *, timeout: float = 60.0) -> list[Any]:
    """Every record of ``topic`` (key, value, timestamp) as the broker stores it."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer
    from tests.integration.test_stream import Sent

    consumer = kafka_consumer(settings, request_timeout_ms=15_000, consumer_timeout_ms=2000)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        out: list[Sent] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end[tp] for tp in parts):
            assert time.monotonic() < deadline, "reading the topic back took too long"
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(Sent(r.key, r.value, r.timestamp) for r in records)
        return out
    finally:
        consumer.close()


def topic_name(prefix: str, tmp_path: Path) -> str:
    return f"{prefix}.{tmp_path.name[-20:]}".replace("_", "-")


class StreamThread:
    """``run_stream`` (stop: never) in a thread of this process, on the tests' Spark session.

    ``failure`` holds what ``run_stream`` raised, if anything (a failed query); ``stop()``
    stops the query the way the CLI does and joins the thread.
    """

    def __init__(self, settings: Settings, spark: Any, timeout_s: float = 900.0) -> None:
        import threading

        from pipelines.stream import StreamOptions, run_stream

        self.queries: list[Any] = []
        self.failure: list[BaseException] = []
        self._started = threading.Event()

        def run() -> None:
            try:
                run_stream(settings, StreamOptions(stop="never", timeout_seconds=timeout_s),
                           spark=spark,
                           on_started=lambda q: (self.queries.append(q), self._started.set()))
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                self.failure.append(exc)
            finally:
                self._started.set()

        self.thread = threading.Thread(target=run, daemon=True, name="stream-under-test")
        self.thread.start()

    def wait_started(self, timeout: float = 300.0) -> None:
        assert self._started.wait(timeout), f"the stream did not start within {timeout} s"
        assert not self.failure, self.failure

    def active(self) -> bool:
        return bool(self.queries) and self.queries[0].isActive and self.thread.is_alive()

    def stop(self) -> None:
        from pipelines.stream import stop_gracefully  # after the running batch, as the CLI does

        for query in self.queries:
            try:
                stop_gracefully(query)
            except Exception:  # noqa: BLE001 - best effort in clean-up
                pass
        self.thread.join(180)


def stream_totals(client: Any) -> dict[str, int]:
    """The stream's running totals as published in Redis (``shopstream status``)."""
    from features.online_keys import stream_progress_key

    raw = client.hgetall(stream_progress_key())
    return {k.decode(): int(v) for k, v in raw.items()
            if k.startswith(b"total_") and v.decode().lstrip("-").isdigit()}


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0
