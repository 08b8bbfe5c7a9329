"""The micro-batch stream's deduplication: which records are copies of one already read.

An event's identity is its ``event_id`` and ``event_time``
(:data:`features.events.EVENT_IDENTITY`): a copy (a producer's retry, a replayed range)
carries both. Invalid records are keyed by their Kafka coordinates, so none is a copy.
Two operators can keep the ids (``stream_dedup``):

* ``bucketed`` (the default): shopstream's ``EventDedup`` (a Java ``StatefulProcessor``
  for Spark's ``transformWithState``, built into shopstream's jar,
  :mod:`pipelines.infra.jvm_jar`). Ids are grouped by a few seconds of their event time
  and a shard of their id; a group's ids are one list in the state, read once and
  appended to once by a batch that touches the group, and each group expires as a whole
  through a timer, so a batch reads only the groups that are due. Its cost per batch
  follows the batch, not the state (:data:`StateLayout` for checkpoints started before).
* ``spark``: Spark's ``dropDuplicatesWithinWatermark``, which reads every id in the state
  every micro-batch to find the expired ones, so its cost grows with rate x retention
  (docs/streaming-performance.md, "The dedup at a steady state").

Both remember an id at least ``stream_dedup_retention_seconds`` of processing time after
the batch that read it, and both drop the same copies within it. Their checkpoints'
state differs: a query keeps the operator it was started with (:func:`check_checkpoint`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pipelines.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "BUCKET_SECONDS",
    "SHARDS",
    "LIST_BUCKET_SECONDS",
    "LIST_SHARDS",
    "NEW_LAYOUT",
    "DedupSettingError",
    "StateLayout",
    "check_checkpoint",
    "dedup_key",
    "dedup_watermark_delay",
    "deduplicated",
    "stamped",
    "written_operator",
]

DEDUP_KEY = "_dedup_key"
_GROUP = "_dedup_group"
BUCKET_SECONDS = 60
"""Event-time width of a group in the ``bigint`` and ``string`` layouts: a copy falls in
its original's bucket, since it has the same event time. Part of the checkpoint's state,
like :data:`SHARDS`."""
SHARDS = 64
"""Groups per bucket in those layouts, by a hash of the id: enough to spread a minute's ids
over the shuffle's partitions. Changing it (or the bucket) sends a copy to another group
than its original, so it is a constant, not a setting: a new value needs a new checkpoint."""
LIST_BUCKET_SECONDS = 5
"""Event-time width of a group in the ``lists`` layout. A batch reads the list of every
group it touches whole, so a live batch reads about this many seconds of ids per bucket it
touches (at 2,000 events/s, 10,000; a minute's were 120,000), while a drain's batch of a
million records, some 17 minutes of event time at 1,000 events/s, touches about 6,400
groups, one read and one append each instead of a million of each."""
LIST_SHARDS = 32
"""Groups per bucket in the ``lists`` layout (see :data:`SHARDS`)."""
StateLayout = Literal["lists", "bigint", "string"]
"""How a ``bucketed`` checkpoint keeps its ids, part of its state. ``lists``: a group is a
:data:`LIST_BUCKET_SECONDS` bucket times :data:`LIST_SHARDS` plus the shard (negative for
the records that are never copies: ``EventDedup`` keeps no state for them), its ids one
``ListState``. ``bigint``: a minute times :data:`SHARDS` plus the shard, its ids a
``MapState`` of id to true, as checkpoints started before the lists kept them; ``string``:
those groups as ``<minute>/<shard>`` and ``k/<n>``, as checkpoints started before the
numbers kept them. A checkpoint resumes with its layout."""
NEW_LAYOUT: StateLayout = "lists"
"""The layout a new checkpoint starts with. Lists because a map costs two RocksDB calls
through JNI per record (``containsKey``, ``updateValue``), over half of the read phase's CPU;
a list, one read and one append per group a batch touches (docs/streaming-performance.md,
"The dedup's ids as lists"). Groups are numbers because ``transformWithState``
sorts each batch by its group: a long sorts whole by its 8-byte prefix (a radix sort),
where a string's prefix (its first 8 bytes, all one minute's) left most comparisons to the
full row comparator (docs/streaming-performance.md, "A dedup that expires by the
bucket")."""


class DedupSettingError(RuntimeError):
    """``stream_dedup`` cannot run here: the checkpoint's state is the other operator's, or
    the session has no shopstream jar for the bucketed one."""


def dedup_key() -> Column:
    """A valid event's identity (:data:`features.events.EVENT_IDENTITY`) as the dedup's key:
    its event time, then its id.

    ``e:`` + the event time in epoch microseconds as 16 hex digits + ``/`` + ``event_id``.
    The fixed-width time first makes RocksDB's keys (Spark stores the row's bytes, so a
    string key sorts by its text) follow the event time whatever the ids look like, so a
    batch's new ids land near each other and the ids that expire together lie together.
    With random ids (a UUIDv4, say) and the id alone as the key, Spark's dedup's updates
    took about 40 % more task time at a steady state; with the time first, as much as with
    sequential ids (docs/streaming-performance.md, "The dedup's key"). A copy of an event
    (a producer's retry, a replayed range) carries the same id and time, so it is caught
    as before; a record that reuses an id with another event time is a different event,
    as in the Real-time path's ``dropDuplicates(event_id, event_time)`` and the backfill.
    """
    from pyspark.sql import functions as F

    micros = F.lpad(F.hex(F.unix_micros(F.col("event_time"))), 16, "0")
    return F.concat(F.lit("e:"), micros, F.lit("/"), F.col("event_id"))


def dedup_watermark_delay(settings: Settings) -> str:
    """The ``withWatermark`` delay that makes Spark's dedup remember an id for the retention.

    Half of it, in milliseconds (an odd number of seconds halves exactly): Spark stores an
    id with an expiry of its batch's time + the delay and evicts it once the watermark
    (the newest batch's time - the delay) passes that, so an id is remembered until a
    batch ``stream_dedup_retention_seconds`` younger has run, and evicted in the batch
    after it. With the whole retention as the delay it lived twice as long, and the
    eviction pass, which reads every state row in every batch, read twice as many.
    """
    return f"{settings.stream_dedup_retention_seconds * 500} milliseconds"


def stamped(raw: DataFrame, settings: Settings, columns: tuple[str, ...]) -> DataFrame:
    """Kafka's rows (``columns``), and for Spark's dedup (``stream_dedup=spark``) with
    ``ingest_time``, the micro-batch's timestamp (``current_timestamp()``, kept in the
    offset log, so a replay sees the same), and a watermark on it.

    Spark's dedup needs that watermark: a batch's own timestamp is never behind it, so
    no row is ever dropped as late. The timestamp and its watermark come first, on the
    raw rows: the timestamp is a literal in the generated code, and the watermark
    operator ends the stage that holds it, so the (large) validation projection after
    it has no per-batch literal and is compiled once, not every batch. The watermark
    operator does not keep its input's partitioning (Spark 4.3's
    ``EventTimeWatermarkExec``), so after the repartition Spark shuffled every batch a
    second time for the dedup.

    The ``bucketed`` dedup needs no watermark, and nothing would end that stage: the
    literal sat in the validation's own code. There the batch adds ``ingest_time``
    itself, with the same value (:func:`pipelines.stream.batch_constants`).
    """
    from pyspark.sql import functions as F

    if settings.stream_dedup != "spark":
        return raw.select(*columns)
    rows = raw.select(*columns, F.current_timestamp().alias("ingest_time"))
    return rows.withWatermark("ingest_time", dedup_watermark_delay(settings))


def deduplicated(checked: DataFrame, settings: Settings,
                 layout: StateLayout = NEW_LAYOUT) -> DataFrame:
    """``checked`` (rows of :func:`stamped` with their verdict) without the copies, by the
    operator ``stream_dedup`` names; the same columns. ``layout``: the ``bucketed``
    operator's state layout, the one its checkpoint holds (:func:`check_checkpoint`)."""
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import functions as F

    valid = F.col("reason").isNull()
    coordinates = F.concat_ws("/", F.lit("k"), F.col("topic"), F.col("partition").cast("string"),
                              F.col("offset").cast("string"))
    keyed = checked.withColumn(DEDUP_KEY, F.when(valid, dedup_key()).otherwise(coordinates))
    if settings.stream_dedup == "spark":
        partitions = int(checked.sparkSession.conf.get("spark.sql.shuffle.partitions"))
        return keyed.repartition(partitions, DEDUP_KEY).dropDuplicatesWithinWatermark([DEDUP_KEY])

    spark = checked.sparkSession
    if not _has_event_dedup(spark):
        raise DedupSettingError(
            "SHOPSTREAM_STREAM_DEDUP=bucketed needs shopstream's jar (its EventDedup class), "
            "which this Spark session does not have: install a JDK (`make setup`) so it is "
            "built, or start a new checkpoint with SHOPSTREAM_STREAM_DEDUP=spark")
    seconds, shards = (LIST_BUCKET_SECONDS, LIST_SHARDS) if layout == "lists" else (
        BUCKET_SECONDS, SHARDS)
    shard = F.pmod(F.xxhash64(F.col("event_id")), F.lit(shards))
    bucket = F.floor(F.unix_seconds(F.col("event_time")) / seconds)
    invalid_shard = F.pmod(F.col("offset"), F.lit(shards))
    if layout == "string":
        group = F.when(valid, F.concat(bucket.cast("string"), F.lit("/"), shard.cast("string"))
                       ).otherwise(F.concat(F.lit("k/"), invalid_shard.cast("string")))
    else:
        group = F.when(valid, bucket * shards + shard).otherwise(-1 - invalid_shard)
        group = group.cast("bigint")
    grouped = keyed.withColumn(_GROUP, group)
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    jdf = jvm.shopstream.EventDedup.apply(
        grouped._jdf, DEDUP_KEY, _GROUP, settings.stream_dedup_retention_seconds * 1000,
        layout == "lists")
    return SparkDataFrame(jdf, spark).drop(_GROUP)


def _has_event_dedup(spark: object) -> bool:
    """Whether the session's JVM has ``EventDedup``."""
    from pipelines.infra.jvm_jar import EVENT_DEDUP_CLASS, session_has_class

    return session_has_class(spark, EVENT_DEDUP_CLASS)


def check_checkpoint(spark: object, checkpoint: str, settings: Settings) -> StateLayout:
    """Refuse to start a query whose checkpoint's dedup state is the other operator's;
    return the ``bucketed`` operator's state layout to run it with (:data:`StateLayout`).

    Spark would otherwise fail the first batch with a state-schema error that does not
    say which setting to change. Reads the operator's metadata that Spark 4 writes in
    ``state/0/_metadata`` (nothing there: a new checkpoint, nothing to check) and, for the
    ``bucketed`` operator, its layout in the state's schema (``state/0/_stateSchema``).
    """
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    state = f"{checkpoint.rstrip('/')}/state/0"
    path = jvm.org.apache.hadoop.fs.Path(f"{state}/_metadata")
    fs = path.getFileSystem(conf)
    if not fs.exists(path):
        return NEW_LAYOUT
    written = written_operator([status.getPath().getName() for status in fs.listStatus(path)])
    if written is None:
        # a job killed while Spark was writing the first batch's metadata: that batch was
        # never committed and runs again, with this job's operator
        return NEW_LAYOUT
    if written != settings.stream_dedup:
        raise DedupSettingError(
            f"the checkpoint {checkpoint} was written with SHOPSTREAM_STREAM_DEDUP={written}; "
            f"this job is set to {settings.stream_dedup}. Set it back to {written}, or start "
            "a new checkpoint (a new SHOPSTREAM_CHECKPOINT_DIR) to change the operator")
    if written == "spark":
        return NEW_LAYOUT
    return _written_layout(jvm, fs, f"{state}/_stateSchema/default")


def written_operator(names: list[str]) -> Literal["spark", "bucketed"] | None:
    """The dedup operator whose metadata a checkpoint's ``state/0/_metadata`` folder holds,
    from the names in it; ``None`` when it holds neither's (yet).

    Spark writes a ``metadata`` file (v1) for ``dropDuplicatesWithinWatermark`` and a
    ``v2`` folder for ``transformWithState``. A job killed in the first batch can leave the
    folder empty, or with only a temporary file in it: that says nothing of the operator.
    """
    if "v2" in names:
        return "bucketed"
    if "metadata" in names:
        return "spark"
    return None


def _written_layout(jvm: object, fs: object, schemas: str) -> StateLayout:
    """The layout in the ``bucketed`` operator's state schema files (Spark writes each state
    variable's name and the schemas of its key and value there as JSON, in a binary frame):
    string groups, or a map's key (``userKey``, the ``bigint`` layout), or neither."""
    folder = jvm.org.apache.hadoop.fs.Path(schemas)  # type: ignore[attr-defined]
    if not fs.exists(folder):  # type: ignore[attr-defined]
        return NEW_LAYOUT
    string_group = f'"name":"{_GROUP}","type":"string"'.encode()
    map_key = b'"name":"userKey"'
    layout: StateLayout = NEW_LAYOUT
    for status in fs.listStatus(folder):  # type: ignore[attr-defined]
        if status.getPath().getName().startswith("."):  # Hadoop's checksums
            continue
        stream = fs.open(status.getPath())  # type: ignore[attr-defined]
        try:
            schema = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))  # type: ignore[attr-defined]
        finally:
            stream.close()
        if string_group in schema:
            return "string"
        if map_key in schema:
            layout = "bigint"
    return layout
