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

    ss:v1:tiles:user:{user_id}      HASH  "{tile_start}" -> tile JSON, "_b" -> batch id
    ss:v1:tiles:item:{item_id}      HASH  "{tile_start}" -> tile JSON, "_b" -> batch id
    ss:v1:tiles:sales:{tile_start}  HASH  "{item}|{category}|{region}" -> tile JSON, "_b" -> batch id
    ss:v1:stream:dirty:{kind}:{tile_start}  SET  entities touched while the clock was in that tile

Per micro-batch, all in Spark (no row goes to the driver):

1. read the stored tiles of the keys the batch touches (one ``HGETALL`` per
   key, pipelined, per partition) with their ``_b`` marker;
2. merge: stored tiles + this batch's tile deltas, unless the marker says the
   batch was already applied (a replay after a crash), with the merge rules
   below (sums, set unions, latest-wins);
3. write back the changed tiles, drop tiles that left the 24h window, and set
   ``_b`` to the batch id -- one ``MULTI``/``EXEC`` per chunk of keys, so a
   key is either fully updated or not at all;
4. hand the merged tiles to :mod:`features.windows` to finalize the features
   as of the batch's clock ``T``.

Values are full tiles, never increments, so writing them twice is harmless;
the marker only stops a replay from adding its deltas a second time.

The keys have an owner (this job prunes them by event time) and, as a safety
net against an abandoned deployment, the ``online_ttl_seconds`` TTL refreshed
on every write. Key builders are here until they move to
:mod:`features.online_keys`; they use its joiner and encoding.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

from features import online_keys

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "BatchLog",
    "BatchRecord",
    "TileStore",
    "TileKind",
    "USER",
    "ITEM",
    "SALES",
    "MARKER_FIELD",
    "tiles_key",
    "dirty_key",
    "merge_user_tiles",
    "merge_item_tiles",
    "merge_sales_tiles",
    "tile_to_json",
    "tile_from_json",
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


def dirty_key(kind: str, generation: int) -> str:
    """Set of entities of ``kind`` touched while the clock was in tile ``generation``."""
    return online_keys.key("stream", "dirty", kind, str(int(generation)))


# ------------------------------------------------------------- merge rules
def _merge_sums(names: Iterable[str], kinds: dict[str, str]) -> list[Column]:
    from pyspark.sql import functions as F

    return [F.sum(n).cast(kinds.get(n, "bigint")).alias(n) for n in names]


def _carry(tiles: DataFrame, carry: Iterable[str]) -> list[Column]:
    """``max`` of extra columns (flags) carried through a merge."""
    from pyspark.sql import functions as F

    return [F.max(c).alias(c) for c in carry if c in tiles.columns]


def merge_user_tiles(tiles: DataFrame, *, last_items_n: int, carry: Iterable[str] = ()) -> DataFrame:
    """Merge rows of :func:`features.tiles.user_tiles` that share ``(user_id, tile_start)``.

    The tile of the union of two event sets, from the two tiles: counts and
    spend add, item sets unite, category weights add per category, the latest
    event time wins, the last viewed items are re-ranked over both lists.
    """
    from pyspark.sql import functions as F

    from features.tiles import USER_TILE_COLUMNS, latest_distinct_items, sum_category_weights

    merged = tiles.groupBy("user_id", "tile_start").agg(
        *_merge_sums(("views", "carts", "purchases"), {}),
        F.sum("spend").cast("double").alias("spend"),
        F.array_distinct(F.flatten(F.collect_list("items_viewed"))).alias("items_viewed"),
        sum_category_weights(F.flatten(F.collect_list("category_weights"))).alias(
            "category_weights"),
        F.max("last_event_time").alias("last_event_time"),
        latest_distinct_items(F.flatten(F.collect_list("last_viewed")), last_items_n).alias(
            "last_viewed"),
        *_carry(tiles, carry),
    )
    return merged.select(*USER_TILE_COLUMNS, *[c for c in carry if c in tiles.columns])


def merge_item_tiles(tiles: DataFrame, *, carry: Iterable[str] = ()) -> DataFrame:
    """Merge rows of :func:`features.tiles.item_tiles` that share ``(item_id, tile_start)``.

    Counts, units and revenue add; the category of the latest event wins (ties:
    the greatest category_id, as in the tile itself).
    """
    from pyspark.sql import functions as F

    from features.tiles import ITEM_TILE_COLUMNS

    merged = tiles.groupBy("item_id", "tile_start").agg(
        F.max_by("category_id", F.struct("category_time", "category_id")).alias("category_id"),
        F.max("category_time").alias("category_time"),
        *_merge_sums(("views", "carts", "purchases", "units"), {}),
        F.sum("revenue").cast("double").alias("revenue"),
        *_carry(tiles, carry),
    )
    return merged.select(*ITEM_TILE_COLUMNS, *[c for c in carry if c in tiles.columns])


