"""``shopstream demo``: the whole story on local defaults, one stage after another.

The demo runs the same commands a user would (``shopstream replay``, ``stream``,
``backfill``, ``train``, ``serve``) as child processes, printing each command
before it runs, so the output doubles as a tutorial. It starts the local servers
itself, begins from a clean slate (its own data from an earlier demo is removed),
and stops everything it started unless ``keep_running``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from pipelines.settings import Settings

__all__ = ["run_demo", "DemoContext", "DemoError", "stage_table", "GENERATED_EVENTS", "DEMO_MODELS"]

log = logging.getLogger(__name__)
console = Console()

GENERATED_EVENTS = 50_000
"""Generated events by default: enough for every story beat (top sellers, a model that beats
popularity, a live burst) in a fraction of the stream's time; ``--events`` changes it."""
BURST_VIEWS = 12
STREAM_CATCH_UP_TIMEOUT_S = 900.0
LIVE_CLICKS_TIMEOUT_S = 90.0
DEMO_MODELS = ("popularity", "popularity_region", "item_knn", "ease")
"""Trained by default (the baseline and three personal models, about a minute);
``--all-models`` adds ALS and the learning-to-rank re-ranker for the full comparison."""


class DemoError(RuntimeError):
    """A stage failed; the message names the command and where its output went."""


@dataclass
class DemoContext:
    settings: Settings
    events: int = GENERATED_EVENTS
    all_models: bool = False
    started_infra: bool = False
    api: Any = None
    stream: Any = None
    backfill: Any = None
    """A backfill running alongside training (``subprocess.Popen``), until the train stage ends."""
    """The background ``shopstream stream`` (started in the stream stage, kept for the live clicks)."""
    notes: dict[str, Any] = field(default_factory=dict)
    timings: list[tuple[str, float]] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"


def _shopstream(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", *args]


def _run(ctx: DemoContext, *args: str, timeout: float = 600) -> None:
    """Run one ``shopstream`` command, its output streaming to the terminal."""
    console.print(f"[bold cyan]$ shopstream {' '.join(args)}[/bold cyan]")
    result = subprocess.run(_shopstream(*args), timeout=timeout, check=False)
    if result.returncode != 0:
        raise DemoError(f"`shopstream {' '.join(args)}` exited with status {result.returncode}")


def _api_get(ctx: DemoContext, path: str, **params: Any) -> dict[str, Any]:
    import httpx

    headers = {}
    if ctx.settings.api_key is not None:
        headers["X-API-Key"] = ctx.settings.api_key.get_secret_value()
    response = httpx.get(ctx.api_url + path, params=params, headers=headers, timeout=5)
    response.raise_for_status()
    return response.json()


# ------------------------------------------------------------------ stages
def _stage_infra(ctx: DemoContext) -> None:
    from pipelines import infra
    from pipelines.infra import KafkaBroker, RedisServer

    running = KafkaBroker(ctx.settings).process.is_running() or RedisServer(ctx.settings).process.is_running()
    if not running and ctx.settings.is_local_data_dir:
        # A clean slate: the topic, Redis, the offline store and checkpoints of an earlier demo.
        infra.down(ctx.settings, purge=True)
        for part in ("offline", "checkpoints", "feast", "mlflow", "stream"):
            shutil.rmtree(ctx.settings.data_path(part), ignore_errors=True)
    infra.up(ctx.settings)
    ctx.started_infra = not running
    console.print(f"Kafka on {ctx.settings.kafka_bootstrap_servers}, Redis on {ctx.settings.redis_url_redacted}")


def _stage_replay(ctx: DemoContext) -> None:
    _run(ctx, "replay", "--preset", "online-retail")


def _stage_generate(ctx: DemoContext) -> None:
    _run(ctx, "generate", "--count", str(ctx.events), "--seed", "42", "--users", "5000",
         "--items", "2000", "--categories", "30", "--bad-fraction", "0.01")


def _stage_stream(ctx: DemoContext) -> None:
    """Start the stream in the background and wait until it has read everything in the topic.

    It keeps running afterwards, so the live clicks later in the story reach Redis through
    the same running job (no second Spark start-up), as they would in production.
    """
    from pipelines.infra.kafka_broker import topic_message_counts
    from pipelines.infra.process import ManagedProcess

    topic = ctx.settings.kafka_topic_events
    expected = sum(t.messages for t in topic_message_counts(ctx.settings, [topic]))
    run = ctx.settings.run_path / "stream"
    ctx.stream = ManagedProcess("stream", run / "stream.pid", run / "stream.log")
    console.print("[bold cyan]$ shopstream stream[/bold cyan]  (in the background, kept running for "
                  f"the live clicks; log: {ctx.stream.log_file})")
    ctx.stream.start(_shopstream("stream"))
    started = time.monotonic()
    last_report = started
    while True:
        totals = _stream_totals(ctx)
        if totals.get("input_rows", 0) >= expected:
            break
        if not ctx.stream.is_running():
            raise DemoError(f"the stream stopped before catching up; see {ctx.stream.log_file}")
        if time.monotonic() - started > STREAM_CATCH_UP_TIMEOUT_S:
            raise DemoError(f"the stream did not catch up within {STREAM_CATCH_UP_TIMEOUT_S:.0f} s; "
                            f"see {ctx.stream.log_file}")
        if time.monotonic() - last_report >= 15:
            last_report = time.monotonic()
            console.print(f"  {totals.get('input_rows', 0):,} of {expected:,} records read "
                          f"({time.monotonic() - started:.0f} s)")
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    console.print(
        f"caught up: {totals['input_rows']:,} records read in {totals.get('batches', 0)} micro-batches, "
        f"{totals.get('on_time', 0):,} events stored, {totals.get('quarantined', 0):,} quarantined "
        f"({totals.get('late', 0):,} late), {totals.get('duplicates_dropped', 0):,} duplicates dropped; "
        f"{elapsed:.0f} s including Spark's start-up")
    ctx.notes["stream"] = {**totals, "seconds": elapsed}


def _stream_totals(ctx: DemoContext) -> dict[str, int]:
    """The running stream's totals since it started (its progress file), ``{}`` before the first batch."""
    import json

    from pipelines.stream_metrics import progress_path

    path = progress_path(ctx.settings)
    if path is None or not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text()).get("totals", {}))
    except (OSError, ValueError):
        return {}  # caught mid-write; the next poll reads it


