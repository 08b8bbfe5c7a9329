"""Commands that read the offline store, on a fresh data dir: one line saying what to run,
not Spark's ``PATH_NOT_FOUND`` traceback after a logged Java stack trace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.settings import Settings
from tests.integration.test_training_cli import _cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", [("verify",), ("backfill",)])
def test_a_command_on_an_empty_offline_store_says_what_to_run(
        command: tuple[str, ...], make_settings: Callable[..., Settings], tmp_path: Path,
        redis_server: object) -> None:
    settings = make_settings(data_dir=str(tmp_path / "fresh"))
    result = _cli(settings, *command)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    events = f"{tmp_path / 'fresh'}/offline/events"
    assert errors == [f"error: no events in the offline store at {events}: run `shopstream "
                      "stream` or `shopstream replay` first"
                      + (", or give --source FILE" if command == ("backfill",) else "")]
    for noise in ("Traceback", "PATH_NOT_FOUND", "FileNotFoundException"):
        assert noise not in result.stdout + result.stderr, noise
