"""The demo's wiring: which commands its stages run, and the stage-time summary."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from pipelines import demo
from pipelines.settings import Settings
from training.experiment import resolve_models
from training.models import BASELINE, MODELS


def _ctx(**kwargs: Any) -> demo.DemoContext:
    return demo.DemoContext(Settings(_env_file=None), **kwargs)  # type: ignore[call-arg]


@pytest.fixture()
def commands(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The shopstream commands the stages would run (not run: this is the wiring only)."""
    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(demo, "_run", lambda ctx, *args, **kw: seen.append(args))
    return seen


def _value(args: tuple[str, ...], option: str) -> str:
    return args[args.index(option) + 1]


def test_default_training_is_a_subset_with_the_baseline(commands: list[tuple[str, ...]]) -> None:
    demo._stage_train(_ctx())
    (args,) = commands
    assert args[0] == "train"
    kinds = resolve_models([_value(args, "--model")])
    assert BASELINE in kinds  # the comparison table needs the baseline
    assert set(kinds) < set(MODELS)
    assert "ltr" not in kinds


def test_all_models_trains_everything(commands: list[tuple[str, ...]]) -> None:
    demo._stage_train(_ctx(all_models=True))
    (args,) = commands
    assert resolve_models([_value(args, "--model")]) == list(MODELS)


def test_generate_sends_the_requested_number_of_events(commands: list[tuple[str, ...]]) -> None:
    demo._stage_generate(_ctx(events=12_345))
    (args,) = commands
    assert args[0] == "generate"
    assert _value(args, "--count") == "12345"


def test_default_event_count_is_the_short_one() -> None:
    assert _ctx().events == demo.GENERATED_EVENTS <= 100_000


def test_stage_table_lists_every_stage_and_the_total() -> None:
    table = demo.stage_table([("Start Kafka and Redis", 12.0), ("Stream it", 36.0)], 48.0)
    out = io.StringIO()
    Console(file=out, width=120).print(table)
    text = out.getvalue()
    assert "Start Kafka and Redis" in text and "Stream it" in text
    assert "12.0" in text and "36.0" in text and "48.0" in text
    assert "75%" in text and "25%" in text


def test_a_failing_stage_is_timed_and_the_summary_still_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fine(ctx: demo.DemoContext) -> None:
        ctx.notes["ran"] = True

    def broken(ctx: demo.DemoContext) -> None:
        raise demo.DemoError("boom")

    out = io.StringIO()
    monkeypatch.setattr(demo, "console", Console(file=out, width=120))
    monkeypatch.setattr(demo, "STAGES", [("first stage", fine), ("second stage", broken)])
    with pytest.raises(demo.DemoError):
        demo.run_demo(Settings(_env_file=None), keep_running=True)  # type: ignore[call-arg]
    text = out.getvalue()
    assert "Demo stage times" in text
    assert "first stage" in text and "second stage" in text


def test_backfill_runs_alongside_training_only_without_the_re_ranker(
    commands: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    started: list[list[str]] = []

    class FakeProcess:
        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            started.append(cmd)

        def wait(self, timeout: float | None = None) -> int:
            return 0

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(demo, "_start_api", lambda ctx: None)
    monkeypatch.setattr(demo.subprocess, "Popen", FakeProcess)
    settings = Settings(_env_file=None, data_dir=str(tmp_path), run_dir=str(tmp_path / "run"))  # type: ignore[call-arg]

    ctx = demo.DemoContext(settings)
    demo._stage_backfill(ctx)
    assert commands == [] and len(started) == 1 and "backfill" in started[0]
    demo._stage_train(ctx)  # waits for the background backfill after training
    assert [c[0] for c in commands] == ["train"] and ctx.backfill is None

    commands.clear()
    started.clear()
    ctx = demo.DemoContext(settings, all_models=True)  # the re-ranker reads the backfill's snapshots
    demo._stage_backfill(ctx)
    assert [c[0] for c in commands] == ["backfill"] and started == []


def test_a_failed_background_backfill_fails_the_train_stage(
    commands: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    class FailedProcess:
        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            pass

        def wait(self, timeout: float | None = None) -> int:
            return 2

    monkeypatch.setattr(demo, "_start_api", lambda ctx: None)
    monkeypatch.setattr(demo.subprocess, "Popen", FailedProcess)
    settings = Settings(_env_file=None, data_dir=str(tmp_path), run_dir=str(tmp_path / "run"))  # type: ignore[call-arg]
    ctx = demo.DemoContext(settings)
    demo._stage_backfill(ctx)
    with pytest.raises(demo.DemoError, match="backfill"):
        demo._stage_train(ctx)
