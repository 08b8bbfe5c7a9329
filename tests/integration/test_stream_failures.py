"""How the stream says it cannot go on: a query that fails while the job waits on it, and a
checkpoint written for another topic. Real Spark session and queries."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings
from pipelines.stream import (
    CheckpointTopicError,
    StreamFailed,
    StreamOptions,
    _wait,
    check_checkpoint_topic,
)

pytestmark = pytest.mark.integration

_OFFSETS = ('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1796093791429,"conf":{}}\n'
            '{"clickstream.events.v1":{"0":743,"1":660}}')


def test_a_query_that_fails_while_the_job_waits_is_a_stream_failed_in_one_line(
        spark: Any, tmp_path: Path) -> None:
    """``awaitTermination`` raises the query's failure; it escaped the job's wait loop as a
    ``StreamingQueryException`` traceback with the whole plan in it."""
    def fail(frame: Any, batch_id: int) -> None:
        raise ValueError(f"bad batch {batch_id}")

    query = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
             .writeStream.foreachBatch(fail)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="1 second").start())
    try:
        with pytest.raises(StreamFailed) as failed:
            _wait(query, StreamOptions(stop="never", timeout_seconds=120))
    finally:
        query.stop()
    message = str(failed.value)
    assert "ValueError: bad batch 0" in message and "\n" not in message, message


def test_a_checkpoint_of_another_topic_is_refused_naming_both(
        spark: Any, make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    settings = make_settings(kafka_topic_events="clickstream.events.v2")
    check_checkpoint_topic(spark, str(checkpoint), settings)  # a new checkpoint: nothing to check
    (checkpoint / "offsets").mkdir(parents=True)
    check_checkpoint_topic(spark, str(checkpoint), settings)  # no batch planned yet
    (checkpoint / "offsets" / "0").write_text(_OFFSETS)
    (checkpoint / "offsets" / "1").write_text(_OFFSETS.replace("743", "800"))
    with pytest.raises(CheckpointTopicError) as refused:
        check_checkpoint_topic(spark, str(checkpoint), settings)
    assert str(refused.value) == (
        f"the checkpoint {checkpoint} holds offsets of the topic clickstream.events.v1, not of "
        "SHOPSTREAM_KAFKA_TOPIC_EVENTS=clickstream.events.v2: set the topic back, or give the "
        "new topic a checkpoint of its own (SHOPSTREAM_CHECKPOINT_DIR)")
    check_checkpoint_topic(spark, str(checkpoint), make_settings(kafka_topic_events="clickstream.events.v1"))
