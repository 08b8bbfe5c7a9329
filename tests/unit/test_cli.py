"""The console entry point: mistakes a user can fix are one line naming the culprit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80", **(env or {})},
    )


def test_main_malformed_option_value_is_one_line() -> None:
    result = _run("generate", "--count", "5", "--bad-fraction", "2")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--bad-fraction" in lines[0]
    assert "Traceback" not in result.stderr


def test_main_unknown_option_is_one_line() -> None:
    result = _run("infra", "status", "--no-such-flag")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--no-such-flag" in lines[0]


def test_main_bad_setting_names_the_variable() -> None:
    result = _run("infra", "status", env={"SHOPSTREAM_REDIS_URL": "http://nowhere:1"})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "SHOPSTREAM_REDIS_URL" in lines[0]


_PY4J_INTERRUPTED = """
import logging, sys
from py4j.java_gateway import GatewayClient
from pipelines.cli import _root

_root(verbose=False, debug=False)  # the logging every shopstream command sets up


class Interrupted:  # a py4j call under way when SIGTERM (Ctrl-C to the CLI) lands
    socket = None

    def send_command(self, command):
        raise KeyboardInterrupt


client = GatewayClient()
client._get_connection = lambda: Interrupted()
try:
    client.send_command("c\\nt\\ngetClass\\ne\\n")
except KeyboardInterrupt:
    logging.getLogger("pipelines.stream").exception("a KeyboardInterrupt of our own")
"""


def test_py4j_interrupt_traceback_is_not_logged_other_tracebacks_are() -> None:
    """A Parquet sinks' process stopped while its Spark session starts: py4j logs the
    interrupted call on the root logger at ERROR, with a traceback that reads as a crash."""
    result = subprocess.run([sys.executable, "-c", _PY4J_INTERRUPTED], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    assert "KeyboardInterrupt while sending command" not in shown
    assert "a KeyboardInterrupt of our own" in shown and "Traceback" in shown


def _unreachable_env() -> dict[str, str]:
    """Kafka and Redis settings that point at ports nobody listens on."""
    from tests.conftest import free_port

    return {"SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
            "SHOPSTREAM_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}


def test_stream_with_its_servers_down_is_one_line_naming_them_before_spark_starts(
        tmp_path: Path) -> None:
    """Without the check, Spark started, then its Kafka source retried for minutes with a
    40-line stack trace a minute."""
    env = {**_unreachable_env(), "SHOPSTREAM_DATA_DIR": str(tmp_path)}
    result = _run("stream", "--available-now", env=env)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    kafka = env["SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS"]
    redis_port = env["SHOPSTREAM_REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
    assert f"cannot reach Kafka at {kafka} (connection refused)" in lines[0]
    assert "SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS" in lines[0]
    assert f"cannot reach Redis at 127.0.0.1:{redis_port} (connection refused)" in lines[0]
    assert "SHOPSTREAM_REDIS_URL" in lines[0]
    assert "started" not in result.stdout + result.stderr  # no Spark session, no query
    assert not (tmp_path / "checkpoints").exists()


def test_status_with_the_servers_down_says_so_without_the_clients_retry_noise(
        tmp_path: Path) -> None:
    """kafka-python's bootstrap logged some 40 lines of retries over 47 s before the table."""
    env = {**_unreachable_env(), "SHOPSTREAM_DATA_DIR": str(tmp_path), "COLUMNS": "200"}
    result = _run("status", env=env)
    assert result.returncode == 3, result.stdout + result.stderr  # a server is unhealthy
    assert "cannot reach Kafka at 127.0.0.1:" in result.stdout
    assert "cannot reach Redis at 127.0.0.1:" in result.stdout
    assert "no streaming job has published progress yet" in result.stdout
    for noise in ("Bootstrap", "KafkaConnectionError", "Traceback"):
        assert noise not in result.stdout + result.stderr, noise
    # with Redis down, the job's figures come from the file it also writes
    progress = tmp_path / "stream" / "progress.json"
    progress.parent.mkdir(parents=True)
    progress.write_text('{"latest": {"batch_id": 7, "freshness_p99_s": 1.23456789}}')
    shown = _run("status", env=env)
    assert shown.returncode == 3
    assert "batch_id" in shown.stdout and "1.235" in shown.stdout, shown.stdout


