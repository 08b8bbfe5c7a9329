"""State the streaming job keeps outside Spark: the per-batch clock log and the tile store.

Two pieces, both written so that a replayed micro-batch changes nothing:

**Batch log** (:class:`BatchLog`). One small JSON record per micro-batch under the
query's checkpoint (``<checkpoint>/clock/<batch_id>``), written through Hadoop's
``FileSystem`` so a ``s3a://`` or ``hdfs://`` checkpoint works as well as a
local one. Batch ``b`` reads the record of ``b - 1`` (the event-time clock so
far) to decide which of its events are late; a replay of ``b`` after a crash
reads the same record and so makes the same decisions.

**Tile store** (:class:`TileStore`). The sliding windows are sums of tiles
(:mod:`features.tiles`); the stream keeps each entity's tiles in Redis::

    ss:v1:tiles:user:{user_id}               HASH  "{tile_start}" -> tile JSON, "_b" -> batch id
    ss:v1:tiles:item:{item_id}               HASH  "{tile_start}" -> tile JSON, "_b" -> batch id
    ss:v1:tiles:sales:{item}|{cat}|{region}  HASH  "{tile_start}" -> tile JSON, "_b" -> batch id
    ss:v1:tiles:sales-index                  SET   the sales keys (top lists read them all)
    ss:v1:stream:dirty:{kind}:{tile_start}   SET   entities touched while the clock was in that tile

Per micro-batch, one Spark job (no row goes to the driver): the batch's tiles
of all three kinds are computed in one aggregation
(:func:`features.tiles.keyed_tiles`, the backfill's rules), partitioned by key
and handed to Python as Arrow batches (``mapInArrow``), and each executor
task, for its keys, pipelined by chunks:

1. reads the stored tiles of its keys (one ``HGETALL`` each) with their ``_b`` marker;
2. merges this batch's tiles in (:mod:`pipelines.streaming.pyfeatures`: sums, set
   unions, latest-wins) unless the marker says the batch is in already (a replay
   after a crash);
3. writes the changed tiles, drops those that left the 24h window and sets
   ``_b`` to the batch id -- one ``MULTI``/``EXEC`` per chunk, so a key is
   either fully updated or not at all;
4. finalizes the users' and items' features as of the batch's clock ``T``
   (the Python twin of :mod:`features.windows`) and writes them in Feast's layout.

A second one-task job recomputes the top lists from every sales tile of the
window. Values are full tiles, never increments, so writing them twice is
harmless; the marker only stops a replay from adding its deltas again.

The keys have an owner (this job prunes them by event time) and, as a safety
net against an abandoned deployment, the ``online_ttl_seconds`` TTL refreshed
on every write. Key builders are here until they move to
:mod:`features.online_keys`; they use its joiner and encoding.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

import orjson

from features import online_keys
from pipelines.streaming import pyfeatures as pyf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BatchLog",
    "BatchRecord",
    "TileStore",
    "PassConfig",
    "USER",
    "ITEM",
    "SALES",
    "MARKER_FIELD",
    "tiles_key",
    "dirty_key",
    "sales_index_key",
    "keyed_rows",
    "update_batches",
    "top_partition",
    "release",
]

log = logging.getLogger(__name__)

MARKER_FIELD = "_b"
"""Hash field holding the id of the last micro-batch applied to a key."""
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}
"""Keep microseconds through JSON (Spark's default format stops at milliseconds)."""
_CHUNK = 500
"""Keys per pipelined round trip."""


# ---------------------------------------------------------------- batch log
@dataclass(frozen=True)
class BatchRecord:
    """What batch ``b`` leaves for batch ``b + 1``.

    Attributes
    ----------
    clock_us
        The event-time clock after the batch: the largest ``event_time``
        accepted so far (epoch microseconds), ``None`` before any event.
    snapshot_tile
        ``tile_start`` (epoch seconds) of the clock at the last feature snapshot.
    """

    batch_id: int
    clock_us: int | None
    snapshot_tile: int | None = None

    @property
    def clock(self) -> datetime | None:
        if self.clock_us is None:
            return None
        return datetime.fromtimestamp(self.clock_us / 1_000_000, tz=UTC)

    def to_json(self) -> str:
        return json.dumps({"batch_id": self.batch_id, "clock_us": self.clock_us,
                           "snapshot_tile": self.snapshot_tile})

    @classmethod
    def from_json(cls, text: str) -> BatchRecord:
        doc = json.loads(text)
        return cls(int(doc["batch_id"]), doc.get("clock_us"), doc.get("snapshot_tile"))


class BatchLog:
    """Per-batch JSON records in ``<checkpoint>/clock/``, via Hadoop's FileSystem (any URI).

    Runs on the driver (``foreachBatch`` functions run there).
    """

    def __init__(self, spark: SparkSession, checkpoint: str, *, retain: int = 100) -> None:
        jvm = spark._jvm  # type: ignore[attr-defined]
        assert jvm is not None
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        self.root = checkpoint.rstrip("/") + "/clock"
        self.retain = retain

    def _path(self, batch_id: int) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(f"{self.root}/{batch_id}")

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def read(self, batch_id: int) -> BatchRecord | None:
        """The record of ``batch_id``, or ``None`` when there is none."""
        if batch_id < 0:
            return None
        path = self._path(batch_id)
        fs = self._fs(path)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return BatchRecord.from_json(bytes(data).decode("utf-8"))

    def latest_before(self, batch_id: int) -> BatchRecord | None:
        """The record of ``batch_id - 1``; if missing, the newest older one still kept."""
        record = self.read(batch_id - 1)
        if record is not None or batch_id <= 0:
            return record
        root = self._jvm.org.apache.hadoop.fs.Path(self.root)
        fs = self._fs(root)
        if not fs.exists(root):
            return None
        ids = sorted(
            (int(s.getPath().getName()) for s in fs.listStatus(root)
             if s.getPath().getName().isdigit() and int(s.getPath().getName()) < batch_id),
            reverse=True,
        )
        return self.read(ids[0]) if ids else None

    def marked(self, name: str, batch_id: int) -> bool:
        """Whether :meth:`mark` ran for ``(name, batch_id)`` (a side effect already done)."""
        path = self._jvm.org.apache.hadoop.fs.Path(f"{self.root}/{name}-{batch_id}.done")
        return bool(self._fs(path).exists(path))

    def mark(self, name: str, batch_id: int) -> None:
        """Record that the side effect ``name`` of ``batch_id`` is done (an empty file)."""
        path = self._jvm.org.apache.hadoop.fs.Path(f"{self.root}/{name}-{batch_id}.done")
        self._fs(path).create(path, True).close()

    def write(self, record: BatchRecord) -> None:
        """Write (or overwrite: a replay writes the same content) and prune old records."""
        path = self._path(record.batch_id)
        fs = self._fs(path)
        out = fs.create(path, True)
        try:
            out.write(bytearray(record.to_json().encode("utf-8")))
        finally:
            out.close()
        if record.batch_id >= self.retain:
            gone = record.batch_id - self.retain
            for old in (self._path(gone),
                        self._jvm.org.apache.hadoop.fs.Path(f"{self.root}/snapshot-{gone}.done")):
                if fs.exists(old):
                    fs.delete(old, False)


# -------------------------------------------------------------------- keys
def tiles_key(kind: str, entity: str) -> str:
    """Redis hash of one key's tiles (``kind``: user, item or sales)."""
    return online_keys.key("tiles", kind, online_keys.encode_part(entity))


def sales_index_key() -> str:
    """Set of every sales key (``item|category|region``) that has tiles."""
    return online_keys.key("tiles", "sales-index")


def dirty_key(kind: str, generation: int) -> str:
    """Set of entities of ``kind`` touched while the clock was in tile ``generation``."""
    return online_keys.key("stream", "dirty", kind, str(int(generation)))


# ---------------------------------------------------------- checkpoints
def release(frame: DataFrame) -> None:
    """Free the blocks behind a ``localCheckpoint()`` frame (or a persisted one) now.

    The job checkpoints a few frames per micro-batch to keep plans small; left
    alone, their blocks would wait for a JVM garbage collection to be cleaned.
    """
    frame.unpersist()
    try:
        plan = frame._jdf.queryExecution().analyzed()  # type: ignore[attr-defined]
        if plan.getClass().getSimpleName() == "LogicalRDD":
            plan.rdd().unpersist(False)
    except Exception as exc:  # noqa: BLE001 - best effort; the ContextCleaner is the fallback
        log.debug("could not release a checkpointed frame: %s", exc)


# ----------------------------------------------------------- Redis glue
def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def _members_partition(rows: Iterator[Any], *, redis_kwargs: dict[str, Any]) -> Iterator[tuple]:
    """(kind, set key) rows -> (kind, member) rows (SSCAN, so big sets stream)."""
    import redis

    client = redis.Redis(**redis_kwargs)
    try:
        for kind, set_key in rows:
            for member in client.sscan_iter(set_key, count=1000):
                yield kind, member.decode("utf-8")
    finally:
        client.close()


# ------------------------------------------------- the per-partition pass
@dataclass(frozen=True)
class PassConfig:
    """Everything one executor pass needs (picklable)."""

    redis_kwargs: dict[str, Any]
    batch_id: int
    as_of_us: int
    slide: int
    long_window: int
    last_items_n: int
    ttl: int
    dirty_ttl: int
    emit: bool

    @property
    def current(self) -> int:
        return pyf.tile_of(self.as_of_us, self.slide)

    @property
    def cutoff(self) -> int:
        """Tiles at or before it have left every window as of the clock."""
        return self.current - self.long_window


def _encode(row: Mapping[str, Any]) -> str:
    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
        raise TypeError(type(value).__name__)

    return json.dumps(row, default=default, separators=(",", ":"))


_EMIT_SCHEMA = "view string, value string"
"""Schema of what the pass yields: (feature view or ``top_items``, row JSON)."""


def _emit_batch(rows: list[tuple[str, str]]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.string())],
        names=["view", "value"])


