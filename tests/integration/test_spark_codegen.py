"""A micro-batch's plans compile their generated code once, not every batch.

Spark writes number literals into the Java code it generates for a stage, and a
new source is a new Janino compile and new classes for the JIT: at a micro-batch
a second, that cost the stream more CPU than its events did. The per-batch values
(the batch id, the late cut) are kept out of the code. The tests hold that by
counting Spark's compiles (``CodegenMetrics``) across batches, or by comparing the
generated source of the batch's stage for different values.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings

pytestmark = pytest.mark.integration

# the stream's Python workers must import redis & co.: the venv's interpreter (read when
# the SparkContext starts, so set at collection time, before the session fixture)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def _compiles(spark: Any) -> int:
    metrics = getattr(spark._jvm, "org.apache.spark.metrics.source.CodegenMetrics")
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def _events(spark: Any, start: datetime, n: int = 6) -> Any:
    rows = [(f"e{i}", "view", start + timedelta(minutes=i), f"u{i % 2}", "s1", f"i{i % 3}",
             "c1", "UK", None, None, "web") for i in range(n)]
    return spark.createDataFrame(rows, "event_id string, event_type string, event_time timestamp, "
                                       "user_id string, session_id string, item_id string, "
                                       "category_id string, region string, price double, "
                                       "quantity int, device string")


def test_the_events_write_compiles_once_for_every_batch_id(
        spark: Any, make_settings: Any, tmp_path: Path) -> None:
    """Batches 1-3 of the raw events sink: the first compiles, the next two reuse its
    code, and each batch's files land under their own ``batch_id=`` partition."""
    from pipelines import offline_store
    from pipelines.stream import write_events_batch

    settings: Settings = make_settings(data_dir=str(tmp_path / "data"))
    events = _events(spark, datetime(2026, 11, 1, 10, tzinfo=UTC)).localCheckpoint()
    write_events_batch(events, settings, 1)
    before = _compiles(spark)
    write_events_batch(events, settings, 2)
    write_events_batch(events, settings, 3)
    assert _compiles(spark) == before, "a batch id made the write compile new code"

    written = spark.read.parquet(offline_store.events_path(settings))
    by_batch = {r["batch_id"]: r["n"] for r in written.groupBy("batch_id").count()
                .withColumnRenamed("count", "n").collect()}
    assert by_batch == {1: 6, 2: 6, 3: 6}
    assert dict(written.dtypes)["batch_id"] == "int"  # readers see the number they always did


def _stage_code(frame: Any, marker: str) -> str:
    """The generated Java source of the whole-stage-codegen subtree whose plan shows ``marker``."""
    stages = frame._jdf.queryExecution().debug().codegenToSeq()
    found = [stages.apply(i)._2() for i in range(stages.length())
             if marker in stages.apply(i)._1()]
    assert len(found) == 1, [stages.apply(i)._1() for i in range(stages.length())]
    return str(found[0])


def test_the_late_split_generates_the_same_code_for_every_cut(spark: Any) -> None:
    """Three batches, three late cuts and batch timestamps: the right verdicts and
    ingest times each time, and the batch's projection (the stage that compares event
    times with the cut) has the same generated source for every cut, so Spark compiles
    it once; the one-row side that carries the cut and the timestamp is data, so the
    second and third cuts compile no code at all."""
    from pyspark.sql import functions as F

    from pipelines.stream import batch_constants

    start = datetime(2026, 11, 1, 10, tzinfo=UTC)
    events = _events(spark, start).localCheckpoint()

    def split(cut: datetime) -> Any:
        cut_us = int(cut.timestamp() * 1_000_000)
        return events.crossJoin(batch_constants(spark, cut_us, cut_us + 7)).select(
            "event_id", (F.unix_micros("event_time") < F.col("_late_cut")).alias("late"),
            "ingest_time")

    frames = [split(c) for c in (start, start + timedelta(minutes=2), start + timedelta(minutes=5))]
    lates, compiled = [], []
    for frame in frames:
        before = _compiles(spark)
        lates.append({r["event_id"] for r in frame.collect() if r["late"]})
        compiled.append(_compiles(spark) - before)
    assert lates == [set(), {"e0", "e1"}, {"e0", "e1", "e2", "e3", "e4"}]
    assert compiled[1:] == [0, 0], f"compiles per cut: {compiled}"
    # the batch's time (collected as the session's UTC wall time, naive)
    assert [{r["ingest_time"].replace(tzinfo=UTC) for r in f.collect()} for f in frames] == [
        {c + timedelta(microseconds=7)} for c in (start, start + timedelta(minutes=2),
                                                  start + timedelta(minutes=5))]
    codes = {_stage_code(f, "unix_micros") for f in frames}  # the plans as they ran
    assert len(codes) == 1, "the cut is written into the batch projection's code"