def merge_sales_tiles(tiles: DataFrame, *, carry: Iterable[str] = ()) -> DataFrame:
    """Merge rows of :func:`features.tiles.sales_tiles` sharing item, category, region and tile."""
    from pyspark.sql import functions as F

    from features.tiles import SALES_TILE_COLUMNS

    merged = tiles.groupBy("item_id", "category_id", "region", "tile_start").agg(
        *_merge_sums(("purchases", "units"), {}),
        F.sum("revenue").cast("double").alias("revenue"),
        *_carry(tiles, carry),
    )
    return merged.select(*SALES_TILE_COLUMNS, *[c for c in carry if c in tiles.columns])


# ------------------------------------------------------------- tile codec
def tile_to_json(tiles: DataFrame, value_columns: Iterable[str]) -> Column:
    """The JSON stored in Redis for one tile row (microsecond timestamps)."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*value_columns), JSON_OPTIONS)


def tile_from_json(value: Column, schema: Any) -> Column:
    from pyspark.sql import functions as F

    return F.from_json(value, schema, JSON_OPTIONS)


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


def _read_partition(rows: Iterator[Any], *, redis_kwargs: dict[str, Any]) -> Iterator[tuple]:
    """(kind, key) rows -> (kind, key, field, value) rows of each key's hash (pipelined)."""
    import redis

    client = redis.Redis(**redis_kwargs)
    try:
        for chunk in _chunks(rows, _CHUNK):
            with client.pipeline(transaction=False) as pipe:
                for kind, entity in chunk:
                    pipe.hgetall(tiles_key(kind, entity))
                stored = pipe.execute()
            for (kind, entity), mapping in zip(chunk, stored, strict=True):
                for field, value in mapping.items():
                    yield kind, entity, field.decode("utf-8"), value.decode("utf-8")
    finally:
        client.close()


def _write_partition(rows: Iterator[Any], *, redis_kwargs: dict[str, Any], batch_id: int,
                     ttl_seconds: int, dirty_ttl_seconds: int, generation: int) -> None:
    """(kind, key, sets map, dels list, drop) rows -> one MULTI/EXEC per chunk of keys.

    Each key gets its changed tiles, loses its expired ones, records ``batch_id``
    and joins the dirty set of its kind for the next feature snapshot.
    """
    import redis

    client = redis.Redis(**redis_kwargs)
    try:
        for chunk in _chunks(rows, _CHUNK):
            with client.pipeline(transaction=True) as tx:
                for kind, entity, sets, dels, drop in chunk:
                    key = tiles_key(kind, entity)
                    if drop:
                        tx.delete(key)
                        continue
                    if dels:
                        tx.hdel(key, *dels)
                    mapping = dict(sets or {})
                    mapping[MARKER_FIELD] = str(batch_id)
                    tx.hset(key, mapping=mapping)
                    tx.expire(key, ttl_seconds)
                    if kind != SALES.name:
                        tx.sadd(dirty_key(kind, generation), entity)
                for kind in {row[0] for row in chunk if row[0] != SALES.name}:
                    tx.expire(dirty_key(kind, generation), dirty_ttl_seconds)
                tx.execute()
    finally:
        client.close()


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


# -------------------------------------------------------------- tile kinds
@dataclass(frozen=True)
class TileKind:
    """How one tile table maps onto Redis hashes.

    ``key`` is the column that names the hash, ``field`` the expression of the
    field inside it; ``value_columns`` go into the JSON.
    """

    name: str
    key: str
    value_columns: tuple[str, ...]

    def field_col(self) -> Column:
        from pyspark.sql import functions as F

        if self.name == "sales":
            return F.concat_ws("|", *[F.url_encode(F.col(c)) for c in
                                      ("item_id", "category_id", "region")])
        return F.col("tile_start").cast("string")

    def key_col(self) -> Column:
        from pyspark.sql import functions as F

        return F.col(self.key).cast("string")


def _kinds() -> tuple[TileKind, TileKind, TileKind]:
    from features.tiles import ITEM_TILE_COLUMNS, SALES_TILE_COLUMNS, USER_TILE_COLUMNS

    user = TileKind("user", "user_id", tuple(c for c in USER_TILE_COLUMNS
                                             if c not in ("user_id", "tile_start")))
    item = TileKind("item", "item_id", tuple(c for c in ITEM_TILE_COLUMNS
                                             if c not in ("item_id", "tile_start")))
    sales = TileKind("sales", "tile_start", tuple(c for c in SALES_TILE_COLUMNS
                                                  if c != "tile_start"))
    return user, item, sales


USER, ITEM, SALES = _kinds()


# -------------------------------------------------------------- the store
_CHANGED = "_changed"
"""Flag carried through the merge: the tile got a delta from this batch."""