def update_batches(batches: Iterator[Any], *, cfg: PassConfig) -> Iterator[Any]:
    """``mapInArrow`` body: one partition of :func:`keyed_rows` -> Redis; yields snapshot rows.

    Per key (users, items, sales keys ``item|category|region``), pipelined by
    chunks: read the stored tiles and marker, merge this batch's tiles unless the
    marker says they are in already, write the changed tiles, drop the expired
    ones and set the marker in one ``MULTI``/``EXEC``; then finalize users and
    items as of the clock and write them in Feast's layout, and item metadata
    from the item rows. Rows with a null ``tile_start`` only name a key whose
    features are due (a snapshot). With ``cfg.emit`` it yields Arrow batches of
    ``(view, feature row JSON)``.
    """
    deltas: dict[tuple[str, str], list[dict[str, Any]]] = {}
    metadata = pyf.ItemMetadata()
    for batch in batches:
        for row in batch.to_pylist():
            kind = row["kind"]
            bucket = deltas.setdefault((kind, row["key"]), [])
            if row["tile_start"] is None:
                continue
            bucket.append(pyf.TILE_OF_ROW[kind](row))
            if kind == ITEM:
                metadata.add(row)
    for rows in _update(deltas, metadata.rows(), cfg):
        if rows:
            yield _emit_batch(rows)