def _hotspot_compiles_huge_methods(spark: Any) -> bool:
    """Whether this JVM JIT-compiles methods over HotSpot's 8,000-byte limit."""
    jvm = spark._jvm
    bean_class = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(bean_class)
    return str(bean.getVMOption("DontCompileHugeMethods").getValue()) == "false"


def test_no_whole_stage_method_of_the_validation_runs_interpreted(spark: Any) -> None:
    """The validation stage (47 ordered rules over 11 fields) generated one method of
    about 13,000 bytes (it still does with Spark's own expressions reading the fields, the
    fallback without the jar); a stream task calls it once for its whole partition, so where
    HotSpot left it interpreted (its default for methods over 8,000 bytes), it was 40 %
    of the stream's JVM samples (JFR). The project's JVMs compile such methods
    (:func:`pipelines.spark.jit_option`), so the stage runs as one compiled method: no
    whole-stage subtree of the validation may be longer than HotSpot compiles yet short
    enough to run, and the verdicts stay those of the contract."""
    from pyspark.sql import functions as F

    from features.validation import with_verdict
    from pipelines.spark import HOTSPOT_HUGE_METHOD

    limit = int(spark.conf.get("spark.sql.codegen.hugeMethodLimit"))
    now = datetime(2026, 11, 1, 10, tzinfo=UTC)
    good = (b'{"event_id":"e1","event_type":"view","event_time":"2026-11-01T09:59:00Z",'
            b'"user_id":"u1","session_id":"s1","item_id":"i1","category_id":"c1",'
            b'"region":"UK","device":"web"}')
    rows = [(b"u1", good, "t", 0, 0, now), (b"u1", b'{"event_id": 7}', "t", 0, 1, now),
            (b"u1", b"not json", "t", 0, 2, now)]
    raw = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, "
                                      "offset bigint, timestamp timestamp")
    checked = with_verdict(raw, now=F.col("timestamp"))
    assert [(r["offset"], r["reason"]) for r in checked.orderBy("offset").collect()] == [
        (0, None), (1, "wrong_type"), (2, "invalid_json")]

    stages = checked._jdf.queryExecution().debug().codegenToSeq()
    sizes = [int(stages.apply(i)._3().maxMethodCodeSize()) for i in range(stages.length())]
    assert sizes, "the validation generated no whole-stage code"
    compiled = _hotspot_compiles_huge_methods(spark)
    huge = [s for s in sizes if HOTSPOT_HUGE_METHOD < s <= limit]
    assert not huge or compiled, (
        f"whole-stage methods of {huge} bytes run as generated, uncompiled by HotSpot "
        f"(limit {limit})")
    # with the project's defaults the stage is one whole-stage method, compiled
    assert max(sizes) <= limit and compiled


def test_the_validation_stage_is_small_enough_for_every_tier_of_the_jit(spark: Any) -> None:
    """With the contract-fields function, which evaluates the field rules itself, the
    validation stage's generated code fits HotSpot's defaults: no method over its 8,000-byte
    limit (the rules' flags as Spark expressions made it about 13,500, which C1's profiling
    tier could not compile: "out of virtual registers"), and no generated function of more
    than 32 arguments (the flags' shared rule number became one of 98, which C2 refuses:
    "unsupported calling sequence"; with both refusing, the stage ran interpreted). The
    reader of Spark's own expressions, the fallback without the jar, is still the large one."""
    import re

    from pyspark.sql import functions as F

    from features.validation import with_verdict
    from pipelines.spark import HOTSPOT_HUGE_METHOD

    now = datetime(2026, 11, 1, 10, tzinfo=UTC)
    raw = spark.createDataFrame([(b"u1", b'{"event_id": 7}', "t", 0, 1, now)],
                                "key binary, value binary, topic string, partition int, "
                                "offset bigint, timestamp timestamp")

    def stage(reader: str, check_key: bool) -> tuple[int, int]:
        checked = with_verdict(raw, now=F.col("timestamp"), check_key=check_key,
                               reader=reader)  # type: ignore[arg-type]
        assert [(r["reason"], r["field"]) for r in checked.collect()] == [
            ("wrong_type", "event_id")]
        stages = checked._jdf.queryExecution().debug().codegenToSeq()
        size = max(int(stages.apply(i)._3().maxMethodCodeSize()) for i in range(stages.length()))
        arity = max((len([a for a in m.group(1).split(",") if a.strip()])
                     for i in range(stages.length())
                     for m in re.finditer(r"private \w+ \w+\(([^)]*)\)", stages.apply(i)._2())),
                    default=0)
        return size, arity

    for check_key in (False, True):
        size, arity = stage("jvm", check_key)
        assert size <= HOTSPOT_HUGE_METHOD and arity <= 32, (size, arity)
    size, arity = stage("variant", False)
    assert size > HOTSPOT_HUGE_METHOD or arity > 32, "the fallback reader's stage is large"


