"""The ``shopstream`` command line: one thin entry point per role.

Each command parses its options, builds :class:`~pipelines.settings.Settings`
once, and hands both to the module that does the work. Heavy imports (Spark,
MLflow, Feast) happen inside the commands, so ``--help`` stays instant.

Errors a user can fix (a bad setting, a server that would not start, a missing
file) print one line naming the culprit and exit with status 1 or 2, never a
traceback; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from pipelines.log_repeats import CollapseRepeats
from pipelines.settings import ENV_PREFIX, Settings

__all__ = ["app", "main", "load_settings", "UserError"]

console = Console(stderr=True)
out = Console()

app = typer.Typer(
    name="shopstream",
    help="Real-time personalization feature pipeline: Kafka -> Spark -> Parquet + Redis, Feast, MLflow, serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
infra_app = typer.Typer(help="Start, stop and inspect the local Kafka broker and redis-server.", no_args_is_help=True)
app.add_typer(infra_app, name="infra")

_state: dict[str, bool] = {"debug": False}


class UserError(Exception):
    """An error the user can fix; printed as one line without a traceback."""


def _need_redis(settings: Settings, instead: str | None = None) -> None:
    """Stop at once, in one line, when Redis does not answer a command that writes to it at
    its end: ``backfill`` worked 40 s before its traceback, ``train`` fits every model first."""
    from pipelines.connections import redis_unreachable

    if (problem := redis_unreachable(settings)) is not None:
        raise UserError(problem + (f" (or {instead})" if instead else ""))


def load_settings() -> Settings:
    """Settings from the environment and ``.env``; a bad value is a one-line error naming it."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "settings"
        env_name = ENV_PREFIX + field.upper()
        raise UserError(f"invalid setting {env_name}: {first['msg']}") from exc


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(drop_py4j_interrupt_traceback)
        # while Kafka is away; --verbose shows each kind in kafka-python's words, with tracebacks
        handler.addFilter(CollapseRepeats(("kafka",), tracebacks=verbose, one_outage_kind=not verbose))
    for noisy in ("kafka", "py4j", "urllib3", "feast", "alembic", "mlflow.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def drop_py4j_interrupt_traceback(record: logging.LogRecord) -> bool:
    """False for py4j's "KeyboardInterrupt while sending command." traceback: a SIGTERM
    (the CLI's Ctrl-C) that lands while the Spark session starts interrupts a py4j call,
    and py4j logs that on the root logger at ERROR, past its own logger's level. The
    interrupt is not an error: the command then stops as asked (exit 130)."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, KeyboardInterrupt) and "py4j" in Path(record.pathname).parts)


# --------------------------------------------------------------------- infra
@infra_app.command("up")
def infra_up(
    kafka: Annotated[bool, typer.Option(help="Start the Kafka broker.")] = True,
    redis: Annotated[bool, typer.Option(help="Start redis-server.")] = True,
) -> None:
    """Start Kafka (KRaft) and redis-server on loopback; a second `up` finds them running."""
    from pipelines import infra

    settings = load_settings()
    infra.up(settings, kafka=kafka, redis=redis)
    _print_status(infra.status(settings))


@infra_app.command("down")
def infra_down(
    purge: Annotated[bool, typer.Option(help="Also delete the servers' data (topics, Redis AOF).")] = False,
) -> None:
    """Stop what `infra up` started (by pid file); data stays unless --purge."""
    from pipelines import infra

    stopped = infra.down(load_settings(), purge=purge)
    for name, was_running in stopped.items():
        out.print(f"{name}: {'stopped' if was_running else 'was not running'}")


@infra_app.command("status")
def infra_status() -> None:
    """Health, address and contents of each local server (topic message counts, Redis keys)."""
    from pipelines import infra

    status = infra.status(load_settings())
    _print_status(status)
    if not all(component.get("healthy") for component in status.values()):
        raise typer.Exit(3)


@infra_app.command("jars")
def infra_jars() -> None:
    """Resolve the Kafka broker's and Spark's Kafka connector jars from Maven Central, and
    compile shopstream's jar (all cached)."""
    from pipelines import infra

    for name, version in infra.resolve_jars(load_settings()).items():
        out.print(f"{name}: {version}")


@infra_app.command("class-archive")
def infra_class_archive(
    force: Annotated[bool, typer.Option(help="Build it again even if it exists.")] = False,
) -> None:
    """Build the class-data-sharing archive Spark's driver JVMs start with (cached; about
    a minute): drivers start without it too, only slower."""
    from pipelines.infra.class_archive import ClassArchiveError, build_archive

    try:
        path = build_archive(load_settings(), force=force)
    except ClassArchiveError as exc:
        console.print(f"[red]class archive not built:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(1) from None
    out.print(f"Spark class archive: {path} ({path.stat().st_size / 1e6:.0f} MB)")


def _print_status(status: dict[str, dict[str, object]]) -> None:
    table = Table(title="shopstream infrastructure")
    for col in ("component", "healthy", "address", "pid"):
        table.add_column(col)
    table.add_column("details", overflow="fold")  # an error's setting name whole
    for name, info in status.items():
        details = {k: v for k, v in info.items() if k not in ("healthy", "address", "pid")}
        if "topics" in details:
            details["topics"] = ", ".join(
                f"{t.name} ({t.partitions} partitions, {t.messages} messages)"  # type: ignore[attr-defined]
                for t in details["topics"]  # type: ignore[attr-defined]
            )
        text = "; ".join(f"{k}: {v}" for k, v in details.items())
        healthy = "[green]yes[/green]" if info.get("healthy") else "[red]no[/red]"
        table.add_row(name, healthy, str(info.get("address")), str(info.get("pid") or "-"), text)
    out.print(table)


# ----------------------------------------------------------------- producers
@app.command()
def generate(
    count: Annotated[int | None, typer.Option(min=1, help="Number of events to send.")] = None,
    duration: Annotated[float | None, typer.Option(min=0.1, help="Seconds to run (with --rate).")] = None,
    rate: Annotated[float | None, typer.Option(min=1, help="Events per second (default: as fast as possible).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed gives the same events.")] = 42,
    bad_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction of malformed records.")] = 0.0,
    users: Annotated[int, typer.Option(min=1, help="Number of distinct users.")] = 10_000,
    items: Annotated[int, typer.Option(min=1, help="Number of distinct items.")] = 2_000,
    categories: Annotated[int, typer.Option(min=1, help="Number of categories.")] = 40,
    start_time: Annotated[str | None, typer.Option(help="Event time of the first event (ISO-8601); default now.")] = None,
    output: Annotated[Path | None, typer.Option(help="Write JSON lines to this file instead of Kafka.")] = None,
    random_ids: Annotated[bool, typer.Option(help="Event ids as random UUIDv4s (default: a run tag and a sequence number).")] = False,
) -> None:
    """Send a synthetic store clickstream (Zipf popularity, sessions, conversions) to Kafka."""
    from pipelines.generate import GeneratorConfig, run_generate

    settings = load_settings()
    config = GeneratorConfig(
        seed=seed, users=users, items=items, categories=categories, bad_fraction=bad_fraction,
        random_ids=random_ids,
    )
    run_generate(settings, config, count=count, duration=duration, rate=rate,
                 start_time=start_time, output=output)


@app.command()
def replay(
    path: Annotated[Path | None, typer.Argument(help="CSV or Parquet file (default: the preset's file).")] = None,
    preset: Annotated[str | None, typer.Option(help="Column mapping preset, e.g. 'online-retail'.")] = None,
    mapping: Annotated[list[str] | None, typer.Option(
        "--map", help="FIELD=COLUMN or FIELD==CONSTANT, e.g. --map user_id=CustomerID --map event_type==purchase."
    )] = None,
    speedup: Annotated[float | None, typer.Option(min=0.0, help="Time compression factor (default: as fast as possible).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Send at most this many rows.")] = None,
    output: Annotated[Path | None, typer.Option(help="Write JSON lines to this file instead of Kafka.")] = None,
) -> None:
    """Replay a real data set into the topic in event-time order; rejected rows are sent too."""
    from pipelines.replay import run_replay

    run_replay(load_settings(), path=path, preset=preset, mapping=mapping or [],
               speedup=speedup, limit=limit, output=output)


# --------------------------------------------------------------- the rest
def _not_yet(command: str, issue: int) -> None:
    raise UserError(f"`shopstream {command}` is not available yet (tracked in issue {issue})")


@app.command()
def stream(
    available_now: Annotated[bool, typer.Option(
        "--available-now", help="Process what the topic holds now (in maxOffsetsPerTrigger batches), then stop."
    )] = False,
    until_idle: Annotated[float | None, typer.Option(
        min=0.0, help="Stop after this many seconds with no new input (tests, demo)."
    )] = None,
    mode: Annotated[str | None, typer.Option(
        help="microbatch or realtime (online path in Spark's Real-time Mode); default SHOPSTREAM_STREAM_MODE."
    )] = None,
    timeout: Annotated[float | None, typer.Option(min=1.0, help="Stop after this many seconds.")] = None,
    offline_only: Annotated[bool, typer.Option(
        "--offline-only", help="Only the Parquet sinks (raw events, quarantine), no online path, at a lower CPU "
                               "priority (SHOPSTREAM_STREAM_REALTIME_OFFLINE_NICE): what Real-time Mode runs beside "
                               "its online query."
    )] = False,
    realtime_snapshots: Annotated[bool, typer.Option(
        "--realtime-snapshots", help="With --offline-only: also write the feature snapshots Real-time Mode's "
                                     "tile feed asks for (what its Parquet sinks' process does)."
    )] = False,
) -> None:
    """Run the streaming feature job: Kafka -> validation -> quarantine, Parquet offline store, Redis features.

    Exactly once through the checkpoint (SHOPSTREAM_CHECKPOINT_DIR, default <data_dir>/checkpoints):
    a restart after a crash resumes where the last complete micro-batch ended. SIGTERM or
    Ctrl-C stops it after the running micro-batch (SHOPSTREAM_STREAM_STOP_GRACE_SECONDS);
    a second one at once.
    """
    from dataclasses import replace

    from pipelines.stream import CheckpointTopicError, StreamFailed, StreamOptions, run_stream
    from pipelines.streaming.dedup import DedupSettingError
    from pipelines.streaming.realtime import SlotsError

    settings = load_settings()
    if mode is not None:
        if mode not in ("microbatch", "realtime"):
            raise UserError(f"--mode must be microbatch or realtime, got {mode!r}")
        settings = settings.model_copy(update={"stream_mode": mode})
    if available_now and until_idle is not None:
        raise UserError("--available-now and --until-idle are alternatives; pick one")
    stop = "available_now" if available_now else ("idle" if until_idle is not None else "never")
    options = StreamOptions(stop=stop, idle_seconds=until_idle or 0.0, timeout_seconds=timeout)
    if offline_only:
        from pipelines.streaming.offline_process import die_with_parent, lower_priority

        if settings.stream_mode != "microbatch":
            raise UserError("--offline-only runs the micro-batch query; drop --mode realtime")
        die_with_parent()
        lower_priority(settings)  # before Spark starts: its JVM's threads inherit it
        options = replace(options, online=False, snapshots=False,
                          realtime_snapshots=realtime_snapshots)
    elif realtime_snapshots:
        raise UserError("--realtime-snapshots goes with --offline-only (Real-time Mode's Parquet "
                        "sinks' process)")
    from pipelines.connections import servers_unreachable

    # before Spark starts: Spark's Kafka source would retry for minutes. Once running, the
    # job rides out outages (SHOPSTREAM_STREAM_REDIS_OUTAGE_SECONDS, _KAFKA_ATTEMPTS); so
    # does Real-time Mode's Parquet sinks' process, which its driver may restart in one
    if not offline_only and (problems := servers_unreachable(settings)):
        raise UserError("; ".join(problems))
    from pipelines.checkpoint_lock import CheckpointBusy, checkpoint_lock
    from pipelines.stream import query_checkpoint

    if settings.stream_mode == "realtime":  # the driver's query; its sinks' process locks its own
        from pipelines.streaming.realtime import QUERY_NAME as REALTIME_QUERY

        checkpoint = query_checkpoint(settings, REALTIME_QUERY)
    else:
        checkpoint = query_checkpoint(settings)
    try:
        # one job per checkpoint: a predecessor still finishing its batch is waited for
        with checkpoint_lock(settings.run_path, checkpoint,
                             wait_seconds=settings.stream_stop_grace_seconds + 30):
            recorder = run_stream(settings, options, stop_session=True, stop_on_signals=True)
    except (CheckpointBusy, DedupSettingError, CheckpointTopicError, SlotsError) as exc:
        raise UserError(str(exc)) from exc
    except StreamFailed as exc:
        if _state["debug"]:
            raise
        # an outage is the likely cause of a failure; say so in the same line, with its fix
        down = "".join(f"; {problem}" for problem in servers_unreachable(settings))
        raise UserError(f"the streaming query failed: {exc}{down} (restart resumes from the "
                        "checkpoint; --debug for the full error)") from exc
    t = recorder.totals
    if settings.stream_mode == "realtime":  # the Parquet sinks' process printed its own totals
        out.print("stream stopped (Real-time Mode): online figures in `shopstream status`")
        return
    out.print(f"stream stopped after {t.batches} batches: {t.input_rows} records read, "
              f"{t.on_time} events stored, {t.quarantined} quarantined ({t.late} late), "
              f"{t.duplicates_dropped} duplicates dropped")


@app.command()
def backfill(
    since: Annotated[str | None, typer.Option(help="First as-of time, ISO-8601 (no offset = UTC); default: the first event, rounded down to the step.")] = None,
    until: Annotated[str | None, typer.Option(help="Last as-of time, ISO-8601; default: the last event, rounded up to the step.")] = None,
    every: Annotated[int | None, typer.Option(min=1, help="Minutes between as-of times (default: SHOPSTREAM_BACKFILL_STEP_SECONDS).")] = None,
    every_slide: Annotated[bool, typer.Option("--every-slide", help="An as-of time every slide (tile): exact, costly over long ranges.")] = False,
    source: Annotated[Path | None, typer.Option(help="Replay file instead of the offline store: JSON lines from generate/replay --output, or CSV/Parquet.")] = None,
    source_format: Annotated[str | None, typer.Option("--format", help="jsonl, csv or parquet (default: from the file name).")] = None,
    preset: Annotated[str | None, typer.Option(help="Replay preset mapping a CSV/Parquet file to events, e.g. 'online-retail'.")] = None,
    mapping: Annotated[list[str] | None, typer.Option("--map", help="FIELD=COLUMN or FIELD==CONSTANT, as for `shopstream replay`.")] = None,
    materialize: Annotated[bool, typer.Option(help="Also write the values as of the last as-of time to Redis.")] = True,
) -> None:
    """Compute features in batch (offline store or a replay file), write snapshots, lineage and Redis."""
    from datetime import datetime

    from pipelines.backfill import run_backfill
    from pipelines.offline_store import NoEventsError

    settings = load_settings()

    def parse_time(name: str, text: str | None) -> datetime | None:
        if text is None:
            return None
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise UserError(f"--{name}: not an ISO-8601 time: {text!r}") from exc

    if every is not None and every_slide:
        raise UserError("give --every or --every-slide, not both")
    if source_format not in (None, "jsonl", "csv", "parquet"):
        raise UserError(f"--format must be jsonl, csv or parquet, not {source_format!r}")
    if source is not None and not source.is_file():
        raise UserError(f"--source: no such file: {source}")
    step = settings.feature_slide_seconds if every_slide else (every * 60 if every else None)
    if materialize:
        _need_redis(settings, "--no-materialize for the offline snapshots only")
    try:
        result = run_backfill(
            settings, since=parse_time("since", since), until=parse_time("until", until),
            step_seconds=step, source=source, source_format=source_format,  # type: ignore[arg-type]
            preset=preset, mapping=mapping or [], materialize=materialize,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    except NoEventsError as exc:
        raise NoEventsError(f"{exc}, or give --source FILE") from None
    table = Table(title=f"backfill {result.run_id}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("as-of times", f"{result.as_of_count} ({result.since:%Y-%m-%d %H:%M} .. "
                  f"{result.until:%Y-%m-%d %H:%M} UTC, every {result.step_seconds}s)")
    for name, value in result.rows.items():
        table.add_row(name, f"{value:,}")
    for name, value in result.online.items():
        table.add_row(f"redis {name}", f"{value:,}")
    for name, seconds in result.timings.items():
        table.add_row(f"time {name}", f"{seconds:.1f}s")
    table.add_row("total", f"{result.seconds:.1f}s")
    table.add_row("manifest", result.manifest_path)
    out.print(table)


# ------------------------------------------------------------------ training
train_app = typer.Typer(
    help="Train, evaluate and register recommendation models with MLflow; promote and roll back.",
    no_args_is_help=False,
)
app.add_typer(train_app, name="train")

_MODEL_HELP = (
    "Model to train, or 'all' (repeat or comma-separate): popularity, popularity_region, item_knn, "
    "ease, als, ltr. The popularity baseline is always trained for comparison."
)


@train_app.callback(invoke_without_command=True)
def train(
    ctx: typer.Context,
    model: Annotated[list[str], typer.Option("--model", "-m", help=_MODEL_HELP)] = ["all"],  # noqa: B006
    since: Annotated[str | None, typer.Option(help="Start of the event-time range, inclusive (ISO-8601, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="End of the event-time range, exclusive (ISO-8601, UTC).")] = None,
    events: Annotated[Path | None, typer.Option(
        "--events", help="Train on this interactions table (CSV, Parquet, JSON lines: user, item, time, "
                         "event type or weight) instead of the offline store.")] = None,
    register: Annotated[bool, typer.Option(
        "--register/--no-register", help="Register the best model as 'challenger' and gate it against the champion.")] = True,
    publish: Annotated[bool, typer.Option(
        "--publish/--no-publish", help="When promoted, batch-score it into Redis and switch the live version.")] = True,
    features: Annotated[bool, typer.Option(
        "--features/--no-features", help="Give the re-ranker Feast's historical features (offline store only).")] = True,
) -> None:
    """Train, evaluate on a time-based test split, log to MLflow, register and gate by alias."""
    if ctx.invoked_subcommand is not None:
        return
    import mlflow
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from training.experiment import TrainOptions, resolve_models, run_training
    from training.tracking import configure_tracking, run_url

    settings = load_settings()
    try:
        kinds = resolve_models(model)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    options = TrainOptions(models=kinds, since=since, until=until, events=events,
                           register=register, publish=publish)
    configure_tracking(settings)
    if register and publish:
        _need_redis(settings, "--no-publish")
    provider = _train_feature_provider(settings) if features and events is None and "ltr" in kinds else None
    total = len(set(kinds) | {"popularity"}) + 2 + (2 if register else 0)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("starting", total=total)
        steps = [0]

        def step(description: str) -> None:
            progress.update(task, description=description, completed=steps[0])
            steps[0] += 1

        with mlflow.start_run(run_name=f"train-{'-'.join(kinds) if len(kinds) < 4 else 'all'}") as run:
            try:
                report = run_training(settings, options, feature_provider=provider, step=step)
            except (ValueError, LookupError) as exc:
                raise UserError(str(exc)) from exc
        progress.update(task, description="done", completed=total)
    _print_train_report(settings, report, run_url(run))


def _train_feature_provider(settings: Settings) -> object | None:
    """Feast's historical features for the re-ranker, or None (with a note) when Feast is not set up."""
    from training.features import feast_feature_provider

    try:
        return feast_feature_provider(settings)
    except (ImportError, FileNotFoundError, LookupError) as exc:
        console.print(f"[yellow]note:[/yellow] re-ranking without Feast features ({exc})")
        return None


def _print_train_report(settings: Settings, report: object, link: str) -> None:
    from training.experiment import TrainReport
    from training.metrics import metric_key, parse_metric

    if not isinstance(report, TrainReport):
        raise TypeError(f"expected a TrainReport, got {type(report).__name__}")
    _, k = parse_metric(settings.train_gate_metric)
    table = Table(title=f"Test metrics @{k} ({report.split.kind} split, "
                        f"{int(report.split.stats()['eval_users'])} users)")
    cols = ["ndcg", "precision", "recall", "map", "hit_rate", "coverage"]
    short = {"precision": "prec", "hit_rate": "hit", "coverage": "cover"}
    table.add_column("model", no_wrap=True)
    for c in cols:
        table.add_column(short.get(c, c), justify="right")
    table.add_column("val ndcg", justify="right")
    table.add_column("fit s", justify="right")
    frame = report.table
    for kind, row in frame.iterrows():
        name = f"[bold]{kind}[/bold] *" if kind == report.best else str(kind)
        val = row.get(f"validation_{metric_key('ndcg', k)}", float("nan"))
        table.add_row(name, *[f"{row[metric_key(c, k)]:.4f}" for c in cols],
                      "-" if val != val else f"{val:.4f}", f"{row['fit_seconds']:.1f}")
    # never squeeze the numbers (a pipe or CI log reports 80 columns)
    Console(file=out.file, width=max(out.width, 118), force_terminal=out.is_terminal).print(table)
    out.print(f"* best on validation: {report.best}")
    if report.version is not None and report.decision is not None:
        decision = report.decision
        out.print(f"registered {settings.model_name} version {report.version}: "
                  f"{decision.tags()['gate.decision']} ({decision.reason})")
        if report.scoring is not None:
            s = report.scoring
            out.print(f"live in Redis: version {s.version} ({s.keys} keys in {s.seconds:.1f}s)")
    out.print(f"MLflow run {report.run_id}: {link}")


@train_app.command("promote")
def train_promote(
    version: Annotated[str | None, typer.Option(help="Registry version (default: the challenger).")] = None,
    publish: Annotated[bool, typer.Option("--publish/--no-publish", help="Batch-score it into Redis and switch the live version.")] = True,
) -> None:
    """Make a version the champion (skipping the gate); the old champion becomes 'previous'."""
    from training.experiment import promote_version
    from training.tracking import configure_tracking

    settings = load_settings()
    configure_tracking(settings)
    if publish:
        _need_redis(settings, "--no-publish")
    try:
        old, new = promote_version(settings, version, publish=publish)
    except (LookupError, ValueError) as exc:
        raise UserError(str(exc)) from exc
    except Exception as exc:
        if type(exc).__name__ == "MlflowException":
            raise UserError(f"cannot promote: {exc}") from exc
        raise
    out.print(f"{settings.model_name}: champion {old or '-'} -> {new}" + (" (live in Redis)" if publish else ""))


@train_app.command("rollback")
def train_rollback(
    publish: Annotated[bool, typer.Option("--publish/--no-publish", help="Also switch the live version in Redis.")] = True,
) -> None:
    """Champion back to the previous version; Redis switches back in one step."""
    from training.experiment import rollback_champion
    from training.tracking import configure_tracking

    settings = load_settings()
    configure_tracking(settings)
    if publish:
        _need_redis(settings, "--no-publish")
    try:
        old, new = rollback_champion(settings, publish=publish)
    except LookupError as exc:
        raise UserError(str(exc)) from exc
    out.print(f"{settings.model_name}: champion {old} -> {new}" + (" (live in Redis)" if publish else ""))


@train_app.command("score")
def train_score(
    version: Annotated[str | None, typer.Option(help="Registry version (default: the champion).")] = None,
) -> None:
    """Batch-score a version (default: the champion) into Redis and make it live."""
    from mlflow import MlflowClient

    from training.experiment import publish_version
    from training.registry import CHAMPION, alias_version
    from training.tracking import configure_tracking

    settings = load_settings()
    configure_tracking(settings)
    _need_redis(settings)
    if version is None:
        champion = alias_version(MlflowClient(), settings.model_name, CHAMPION)
        if champion is None:
            raise UserError(f"{settings.model_name} has no champion yet: run `shopstream train` first")
        version = str(champion.version)
    stats = publish_version(settings, version)
    out.print(f"version {version} live in Redis: {stats.users} users, {stats.items} items, "
              f"{stats.keys} keys in {stats.seconds:.1f}s")


@app.command()
def serve() -> None:
    """Serve top sellers and recommendations over HTTP (uvicorn; SHOPSTREAM_API_HOST/_PORT/_WORKERS)."""
    from serving.server import run

    run(load_settings())


@app.command()
def verify(
    sample: Annotated[int, typer.Option(min=1, help="Users and items to sample, each.")] = 200,
    since: Annotated[str | None, typer.Option(help="Sample entities with events from this time (ISO-8601).")] = None,
    until: Annotated[str | None, typer.Option(help="... up to this time (ISO-8601).")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    max_as_of: Annotated[int, typer.Option(min=1, help="At most this many distinct as-of times recomputed per kind.")] = 25,
    show: Annotated[int, typer.Option(min=0, help="Mismatches to print.")] = 10,
) -> None:
    """Compare online (streamed) feature values with a batch recomputation over the offline store's events.

    Prints the match rate per feature view and for the top-seller lists; exits 1 below 100 %.
    """
    from datetime import UTC, datetime

    from pipelines.verify import run_verify

    def parse(text: str | None) -> datetime | None:
        if text is None:
            return None
        try:
            ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UserError(f"expected an ISO-8601 time, got {text!r}") from None
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts

    settings = load_settings()
    _need_redis(settings)  # it compares what the stream wrote there
    reports = run_verify(settings, sample=sample, since=parse(since), until=parse(until),
                         seed=seed, max_as_of=max_as_of)
    table = Table(title="online (stream) vs batch recomputation")
    for col in ("view", "compared", "matched", "match rate", "as-of times", "no online value"):
        table.add_column(col)
    for r in reports:
        table.add_row(r.kind, str(r.compared), str(r.matched), f"{100 * r.rate:.2f} %",
                      str(r.as_of_times), str(r.missing_online))
    out.print(table)
    mismatches = [m for r in reports for m in r.mismatches]
    for m in mismatches[:show]:
        out.print(f"  {m.kind} {m.entity} @ {m.as_of}: {m.feature}: online={m.online!r} batch={m.batch!r}",
                  highlight=False)
    total = sum(r.compared for r in reports)
    matched = sum(r.matched for r in reports)
    out.print(f"match rate: {100 * matched / total if total else 100:.2f} % ({matched}/{total})")
    if matched < total:
        raise typer.Exit(1)


def shown_figure(value: str) -> str:
    """A published figure as people read it: seconds and rates to three decimals
    (``9.612435817718506`` -> ``9.612``); whole numbers, times and text unchanged."""
    if re.fullmatch(r"-?\d+\.\d{4,}", value):
        return f"{float(value):.3f}"
    return value


@app.command()
def status() -> None:
    """Show infrastructure health and the streaming job's latest progress.

    Exits 3 when a server is unhealthy, 4 when the streaming job failed or died without a
    word (its state says running, its heartbeat stopped), so a cron job or a probe can act.
    """
    from datetime import UTC, datetime

    from pipelines import infra
    from pipelines.stream_metrics import read_progress, stream_health

    settings = load_settings()
    health = infra.status(settings)
    _print_status(health)
    progress = read_progress(settings, redis_up=bool(health["redis"].get("healthy")))
    verdict = stream_health(progress, datetime.now(UTC))
    colour = {"running": "green", "failed": "red", "silent": "red"}.get(verdict.state, "yellow")
    out.print(f"[bold]streaming job:[/bold] [{colour}]{escape(verdict.message)}[/{colour}]")
    if progress:
        table = Table(title="streaming job (latest micro-batch)")
        table.add_column("metric")
        table.add_column("value")
        first = [name for name in ("job_state", "job_state_since") if name in progress]
        for name in first + [name for name in progress if name not in first]:
            table.add_row(name, shown_figure(progress[name]))
        out.print(table)
    if not all(component.get("healthy") for component in health.values()):
        raise typer.Exit(3)
    if not verdict.healthy:
        raise typer.Exit(4)


@app.command()
def demo(
    keep_running: Annotated[bool, typer.Option(help="Leave the servers running afterwards.")] = False,
    events: Annotated[int, typer.Option(min=1000, help="Generated events to stream (default 50,000).")] = 50_000,
    all_models: Annotated[bool, typer.Option(
        help="Train every model (adds ALS and the learning-to-rank re-ranker; a few minutes more).")] = False,
) -> None:
    """Run the whole story on local defaults, starting (and then stopping) the servers itself."""
    from pipelines.demo import run_demo

    run_demo(load_settings(), keep_running=keep_running, events=events, all_models=all_models)


def main() -> None:
    """Console-script entry point: user errors become one line, not a traceback."""
    from pipelines.connections import Unreachable
    from pipelines.infra.jars import JarResolutionError
    from pipelines.infra.process import StartupError

    # typer vendors click; its UsageError is the base of BadParameter, NoSuchOption, ...
    usage_error = type(typer.BadParameter("")).__mro__[1]
    # A process manager stops us with SIGTERM: handle it as Ctrl-C, so cleanup runs (the
    # demo stops the servers it started, generate delivers what it buffered; the stream
    # finishes its batch, pipelines.signals) instead of Python dying on the spot.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except usage_error as exc:  # type: ignore[misc]
        # click's own errors (a malformed option value, an unknown option): one line naming it.
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "shopstream"
        message = exc.format_message()
        if message:  # empty when click already printed the help (no arguments given)
            console.print(f"[red]error:[/red] {command}: {message}", markup=True, highlight=False,
                          soft_wrap=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:
        console.print("aborted")
        sys.exit(130)
    except (UserError, Unreachable, StartupError, JarResolutionError, FileNotFoundError) as exc:
        if _state["debug"]:
            raise
        console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(2 if isinstance(exc, UserError | Unreachable) else 1)


if __name__ == "__main__":
    main()