def _update(deltas: Mapping[tuple[str, str], list[dict[str, Any]]],
            metadata: list[dict[str, Any]], cfg: PassConfig) -> Iterator[list[tuple[str, str]]]:
    """Merge, write and finalize per chunk of keys; yields each chunk's emitted rows."""
    import redis

    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from pipelines import online_writer

    as_of = pyf.from_us(cfg.as_of_us)
    cutoff = cfg.cutoff
    client = redis.Redis(**cfg.redis_kwargs)
    try:
        for chunk in _chunks(deltas.items(), _CHUNK):
            with client.pipeline(transaction=False) as pipe:
                for (kind, key), _ in chunk:
                    pipe.hgetall(tiles_key(kind, key))
                stored = pipe.execute()
            users: list[dict[str, Any]] = []
            items: list[dict[str, Any]] = []
            with client.pipeline(transaction=True) as tx:
                for ((kind, key), batch_tiles), mapping in zip(chunk, stored, strict=True):
                    marker = int(mapping.pop(MARKER_FIELD.encode(), b"-1"))
                    tiles = {int(f): orjson.loads(v) for f, v in mapping.items()}
                    if batch_tiles and marker < cfg.batch_id:
                        merge = pyf.MERGE[kind]
                        changed: dict[str, str] = {}
                        for delta in batch_tiles:
                            start = int(delta["tile_start"])
                            if start <= cutoff:
                                continue  # already outside every window as of the clock
                            old = tiles.get(start)
                            tiles[start] = (delta if old is None
                                            else merge(old, delta, last_items_n=cfg.last_items_n))
                            changed[str(start)] = orjson.dumps(tiles[start])
                        expired = [str(t) for t in tiles if t <= cutoff]
                        redis_key = tiles_key(kind, key)
                        if expired:
                            tx.hdel(redis_key, *expired)
                        tx.hset(redis_key, mapping={**changed, MARKER_FIELD: str(cfg.batch_id)})
                        tx.expire(redis_key, cfg.ttl)
                        if kind == SALES:
                            tx.sadd(sales_index_key(), key)
                        else:
                            dirty = dirty_key(kind, cfg.current)
                            tx.sadd(dirty, key)
                            tx.expire(dirty, cfg.dirty_ttl)
                    live = [t for start, t in tiles.items() if start > cutoff]
                    if kind == USER:
                        users.append(pyf.finalize_user(key, live, as_of, slide_seconds=cfg.slide,
                                                       last_items_n=cfg.last_items_n))
                    elif kind == ITEM:
                        items.append(pyf.finalize_item(key, live, as_of, slide_seconds=cfg.slide))
                tx.execute()
            if users:
                online_writer.write_entity_rows(client, USER_ACTIVITY, users, ttl_seconds=cfg.ttl)
            if items:
                online_writer.write_entity_rows(client, ITEM_STATS, items, ttl_seconds=cfg.ttl)
            if cfg.emit:
                yield [(USER_ACTIVITY.name, _encode(r)) for r in users] + [
                    (ITEM_STATS.name, _encode(r)) for r in items]
        if metadata:
            online_writer.write_item_metadata(client, metadata, ttl_seconds=cfg.ttl)
    finally:
        client.close()