def test_status_shows_figures_to_three_decimals_and_the_rest_as_published() -> None:
    from pipelines.cli import shown_figure

    assert shown_figure("9.612435817718506") == "9.612"
    assert shown_figure("49.792048") == "49.792"
    for same in ("103.8", "3000", "0.0", "2026-12-01T02:56:09.852000+00:00", "running", ""):
        assert shown_figure(same) == same


def test_the_real_time_sinks_process_rides_out_its_servers_being_away(tmp_path: Path) -> None:
    """``--offline-only`` is what a Real-time driver starts, and restarts on a stall, maybe
    during an outage: it skips the up-front check (the refusal takes a second to say)."""
    env = {**os.environ, **_unreachable_env(), "SHOPSTREAM_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "stream", "--offline-only"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=15)  # still waiting for Kafka, not stopped by the check
    finally:
        proc.kill()  # a SIGTERM waits for Spark's Kafka retries (60 s each); its JVM follows
        output = proc.communicate(timeout=60)[0].decode()
    assert "cannot reach" not in output, output


def test_serve_on_a_port_another_program_holds_is_one_line(listening: int, tmp_path: Path) -> None:
    """uvicorn found out only after the app's start-up, and did not name the setting."""
    result = _run("serve", env={"SHOPSTREAM_API_HOST": "127.0.0.1",
                                "SHOPSTREAM_API_PORT": str(listening),
                                "SHOPSTREAM_RUN_DIR": str(tmp_path / "run"),
                                "SHOPSTREAM_DATA_DIR": str(tmp_path / "data")})
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: cannot start shopstream serve: something else already listens on "
        f"127.0.0.1:{listening}; stop it, or set SHOPSTREAM_API_PORT to a free port")
    assert "Started server process" not in result.stdout + result.stderr


@pytest.mark.parametrize("command", [["train", "--model", "popularity", "--no-features"],
                                     ["train", "promote", "--no-publish"],
                                     ["train", "rollback", "--no-publish"],
                                     ["train", "score"]])
def test_train_with_its_tracking_server_down_is_one_line_at_once(command: list[str],
                                                                  tmp_path: Path) -> None:
    """MLflow's client retried for 4 min 15 s, then printed a traceback."""
    from tests.conftest import free_port

    port = free_port()
    result = _run(*command, env={"SHOPSTREAM_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}",
                                 "SHOPSTREAM_RUN_DIR": str(tmp_path / "run"),
                                 "SHOPSTREAM_DATA_DIR": str(tmp_path / "data")})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: cannot reach the MLflow tracking server at http://127.0.0.1:{port} "
        "(connection refused): start it, or set SHOPSTREAM_MLFLOW_TRACKING_URI (unset: a local "
        "SQLite store)")


@pytest.mark.parametrize(("command", "instead"), [
    (["backfill"], " (or --no-materialize for the offline snapshots only)"),
    (["verify"], ""),
    (["train", "--model", "popularity", "--no-features"], " (or --no-publish)"),
])
def test_a_command_that_writes_redis_at_its_end_says_at_once_that_it_is_down(
        command: list[str], instead: str, tmp_path: Path) -> None:
    """``backfill`` computed for 40 s, then printed a redis-py traceback; ``train`` would fit
    every model first."""
    from tests.conftest import free_port

    port = free_port()
    result = _run(*command, env={"SHOPSTREAM_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                                 "SHOPSTREAM_MLFLOW_TRACKING_URI": "",
                                 "SHOPSTREAM_RUN_DIR": str(tmp_path / "run"),
                                 "SHOPSTREAM_DATA_DIR": str(tmp_path / "data")})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: cannot reach Redis at 127.0.0.1:{port} (connection refused): start it with "
        f"`shopstream infra up` or set SHOPSTREAM_REDIS_URL{instead}")
