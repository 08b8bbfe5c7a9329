"""``shopstream demo``: the whole story on local defaults, one stage after another.

Each stage is a small function that prints what it did; the demo starts the
local servers itself and stops what it started unless ``keep_running``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.rule import Rule

from pipelines.settings import Settings

__all__ = ["run_demo", "DemoContext"]

log = logging.getLogger(__name__)
console = Console()


@dataclass
class DemoContext:
    settings: Settings
    started_infra: bool = False
    notes: dict[str, object] = field(default_factory=dict)


def _stage_infra(ctx: DemoContext) -> None:
    from pipelines import infra
    from pipelines.infra import KafkaBroker, RedisServer

    already = KafkaBroker(ctx.settings).process.is_running() and RedisServer(ctx.settings).process.is_running()
    infra.up(ctx.settings)
    ctx.started_infra = not already
    console.print(f"Kafka on {ctx.settings.kafka_bootstrap_servers}, Redis on {ctx.settings.redis_url_redacted}")


def _stage_replay(ctx: DemoContext) -> None:
    from pipelines.replay import run_replay

    run_replay(ctx.settings, path=None, preset="online-retail", mapping=[], speedup=None, limit=None, output=None)


def _stage_generate(ctx: DemoContext) -> None:
    from pipelines.generate import GeneratorConfig, run_generate

    run_generate(
        ctx.settings,
        GeneratorConfig(seed=42, users=5_000, items=2_000, categories=30, bad_fraction=0.01),
        count=200_000, duration=None, rate=None, start_time=None, output=None,
    )


def _stage_count(ctx: DemoContext) -> None:
    from pipelines.infra.kafka_broker import topic_message_counts

    [info] = topic_message_counts(ctx.settings, [ctx.settings.kafka_topic_events])
    ctx.notes["messages"] = info.messages
    console.print(
        f"topic [bold]{info.name}[/bold]: {info.messages:,} messages in {info.partitions} partitions"
    )


STAGES: list[tuple[str, Callable[[DemoContext], None]]] = [
    ("Start Kafka and Redis", _stage_infra),
    ("Replay the real Online Retail data set", _stage_replay),
    ("Generate a synthetic clickstream (1% malformed)", _stage_generate),
    ("Read back what the topic holds", _stage_count),
]


def run_demo(settings: Settings, *, keep_running: bool = False) -> DemoContext:
    """Run every stage in order; stop the servers it started unless ``keep_running``."""
    ctx = DemoContext(settings)
    started = time.monotonic()
    try:
        for number, (title, stage) in enumerate(STAGES, start=1):
            console.print(Rule(f"[bold]{number}/{len(STAGES)} {title}"))
            t0 = time.monotonic()
            stage(ctx)
            console.print(f"[dim]({time.monotonic() - t0:.1f}s)[/dim]")
    finally:
        if ctx.started_infra and not keep_running:
            from pipelines import infra

            infra.down(settings)
            console.print("stopped the servers the demo started (data kept under the data dir)")
    console.print(Rule(f"demo finished in {time.monotonic() - started:.0f}s"))
    console.print(
        "Next: `.venv/bin/shopstream infra up` then `.venv/bin/shopstream infra status`; "
        "the README lists every command."
    )
    return ctx