def _start_api(ctx: DemoContext) -> None:
    """Start ``shopstream serve`` in the background (it loads while the backfill runs)."""
    from pipelines.infra.process import ManagedProcess

    run = ctx.settings.run_path / "api"
    ctx.api = ManagedProcess("api", run / "api.pid", run / "api.log")
    console.print("[bold cyan]$ shopstream serve[/bold cyan]  (in the background; ready once a model is live)")
    ctx.api.start(_shopstream("serve"))


def _stage_backfill(ctx: DemoContext) -> None:
    """Backfill the generated stream's hour; alongside training unless the re-ranker needs it.

    Only the learning-to-rank re-ranker reads the backfill's snapshots (Feast historical
    features), so with the default models the backfill runs in the background while the
    models train (its output goes to a log, summarized when the training is done).
    """
    _start_api(ctx)
    # The generated stream's last hour, with the last as-of time exactly now: the values it
    # materializes into Redis are as of now, never ahead of the running stream's.
    until = datetime.now(UTC).replace(microsecond=0)
    since = until - timedelta(hours=1)
    args = ("backfill", "--since", since.isoformat(), "--until", until.isoformat(), "--every", "30")
    if ctx.all_models:
        _run(ctx, *args)
        return
    log_file = ctx.settings.run_path / "demo" / "backfill.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold cyan]$ shopstream {' '.join(args)}[/bold cyan]  (in the background, alongside "
                  f"training; log: {log_file})")
    with log_file.open("wb") as out:
        ctx.backfill = subprocess.Popen(_shopstream(*args), stdout=out, stderr=subprocess.STDOUT)
    ctx.notes["backfill_log"] = log_file


