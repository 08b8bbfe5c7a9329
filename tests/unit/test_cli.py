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