@dataclass(frozen=True)
class MergedTiles:
    """Tiles after a batch, per kind, in :mod:`features.tiles` column order.

    Backed by persisted frames; call :meth:`release` once the features computed
    from them are written.
    """

    users: DataFrame
    items: DataFrame
    sales: DataFrame
    cached: tuple[DataFrame, ...]

    def release(self) -> None:
        for frame in self.cached:
            release(frame)


class TileStore:
    """Idempotent tile state in Redis for the streaming job (see the module docstring).

    Parameters
    ----------
    redis_kwargs
        :func:`pipelines.connections.redis_kwargs` (picklable; clients are built
        on the executors).
    slide_seconds, last_items_n, long_window_seconds
        Tile size, last-viewed list length and the longest window (tiles older
        than it, as of the clock, are dropped).
    ttl_seconds
        Safety-net TTL of every key, refreshed on write.
    dirty_ttl_seconds
        TTL of the sets of touched entities (read by the next feature snapshot).
    """

    def __init__(self, redis_kwargs: dict[str, Any], *, slide_seconds: int, last_items_n: int,
                 long_window_seconds: int, ttl_seconds: int,
                 dirty_ttl_seconds: int = 24 * 3600) -> None:
        self.redis_kwargs = redis_kwargs
        self.slide = slide_seconds
        self.last_items_n = last_items_n
        self.long_window = long_window_seconds
        self.ttl = ttl_seconds
        self.dirty_ttl = dirty_ttl_seconds

    def tile_of(self, ts_us: int) -> int:
        """``tile_start`` (epoch seconds) of a time in epoch microseconds."""
        step = self.slide * 1_000_000
        return (ts_us - ts_us % step) // 1_000_000

    # -- reading
    def _read(self, spark: SparkSession, keys: DataFrame) -> DataFrame:
        """(kind, key) -> (kind, key, field, value), from Redis, on the executors."""
        reader = partial(_read_partition, redis_kwargs=self.redis_kwargs)
        rdd = keys.rdd.mapPartitions(lambda rows: reader((r[0], r[1]) for r in rows))
        return spark.createDataFrame(rdd, "kind string, key string, field string, value string")

    def dirty_entities(self, spark: SparkSession, kind: str, generations: Iterable[int]) -> DataFrame:
        """(kind, key) rows: the entities in the dirty sets of ``generations`` (read on an executor)."""
        sets = [(kind, dirty_key(kind, g)) for g in sorted(set(generations))]
        if not sets:
            return spark.createDataFrame([], "kind string, key string")
        members = partial(_members_partition, redis_kwargs=self.redis_kwargs)
        rdd = spark.sparkContext.parallelize(sets, 1).mapPartitions(members)
        return spark.createDataFrame(rdd, "kind string, key string").distinct()

    # -- the batch update
    def apply(self, spark: SparkSession, *, batch_id: int, as_of_us: int,
              prev_as_of_us: int | None, user_delta: DataFrame, item_delta: DataFrame,
              sales_delta: DataFrame, extra_keys: DataFrame | None = None) -> MergedTiles:
        """Merge a batch's tile deltas into Redis; return the merged tiles of every touched key.

        Parameters
        ----------
        batch_id
            The micro-batch id (the idempotency marker).
        as_of_us, prev_as_of_us
            The clock after this batch and after the previous one (epoch µs).
        user_delta, item_delta, sales_delta
            This batch's tiles (:mod:`features.tiles` output over its on-time events).
        extra_keys
            More (kind, key) rows to read without changing them (the dirty
            entities of a feature snapshot); their tiles are returned too.

        Returns
        -------
        MergedTiles
            Per kind, every stored tile of the touched keys merged with the
            batch's deltas. Sales hold every tile of the 24h window (top sellers
            rank over all of them).
        """
        from pyspark.sql import functions as F

        current = self.tile_of(as_of_us)
        cutoff = current - self.long_window  # tiles at or before it have left every window
        prev = self.tile_of(prev_as_of_us) if prev_as_of_us is not None else None
        kinds = (USER, ITEM, SALES)
        deltas = {USER.name: user_delta.localCheckpoint(eager=False),
                  ITEM.name: item_delta.localCheckpoint(eager=False),
                  SALES.name: sales_delta.localCheckpoint(eager=False)}
        cached: list[DataFrame] = list(deltas.values())

        # 1. the keys to read: touched entities, every sales tile of the window, extras
        keys = deltas[USER.name].select(F.lit(USER.name).alias("kind"),
                                        USER.key_col().alias("key"))
        keys = keys.unionByName(deltas[ITEM.name].select(F.lit(ITEM.name).alias("kind"),
                                                         ITEM.key_col().alias("key")))
        keys = keys.unionByName(
            spark.range(cutoff + self.slide, current + 1, self.slide, numPartitions=1).select(
                F.lit(SALES.name).alias("kind"), F.col("id").cast("string").alias("key")))
        if extra_keys is not None:
            keys = keys.unionByName(extra_keys.select("kind", "key"))
        keys = keys.distinct()

        # 2. the stored state, read once (one HGETALL per key, pipelined) and kept
        stored = self._read(spark, keys).localCheckpoint(eager=True)
        cached.append(stored)
        applied = F.broadcast(stored.where(
            (F.col("field") == MARKER_FIELD) & (F.col("value").cast("bigint") >= F.lit(batch_id))
        ).select("kind", F.col("key").alias("_applied")))

        merged: dict[str, DataFrame] = {}
        writes: DataFrame | None = None
        for kind in kinds:
            delta = deltas[kind.name]
            schema = delta.select(*kind.value_columns).schema
            tiles = stored.where((F.col("kind") == F.lit(kind.name))
                                 & (F.col("field") != F.lit(MARKER_FIELD)))
            decoded = tile_from_json(F.col("value"), schema).alias("t")
            if kind is SALES:
                parsed = tiles.select(F.col("key").cast("bigint").alias("tile_start"), decoded)
                parsed = parsed.select("tile_start", "t.*")
            else:
                parsed = tiles.select(F.col("key").alias(kind.key),
                                      F.col("field").cast("bigint").alias("tile_start"), decoded)
                parsed = parsed.select(kind.key, "tile_start", "t.*")
            # a replayed batch finds its own marker: its deltas are in Redis already
            fresh = delta.join(
                applied.where(F.col("kind") == F.lit(kind.name)).select("_applied"),
                on=kind.key_col() == F.col("_applied"), how="left_anti")
            combined = parsed.select(*delta.columns, F.lit(False).alias(_CHANGED)).unionByName(
                fresh.select(*delta.columns, F.lit(True).alias(_CHANGED)))
            if kind is USER:
                all_tiles = merge_user_tiles(combined, last_items_n=self.last_items_n,
                                             carry=(_CHANGED,))
            elif kind is ITEM:
                all_tiles = merge_item_tiles(combined, carry=(_CHANGED,))
            else:
                all_tiles = merge_sales_tiles(combined, carry=(_CHANGED,))
            all_tiles = all_tiles.localCheckpoint(eager=False)
            cached.append(all_tiles)
            merged[kind.name] = all_tiles.drop(_CHANGED)
            rows = self._write_rows(kind, all_tiles, cutoff)
            writes = rows if writes is None else writes.unionByName(rows)

        # 3. write back; sales tiles that left the 24h window since the last batch go
        assert writes is not None
        if prev is not None and prev < current:
            lo = max(prev - self.long_window, cutoff - self.long_window)
            gone = spark.range(lo + self.slide, cutoff + 1, self.slide, numPartitions=1).select(
                F.lit(SALES.name).alias("kind"), F.col("id").cast("string").alias("key"),
                F.lit(None).cast("map<string,string>").alias("sets"),
                F.lit(None).cast("array<string>").alias("dels"), F.lit(True).alias("drop"))
            writes = writes.unionByName(gone)
        writer = partial(_write_partition, redis_kwargs=self.redis_kwargs, batch_id=batch_id,
                         ttl_seconds=self.ttl, dirty_ttl_seconds=self.dirty_ttl,
                         generation=current)
        writes.foreachPartition(writer)

        return MergedTiles(
            users=merged[USER.name],
            items=merged[ITEM.name],
            sales=merged[SALES.name].where(F.col("tile_start") > F.lit(cutoff)),
            cached=tuple(cached),
        )

    def _write_rows(self, kind: TileKind, all_tiles: DataFrame, cutoff: int) -> DataFrame:
        """One row per key that got a delta: its changed tiles (JSON), its expired tiles.

        (kind, key, sets map<field, json>, dels array<field>, drop false)
        """
        from pyspark.sql import functions as F

        changed = F.col(_CHANGED) & (F.col("tile_start") > F.lit(cutoff))
        entry = F.struct(kind.field_col().alias("field"),
                         tile_to_json(all_tiles, kind.value_columns).alias("value"))
        aggs = [
            F.max(F.col(_CHANGED)).alias("_touched"),
            F.map_from_entries(F.collect_list(F.when(changed, entry))).alias("sets"),
        ]
        if kind is SALES:
            aggs.append(F.lit(None).cast("array<string>").alias("dels"))
        else:
            expired = F.when(F.col("tile_start") <= F.lit(cutoff), kind.field_col())
            aggs.append(F.collect_list(expired).alias("dels"))
        grouped = all_tiles.groupBy(kind.key_col().alias("key")).agg(*aggs)
        return grouped.where("_touched").select(
            F.lit(kind.name).alias("kind"), "key", "sets", "dels", F.lit(False).alias("drop"))