def _await_backfill(ctx: DemoContext) -> None:
    """Wait for a background backfill; print the end of its output; fail the stage if it failed."""
    proc, ctx.backfill = ctx.backfill, None
    if proc is None:
        return
    console.print("waiting for the backfill to finish ...")
    try:
        code = proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise DemoError("`shopstream backfill` did not finish within 900 s") from None
    log_file = ctx.notes.get("backfill_log")
    lines = log_file.read_text(errors="replace").splitlines() if log_file else []
    console.print(Rule("shopstream backfill (ran alongside training)", style="dim"))
    console.print("\n".join(lines[-20:]), markup=False, highlight=False)
    if code != 0:
        raise DemoError(f"`shopstream backfill` exited with status {code} (see {log_file})")


def _stage_train(ctx: DemoContext) -> None:
    models = "all" if ctx.all_models else ",".join(DEMO_MODELS)
    if not ctx.all_models:
        console.print("[dim](a subset of the models; `shopstream demo --all-models` adds ALS and the "
                      "learning-to-rank re-ranker)[/dim]")
    try:
        _run(ctx, "train", "--model", models, timeout=900)
    finally:
        _await_backfill(ctx)


def _stage_serve(ctx: DemoContext) -> None:
    import httpx

    from pipelines.infra.process import wait_until

    if ctx.api is None:
        _start_api(ctx)
    wait_until(lambda: httpx.get(ctx.api_url + "/readyz", timeout=2).status_code == 200,
               timeout=60, what="the API", alive=ctx.api.is_running, log_file=ctx.api.log_file)
    console.print(f"API ready at {ctx.api_url} (docs: {ctx.api_url}/docs)")


def _stage_top_sellers(ctx: DemoContext) -> None:
    overall = _api_get(ctx, "/v1/top-sellers", window="24h", k=10)
    regions = _regions(ctx)
    table = Table(title="Top sellers, last 24 h (units), by region")
    table.add_column("region")
    table.add_column("top 3 items (units)")
    for region in regions[:6]:
        answer = _api_get(ctx, "/v1/top-sellers", window="24h", region=region, k=3)
        table.add_row(region, ", ".join(f"{i['item_id']} ({i['score']:.0f})" for i in answer["items"]))
    table.add_row("[bold]global[/bold]", ", ".join(
        f"{i['item_id']} ({i['score']:.0f})" for i in overall["items"][:3]))
    console.print(table)


def _regions(ctx: DemoContext) -> list[str]:
    from pipelines.clickstream_model import REGIONS

    return [name for name, _weight in REGIONS]


def _recommendations(ctx: DemoContext, user_id: str) -> dict[str, Any]:
    return _api_get(ctx, f"/v1/users/{user_id}/recommendations", k=10)


def _item_categories(ctx: DemoContext, items: list[str]) -> dict[str, str]:
    from features.online_keys import item_meta_key
    from pipelines.connections import redis_client

    client = redis_client(ctx.settings, timeout_ms=2000)
    pipe = client.pipeline(transaction=False)
    for item in items:
        pipe.hget(item_meta_key(item), "category_id")
    values = pipe.execute()
    client.close()
    return {item: (v.decode() if v else "?") for item, v in zip(items, values, strict=True)}


