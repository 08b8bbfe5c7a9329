"""The console entry point: mistakes a user can fix are one line naming the culprit."""

from __future__ import annotations

import os
import subprocess
import sys


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
