"""kill -9 of the streaming job at random moments while a generator feeds the topic.

``shopstream generate --rate`` sends live traffic (malformed records and duplicates
mixed in) for the whole test; ``shopstream stream`` runs as a real subprocess and is
SIGKILLed (driver, JVM and Python workers: the whole process group) at seeded random
moments after it has made progress (a new micro-batch planned), then restarted. When the generator is done, one
last run drains the topic. Then the stores must be exactly what the contract says for
the records the broker holds (read back from the topic, so the check does not depend on
where the generator was when a kill hit):

* the raw offline store holds every valid event once, with its values;
* the quarantine holds every malformed record once, with its reason code;
* every sampled Redis feature equals the batch recomputation (``verify``: 100 %),
  i.e. no event lost and none counted twice in the online store either;
* the feature snapshots (due every 10 s of event time here, some cut by a kill and
  written by the next process) hold what serving read.

Default (CI): 3 kills, 20 events/s. Full: 6 kills, 100 events/s.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings
from tests.integration.test_stream import (
    check_stores,
    create_topic,
    expected_outcome,
    stream_settings,
)
from tests.reliability.helpers import CliProcess, read_topic, size, tail, topic_name, wait_for

pytestmark = [pytest.mark.reliability, pytest.mark.integration]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SEED = 20240601
KILLS = size(3, 6)
RATE = size(20, 100)
MAX_DELAY_S = size(4.0, 8.0)
"""A kill comes a random 0..MAX_DELAY_S seconds after the restarted job planned a new batch
(so every restart made progress: it recovered the killed batch and started the next)."""
START_BOUND_S = 600.0
"""A restarted job must plan a new micro-batch within this (JVM + Spark start on a shared machine)."""


def _planned(checkpoint: Path) -> int:
    offsets = checkpoint / "offsets"
    return sum(1 for p in offsets.iterdir() if p.name.isdigit()) if offsets.exists() else 0


def test_sigkill_at_random_moments_while_generating_loses_nothing(
    make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any, spark: Any,
    tmp_path: Path,
) -> None:
    from pipelines.stream import query_checkpoint

    topic = topic_name("crash", tmp_path)
    settings = stream_settings(make_settings, tmp_path, topic,
                               stream_max_offsets_per_trigger=size(120, 300),
                               stream_trigger_seconds=0.5,
                               # a 10 s slide: the event-time clock crosses several tile
                               # boundaries during the run, so feature snapshots are due
                               # (and some are cut by a kill and redone); with the 60 s
                               # default a run can stay in one slide and write none
                               feature_slide_seconds=10)
    create_topic(settings, topic)
    checkpoint = Path(query_checkpoint(settings))
    rng = random.Random(SEED)
    stream_log = tmp_path / "stream.log"
    gen_log = tmp_path / "generate.log"

    generator = CliProcess(settings, [
        "generate", "--rate", str(RATE), "--duration", "900", "--seed", str(SEED),
        "--bad-fraction", "0.05", "--users", "60", "--items", "40", "--categories", "5",
    ], gen_log)
    moments: list[str] = []
    stream: CliProcess | None = None
    try:
        for kill in range(KILLS):
            before = _planned(checkpoint)
            started = time.monotonic()
            stream = CliProcess(settings, ["stream", "--timeout", "900"], stream_log)
            wait_for(lambda before=before: _planned(checkpoint) > before, timeout=START_BOUND_S,
                     what=f"restart {kill}: a new micro-batch", alive=stream.alive, log=stream_log)
            delay = rng.uniform(0.0, MAX_DELAY_S)
            time.sleep(delay)
            assert generator.alive(), f"the generator stopped early:\n{tail(gen_log)}"
            planned = _planned(checkpoint)
            committed = len([p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]) \
                if (checkpoint / "commits").exists() else 0
            stream.kill(signal.SIGKILL)
            moments.append(f"kill {kill + 1}: {time.monotonic() - started:.1f} s after start, "
                           f"{delay:.2f} s after a new batch; batches planned {planned}, "
                           f"committed {committed}")
            print(moments[-1])
        # the generator stops (SIGINT, as a user would); the broker holds what it acked
        generator.kill(signal.SIGINT)
        # the drain takes what is left in large batches (the killed runs' batches stay as planned)
        stream = CliProcess(settings, ["stream", "--until-idle", "5", "--timeout", "900"], stream_log,
                            SHOPSTREAM_STREAM_MAX_OFFSETS_PER_TRIGGER="50000")
        assert stream.wait(timeout=1000) == 0, tail(stream_log)
    finally:
        generator.stop()
        if stream is not None:
            stream.stop()

    sent = read_topic(settings, topic)
    expected = expected_outcome(sent)
    print(f"{len(sent)} records in the topic: {len(expected.events)} events, "
          f"{sum(expected.quarantine.values())} quarantined, {expected.duplicates} duplicates; "
          f"{len(moments)} kills: " + "; ".join(moments))
    assert len(moments) == KILLS
    assert len(expected.events) > 0 and sum(expected.quarantine.values()) > 0
    assert expected.late == 0
    check_stores(spark, settings, expected)