def _stage_live_clicks(ctx: DemoContext) -> None:
    from features.events import event_to_json
    from pipelines.connections import kafka_producer

    user_id = _a_known_user(ctx)
    before = _recommendations(ctx, user_id)
    before_items = [i["item_id"] for i in before["items"]]
    categories = _item_categories(ctx, before_items)
    seen = set(categories.values())
    top = _api_get(ctx, "/v1/top-sellers", window="24h", k=100)["items"]
    top_categories = _item_categories(ctx, [i["item_id"] for i in top])
    new_category = next((c for c in top_categories.values() if c not in seen and c != "?"), None)
    if new_category is None:
        console.print("no category outside this user's recommendations to click in; skipping")
        return
    targets = [i["item_id"] for i in _api_get(ctx, "/v1/top-sellers", window="24h",
                                               category=new_category, k=BURST_VIEWS)["items"]]
    now = datetime.now(UTC)
    read_before = _stream_totals(ctx).get("input_rows", 0)
    producer = kafka_producer(ctx.settings)
    for n, item in enumerate((targets * BURST_VIEWS)[:BURST_VIEWS]):
        event = {
            "event_id": f"demo-burst-{now:%Y%m%d%H%M%S}-{n}", "event_type": "view",
            "event_time": now + timedelta(milliseconds=n), "user_id": user_id,
            "session_id": f"demo-{now:%H%M%S}", "item_id": item, "category_id": new_category,
            "region": before.get("region") or "United Kingdom", "device": "mobile",
        }
        producer.send(ctx.settings.kafka_topic_events, key=user_id.encode(), value=event_to_json(event))
    producer.flush()
    producer.close()
    console.print(f"user [bold]{user_id}[/bold] viewed {BURST_VIEWS} items of category "
                  f"[bold]{new_category}[/bold], new to their recommendations; the running stream "
                  "picks them up:")
    sent = time.monotonic()
    after = _await_burst(ctx, user_id, read_before)
    visible_s = time.monotonic() - sent
    console.print(f"the stream had processed the burst and the API answered {visible_s:.1f} s after it was "
                  "sent (Kafka -> stream -> Redis -> API)")
    after_items = [i["item_id"] for i in after["items"]]
    after_categories = _item_categories(ctx, after_items)
    table = Table(title=f"Recommendations for {user_id}: before and after the live clicks")
    table.add_column("#", justify="right")
    table.add_column("before (category, source)")
    table.add_column("after (category, source)")
    def cell(items: list[dict[str, Any]], cats: dict[str, str], rank: int) -> str:
        if rank >= len(items):
            return ""
        item = items[rank]
        text = f"{item['item_id']} ({cats.get(item['item_id'], '?')}, {item['source']})"
        return f"[green]{text}[/green]" if cats.get(item["item_id"]) == new_category else text

    for rank in range(max(len(before_items), len(after_items))):
        table.add_row(str(rank + 1), cell(before["items"], categories, rank),
                      cell(after["items"], after_categories, rank))
    console.print(table)
    n_before = sum(1 for c in categories.values() if c == new_category)
    n_after = sum(1 for c in after_categories.values() if c == new_category)
    fresh = after.get("freshness", {}).get("user_activity") or {}
    console.print(f"items of category {new_category}: {n_before} before, {n_after} after; "
                  f"the user's features were {fresh.get('age_ms', '?')} ms old "
                  f"(as of {fresh.get('as_of', '?')}), model version {after.get('model_version')}")
    ctx.notes["burst"] = {"user": user_id, "category": new_category, "before": n_before, "after": n_after,
                          "visible_s": visible_s}


def _await_burst(ctx: DemoContext, user_id: str, read_before: int) -> dict[str, Any]:
    """The user's recommendations once the running stream has processed the burst.

    The stream's progress file counts the records of completed micro-batches; once it
    has grown by the burst, the burst's features are in Redis. Without a running stream
    (it stopped), the burst is streamed with ``--available-now``.
    """
    if ctx.stream is None or not ctx.stream.is_running():
        console.print("[yellow]the background stream is not running; streaming the burst once[/yellow]")
        _run(ctx, "stream", "--available-now")
        return _recommendations(ctx, user_id)
    deadline = time.monotonic() + LIVE_CLICKS_TIMEOUT_S
    while _stream_totals(ctx).get("input_rows", 0) < read_before + BURST_VIEWS:
        if time.monotonic() > deadline:
            console.print(f"[yellow]the stream had not processed the burst within {LIVE_CLICKS_TIMEOUT_S:.0f} s "
                          f"(see {ctx.stream.log_file})[/yellow]")
            break
        if not ctx.stream.is_running():
            raise DemoError(f"the stream stopped; see {ctx.stream.log_file}")
        time.sleep(0.1)
    return _recommendations(ctx, user_id)


def _a_known_user(ctx: DemoContext) -> str:
    from features.online_keys import key
    from pipelines.connections import redis_client

    client = redis_client(ctx.settings, timeout_ms=2000)
    live = client.get(key("model", "live"))
    pattern = key("rec", (live or b"*").decode(), "user", "*")
    for raw in client.scan_iter(match=pattern, count=1000):
        user = raw.decode().rsplit(":", 1)[-1]
        if user.startswith("u"):
            client.close()
            from urllib.parse import unquote

            return unquote(user)
    client.close()
    raise DemoError("no user with recommendations in Redis: did training publish a champion?")