def top_partition(_: Iterator[Any], *, cfg: PassConfig, top_n: int) -> Iterator[tuple[str, str]]:
    """Top sellers / trending of every scope from every sales tile of the window (one task).

    Sales keys whose tiles have all left the 24h window are deleted here. With
    ``cfg.emit`` it yields ``("top_items", row JSON)``.
    """
    import redis

    from pipelines import online_writer

    client = redis.Redis(**cfg.redis_kwargs)
    try:
        keys = [m.decode("utf-8") for m in client.sscan_iter(sales_index_key(), count=1000)]
        sales: list[dict[str, Any]] = []
        gone: list[str] = []
        for chunk in _chunks(keys, _CHUNK):
            with client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hgetall(tiles_key(SALES, key))
                stored = pipe.execute()
            for key, mapping in zip(chunk, stored, strict=True):
                mapping.pop(MARKER_FIELD.encode(), None)
                live = [orjson.loads(v) for f, v in mapping.items() if int(f) > cfg.cutoff]
                if live:
                    sales.extend(live)
                else:
                    gone.append(key)
        if gone:
            with client.pipeline(transaction=True) as tx:
                tx.delete(*[tiles_key(SALES, k) for k in gone])
                tx.srem(sales_index_key(), *gone)
                tx.execute()
        rows = pyf.top_items(sales, pyf.from_us(cfg.as_of_us), slide_seconds=cfg.slide,
                             top_n=top_n)
        if rows:
            online_writer.write_top_items(client, rows, top_n=top_n, prune=True)
        if cfg.emit:
            yield from (("top_items", _encode(r)) for r in rows)
    finally:
        client.close()


# -------------------------------------------------------------- the store
USER, ITEM, SALES = "user", "item", "sales"
"""Tile kinds (the ``kind`` part of :func:`tiles_key`)."""