def test_a_streams_validation_is_compiled_once_and_its_batches_keep_their_timestamp(
        make_settings: Any, kafka_broker: Any, redis_client: Any, spark: Any,
        tmp_path: Path) -> None:
    """Five or six micro-batches of one query (40 records at most, a fifth of them
    malformed):

    * the batch's timestamp (``current_timestamp()``, which Spark turns into a literal of
      each batch's plan) is written into none of the query's generated code: it was, in
      the validation's stage of about 4,500 lines, so Spark compiled that stage (Janino,
      then the JIT) again every batch;
    * after the first two batches a batch compiles nothing: its own values (the late cut,
      the timestamp) come as data, not code;
    * each quarantined record's ``ingest_time`` is its batch's timestamp, as Spark's
      offset log keeps it (a replay of the batch sees the same).
    """
    import json

    from pipelines import offline_store
    from pipelines.infra.jvm_jar import CONTRACT_FIELDS_CLASS
    from pipelines.stream import (
        BatchProcessor,
        StreamOptions,
        query_checkpoint,
        start_stream,
    )
    from pipelines.stream_metrics import MetricsRecorder
    from tests.integration.test_stream import Sent, _event, _ms, create_topic, produce

    topic = f"codegen.{tmp_path.name[-20:]}".replace("_", "-")
    settings: Settings = make_settings(
        kafka_topic_events=topic, kafka_topic_rt_tiles=f"{topic}.tiles",
        data_dir=str(tmp_path / "data"), stream_max_offsets_per_trigger=40)
    create_topic(settings, topic)
    now = datetime.now(UTC)
    produce(settings, [Sent(f"u{i % 7}".encode(),
                            b"{not json" if i % 5 == 3 else
                            _event(f"cg-{i}", now, user=f"u{i % 7}", item=f"i{i % 5}"),
                            _ms(now)) for i in range(200)])

    compiled: list[int] = []

    class Counting(BatchProcessor):
        def __call__(self, batch: Any, batch_id: int) -> None:
            before = _compiles(spark)
            super().__call__(batch, batch_id)
            compiled.append(_compiles(spark) - before)

    checkpoint = query_checkpoint(settings)
    recorder = MetricsRecorder(settings)
    processor = Counting(settings, checkpoint, recorder)
    query = start_stream(spark, settings, StreamOptions(stop="available_now"), recorder,
                         processor)
    try:
        assert query.awaitTermination(300), "the stream did not drain its 200 records"
    finally:
        processor.close()
    assert query.exception() is None
    assert len(compiled) >= 5, compiled  # 40 a batch, split over the partitions
    last_batch = len(compiled) - 1

    def timestamp_ms(batch_id: int) -> int:
        text = (Path(checkpoint) / "offsets" / str(batch_id)).read_text()
        return int(json.loads(text.splitlines()[1])["batchTimestampMs"])

    last = query._jsq.streamingQuery().lastExecution()
    stages = last.debug().codegenToSeq()
    codes = [str(stages.apply(i)._2()) for i in range(stages.length())]
    # the contract-fields function is Spark's call of the class's method, in the stage's code
    assert any(CONTRACT_FIELDS_CLASS in code for code in codes), "no validation stage"
    literal = f"{timestamp_ms(last_batch) * 1000}L"
    assert not [code for code in codes if literal in code], "the batch's timestamp is in the code"
    assert max(compiled[2:]) == 0, f"compiles per batch: {compiled}"

    quarantine = spark.read.parquet(offline_store.quarantine_path(settings))
    stamps = {(int(r["batch_id"]), r["ingest_time"].replace(tzinfo=UTC))
              for r in quarantine.select("batch_id", "ingest_time").collect()}
    assert quarantine.count() == 40
    assert stamps == {(b, datetime.fromtimestamp(timestamp_ms(b) / 1000, UTC))
                      for b, _ in stamps}
    assert {b for b, _ in stamps} == set(range(len(compiled)))