def _stage_summary(ctx: DemoContext) -> None:
    stream = ctx.notes.get("stream")
    if stream and stream.get("seconds"):
        rows, seconds = stream.get("input_rows", 0), stream["seconds"]
        console.print(f"catch-up throughput: {rows:,} records in {seconds:.0f} s = {rows / seconds:,.0f} records/s "
                      "(wall time, Spark start-up included; `make bench` measures the sustained rate)")
    burst = ctx.notes.get("burst")
    if burst and burst.get("visible_s") is not None:
        console.print(f"freshness of the live clicks: visible through the API {burst['visible_s']:.1f} s after "
                      "they were sent")
    _run(ctx, "status")


STAGES: list[tuple[str, Callable[[DemoContext], None]]] = [
    ("Start Kafka and Redis", _stage_infra),
    ("Replay the real Online Retail data set into Kafka", _stage_replay),
    ("Generate a synthetic clickstream (1% malformed) into Kafka", _stage_generate),
    ("Stream it: validate, quarantine, offline store, online features", _stage_stream),
    ("Backfill features in batch (snapshots for training; alongside training by default)", _stage_backfill),
    ("Train, evaluate and register recommenders (MLflow)", _stage_train),
    ("Serve the API", _stage_serve),
    ("Top sellers per region", _stage_top_sellers),
    ("A burst of live clicks changes one user's recommendations", _stage_live_clicks),
    ("Streaming throughput, freshness and health", _stage_summary),
]


def run_demo(settings: Settings, *, keep_running: bool = False, events: int = GENERATED_EVENTS,
             all_models: bool = False) -> DemoContext:
    """Run every stage in order; stop what it started unless ``keep_running``.

    Each stage's wall time is printed when it ends and again in a summary table at
    the end (also after a failure, up to the stage that failed).
    """
    ctx = DemoContext(settings, events=events, all_models=all_models)
    started = time.monotonic()
    try:
        for number, (title, stage) in enumerate(STAGES, start=1):
            console.print(Rule(f"[bold]{number}/{len(STAGES)} {title}"))
            t0 = time.monotonic()
            try:
                stage(ctx)
            finally:
                ctx.timings.append((title, time.monotonic() - t0))
            console.print(f"[dim]({ctx.timings[-1][1]:.1f}s, {time.monotonic() - started:.0f}s so far)[/dim]")
    finally:
        if not keep_running:
            t0 = time.monotonic()
            if ctx.backfill is not None and ctx.backfill.poll() is None:
                ctx.backfill.terminate()
            if ctx.stream is not None:
                ctx.stream.stop(timeout=60)
            if ctx.api is not None:
                ctx.api.stop()
            if ctx.started_infra:
                from pipelines import infra

                infra.down(settings)
                console.print("stopped the servers the demo started (data kept under the data dir)")
            ctx.timings.append(("Stop what the demo started", time.monotonic() - t0))
        total = time.monotonic() - started
        console.print(stage_table(ctx.timings, total))
    console.print(Rule(f"demo finished in {total:.0f}s ({total / 60:.1f} min)"))
    console.print(
        "Where to look next:\n"
        f"  API docs       {ctx.api_url}/docs  (`shopstream demo --keep-running` leaves it up)\n"
        f"  MLflow UI      .venv/bin/mlflow ui --backend-store-uri {settings.tracking_uri}\n"
        "  status         .venv/bin/shopstream status\n"
        "  everything     README.md"
    )
    return ctx


def stage_table(timings: list[tuple[str, float]], total: float) -> Table:
    """Stage wall times, their share of the total, and the total."""
    table = Table(title="Demo stage times")
    table.add_column("#", justify="right")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for number, (title, seconds) in enumerate(timings, start=1):
        share = f"{seconds / total:.0%}" if total > 0 else ""
        table.add_row(str(number), title, f"{seconds:.1f}", share)
    table.add_row("", "[bold]total[/bold]", f"[bold]{total:.1f}[/bold]", "")
    return table