def keyed_rows(events: DataFrame, *, slide_seconds: int, last_items_n: int,
               partitions: int, extra_keys: DataFrame | None = None) -> DataFrame:
    """A batch's events -> :func:`features.tiles.keyed_tiles`, hash-partitioned by (kind, key).

    The events are partitioned by (kind, key) *before* the aggregation, so the
    aggregation's shuffle is the only one: its output already holds every tile
    of a key in one partition, which is what the per-key pass needs.
    ``extra_keys`` (kind, key) rows join with null tiles (keys whose features
    are due without new events).
    """
    from pyspark.sql import functions as F

    from features.tiles import keyed_tiles

    rows = keyed_tiles(events, slide_seconds=slide_seconds, last_items_n=last_items_n,
                       partitions=partitions)
    if extra_keys is not None:
        rows = rows.unionByName(extra_keys.select("kind", "key"), allowMissingColumns=True)
        rows = rows.repartition(partitions, F.col("kind"), F.col("key"))
    return rows


class TileStore:
    """Idempotent tile state in Redis for the micro-batch job (see the module docstring).

    Parameters
    ----------
    redis_kwargs
        :func:`pipelines.connections.redis_kwargs` (picklable; clients are built
        on the executors).
    slide_seconds, last_items_n, top_n, long_window_seconds
        Tile size, last-viewed list length, top-list length, longest window.
    ttl_seconds
        Safety-net TTL of every key, refreshed on write.
    dirty_ttl_seconds
        TTL of the sets of touched entities (read by the next feature snapshot).
    """

    def __init__(self, redis_kwargs: dict[str, Any], *, slide_seconds: int, last_items_n: int,
                 long_window_seconds: int, ttl_seconds: int, top_n: int = 100,
                 dirty_ttl_seconds: int = 24 * 3600) -> None:
        self.redis_kwargs = redis_kwargs
        self.slide = slide_seconds
        self.last_items_n = last_items_n
        self.top_n = top_n
        self.long_window = long_window_seconds
        self.ttl = ttl_seconds
        self.dirty_ttl = dirty_ttl_seconds

    def tile_of(self, ts_us: int) -> int:
        """``tile_start`` (epoch seconds) of a time in epoch microseconds."""
        return pyf.tile_of(ts_us, self.slide)

    def config(self, batch_id: int, as_of_us: int, emit: bool) -> PassConfig:
        return PassConfig(self.redis_kwargs, batch_id, as_of_us, self.slide, self.long_window,
                          self.last_items_n, self.ttl, self.dirty_ttl, emit)

    def dirty_entities(self, spark: SparkSession, kind: str, generations: Iterable[int]) -> DataFrame:
        """(kind, key) rows: the entities in the dirty sets of ``generations`` (read on an executor)."""
        sets = [(kind, dirty_key(kind, g)) for g in sorted(set(generations))]
        if not sets:
            return spark.createDataFrame([], "kind string, key string")
        members = partial(_members_partition, redis_kwargs=self.redis_kwargs)
        rdd = spark.sparkContext.parallelize(sets, 1).mapPartitions(members)
        return spark.createDataFrame(rdd, "kind string, key string").distinct()

    def apply(self, spark: SparkSession, events: DataFrame, *, batch_id: int, as_of_us: int,
              extra_keys: DataFrame | None = None, emit: bool = False) -> Any:
        """Merge a batch into Redis and write the touched entities' features (one Spark job).

        Returns the ``(view, value)`` DataFrame of feature row JSON when ``emit``
        (checkpointed, so the pass runs once; the caller releases it), else ``None``.
        """
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        rows = keyed_rows(events, slide_seconds=self.slide, last_items_n=self.last_items_n,
                          partitions=partitions, extra_keys=extra_keys)
        out = rows.mapInArrow(partial(update_batches, cfg=self.config(batch_id, as_of_us, emit)),
                              _EMIT_SCHEMA)
        if not emit:
            out.write.format("noop").mode("overwrite").save()
            return None
        return out.localCheckpoint(eager=True)

    def write_top(self, spark: SparkSession, *, batch_id: int, as_of_us: int,
                  emit: bool = False) -> Any:
        """Recompute and replace every top list (one task); the rows RDD when ``emit``."""
        out = spark.sparkContext.parallelize([0], 1).mapPartitions(
            partial(top_partition, cfg=self.config(batch_id, as_of_us, emit), top_n=self.top_n))
        if not emit:
            out.foreach(lambda _: None)
            return None
        out = out.persist()
        out.count()
        return out
