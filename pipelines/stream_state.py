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

    ss:v1:tiles:user:{user_id}               HASH  "{tile_start}" -> tile JSON, "_b" -> run:batch id
    ss:v1:tiles:item:{item_id}               HASH  "{tile_start}" -> tile JSON, "_b" -> run:batch id,
                                                   "_base" -> sums over the closed tiles
    ss:v1:tiles:sales:{item}|{cat}|{region}  HASH  "{tile_start}" -> tile JSON, "_b" -> run:batch id
    ss:v1:tiles:sales-by-tile:{tile_start}   HASH  "{item}|{cat}|{region}" -> [item, cat, region, units]
    ss:v1:stream:top-base                    HASH  units of the closed tiles per window (below)
    ss:v1:stream:run                         STRING the run id of the checkpoint writing the tiles
    ss:v1:stream:dirty:{kind}:{tile_start}   SET   entities touched while the clock was in that tile

Per micro-batch, one Spark job (no row goes to the driver): the batch's tiles
of all three kinds are folded in one pass per partition (:func:`keyed_rows`:
shopstream's ``TileFold`` in the JVM, or Spark's aggregation without its jar; the
rows of :func:`features.tiles.keyed_tiles`, the backfill's rules), partitioned by key
and handed to Python as Arrow batches (``mapInArrow``), and each executor
task, for its keys, pipelined by chunks:

1. reads the stored tiles of its keys with their ``_b`` marker: sales keys all
   of them (one ``HGETALL`` each); users and items, once a previous clock is known,
   their ``_base`` (:class:`pipelines.streaming.pyfeatures.UserBase`,
   :class:`~pipelines.streaming.pyfeatures.ItemBase`: the features over the closed
   tiles, see the top lists below) and open tiles, then the tiles the base moves
   over since its last batch (two ``HMGET``);
2. merges this batch's tiles in (:mod:`pipelines.streaming.pyfeatures`: sums, set
   unions, latest-wins) unless the marker says the batch is in already (a replay
   after a crash);
3. writes the changed tiles, drops those that left the 24h window and sets
   ``_b`` to the checkpoint's run id and the batch id (:func:`batch_marker`) -- one
   ``MULTI``/``EXEC`` per chunk, so a key is either fully updated or not at all;
4. finalizes the users' and items' features as of the batch's clock ``T``
   (the Python twin of :mod:`features.windows`) and writes them in Feast's layout.

The top lists are written by :func:`write_top_lists` (on the driver, beside the next batch). Summing every sales tile of the 24h
window each batch would cost more with every hour the stream has run (1,440
tiles per key at a one-minute slide), so it keeps a **base**: the units per
sales key over the window's *closed* tiles, those before the tile of
``previous clock - allowed lateness``, which no later batch can change (its
events would be late). A batch moves the base's range forward (adds the tiles
that closed, subtracts those that left the window: integer units, so exact) and
adds the few open tiles to it; the base and its range are replaced in one
``MULTI``/``EXEC``, so a replay finds the range done and changes nothing.

Values are full tiles, never increments, so writing them twice is harmless; the
marker only stops a replay from adding its deltas again. It names the checkpoint's
run (:meth:`BatchLog.run_id`) as well as the batch, because batch ids start again at
0 on a new checkpoint: with the batch id alone, a new checkpoint's batches were
taken for replays of every key an earlier one had reached a higher batch on, and
their events never reached those keys' tiles, until the batch ids caught up.

The keys have an owner (this job prunes them by event time) and, as a safety
net against an abandoned deployment, the ``online_ttl_seconds`` TTL refreshed
on every write. Key builders are here until they move to
:mod:`features.online_keys`; they use its joiner and encoding.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

import orjson

from features import online_keys
from pipelines.redis_batch import CommandBatch, as_dict
from pipelines.streaming import pyfeatures as pyf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.streaming.tile_fold import TileFolder

__all__ = [
    "spilled_bytes",
    "BatchLog",
    "BatchRecord",
    "SnapshotMark",
    "SNAPSHOT_MARK",
    "TileStore",
    "PassConfig",
    "USER",
    "ITEM",
    "SALES",
    "MARKER_FIELD",
    "tiles_key",
    "dirty_key",
    "DIRTY_TTL_SECONDS",
    "sales_tile_key",
    "top_base_key",
    "keyed_rows",
    "update_batches",
    "write_top_lists",
    "release",
]

log = logging.getLogger(__name__)

SNAPSHOT_MARK = "snapshot"
"""Batch-log marker name of a feature snapshot that was appended."""
MARKER_FIELD = "_b"
"""Hash field holding the id of the last micro-batch applied to a key."""
_CHUNK = 500
"""Keys per pipelined round trip."""


# ---------------------------------------------------------------- batch log
@dataclass(frozen=True)
class SnapshotMark:
    """The latest feature snapshot the stream asked for (:mod:`pipelines.streaming.snapshot`).

    Attributes
    ----------
    tile
        ``tile_start`` (epoch seconds) of the clock when it was asked for; the next
        one is due when the clock enters a later tile.
    first
        First tile of the entities it covers: those touched while the clock was in
        ``[first, tile)``; ``None`` for the starting mark, which covers nothing.
    batch_id
        The batch that asked for it: the name of its done-marker in the batch log
        (:meth:`BatchLog.mark`), so a process that starts after a crash redoes it.
    """

    tile: int
    first: int | None = None
    batch_id: int | None = None


@dataclass(frozen=True)
class BatchRecord:
    """What batch ``b`` leaves for batch ``b + 1``.

    Attributes
    ----------
    clock_us
        The event-time clock after the batch: the largest ``event_time``
        accepted so far (epoch microseconds), ``None`` before any event.
    snapshot
        The latest feature snapshot asked for, ``None`` before the first batch with events.
    """

    batch_id: int
    clock_us: int | None
    snapshot: SnapshotMark | None = None

    @property
    def clock(self) -> datetime | None:
        if self.clock_us is None:
            return None
        return datetime.fromtimestamp(self.clock_us / 1_000_000, tz=UTC)

    def to_json(self) -> str:
        mark = self.snapshot
        return json.dumps({"batch_id": self.batch_id, "clock_us": self.clock_us,
                           "snapshot_tile": mark.tile if mark else None,
                           "snapshot_from": mark.first if mark else None,
                           "snapshot_batch": mark.batch_id if mark else None})

    @classmethod
    def from_json(cls, text: str) -> BatchRecord:
        doc = json.loads(text)
        tile = doc.get("snapshot_tile")
        mark = (SnapshotMark(int(tile), doc.get("snapshot_from"), doc.get("snapshot_batch"))
                if tile is not None else None)
        return cls(int(doc["batch_id"]), doc.get("clock_us"), mark)


class BatchLog:
    """Per-batch JSON records in ``<checkpoint>/clock/``, via Hadoop's FileSystem (any URI).

    Runs on the driver (``foreachBatch`` functions run there).
    """

    def __init__(self, spark: SparkSession, checkpoint: str, *, retain: int = 100) -> None:
        jvm = spark._jvm  # type: ignore[attr-defined]
        assert jvm is not None
        # the classes are looked up once, by full name: ``jvm.org.apache...`` resolves
        # each dotted part in a round trip, the package ones by a failed class search
        # through every jar (about 1.3 ms per path, several paths per batch)
        self._path_class = getattr(jvm, "org.apache.hadoop.fs.Path")
        self._io_utils = getattr(jvm, "org.apache.commons.io.IOUtils")
        self._conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        self.root = checkpoint.rstrip("/") + "/clock"
        self._offsets = checkpoint.rstrip("/") + "/offsets"
        self.retain = retain
        self._run_id: str | None = None

    def _path(self, batch_id: int) -> Any:
        return self._path_class(f"{self.root}/{batch_id}")

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def read(self, batch_id: int) -> BatchRecord | None:
        """The record of ``batch_id``, or ``None`` when there is none."""
        if batch_id < 0:
            return None
        text = self._read_text(self._path(batch_id))
        return None if text is None else BatchRecord.from_json(text)

    def batch_timestamp_ms(self, batch_id: int) -> int:
        """The batch's timestamp (epoch ms) from Spark's offset log of the checkpoint: what
        ``current_timestamp()`` is in that batch's plan, the same when a replay runs it again.

        Read here rather than put in the stream's plan, where Spark writes it into the
        generated code of the stage that holds it as a number literal: a new class and a
        new JIT compile of that stage every batch (see :func:`pipelines.stream.batch_constants`).
        """
        path = self._path_class(f"{self._offsets}/{batch_id}")
        text = self._read_text(path)
        if text is None:
            raise RuntimeError(f"Spark's offset log has no entry for batch {batch_id} "
                               f"({self._offsets}/{batch_id}), which it writes before the batch runs")
        for line in text.splitlines():  # a version line ("v1"), the metadata, the offsets
            if line.startswith("{") and '"batchTimestampMs"' in line:
                return int(json.loads(line)["batchTimestampMs"])
        raise RuntimeError(f"no batchTimestampMs in Spark's offset log entry {self._offsets}/"
                           f"{batch_id}: a format this job does not know")

    def source_topics(self) -> set[str] | None:
        """The Kafka topics of the latest entry of Spark's offset log (its third and later
        lines, one JSON object per source, keyed by topic); ``None`` for a checkpoint no
        query has run on yet."""
        offsets = self._path_class(self._offsets)
        fs = self._fs(offsets)
        if not fs.exists(offsets):
            return None
        ids = [int(name) for name in (status.getPath().getName()
                                      for status in fs.listStatus(offsets)) if name.isdigit()]
        text = self._read_text(self._path_class(f"{self._offsets}/{max(ids)}")) if ids else None
        if text is None:
            return None
        topics: set[str] = set()
        for line in text.splitlines()[2:]:
            source = json.loads(line) if line.startswith("{") else None
            if isinstance(source, dict):
                topics.update(source)
        return topics

    def _read_text(self, path: Any) -> str | None:
        """The UTF-8 text of the file ``path``, or ``None`` when there is none."""
        fs = self._fs(path)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            data = self._io_utils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode("utf-8")

    def _write_text(self, path: Any, text: str, *, overwrite: bool) -> None:
        """Write ``text`` to ``path``; without ``overwrite`` an existing file is an error."""
        out = self._fs(path).create(path, overwrite)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()

    def latest_before(self, batch_id: int) -> BatchRecord | None:
        """The record of ``batch_id - 1``; if missing, the newest older one still kept."""
        record = self.read(batch_id - 1)
        if record is not None or batch_id <= 0:
            return record
        root = self._path_class(self.root)
        fs = self._fs(root)
        if not fs.exists(root):
            return None
        ids = sorted(
            (int(s.getPath().getName()) for s in fs.listStatus(root)
             if s.getPath().getName().isdigit() and int(s.getPath().getName()) < batch_id),
            reverse=True,
        )
        return self.read(ids[0]) if ids else None

    def run_id(self) -> str:
        """An id of this checkpoint, made on first use and kept in it (``clock/run``).

        Batch ids start again at 0 on a new checkpoint (a wiped one, or a new
        location), so anything the stream names by batch id outside the checkpoint
        -- the staged feature snapshots in the offline store -- is named by
        ``(run id, batch id)``: a snapshot staged by an earlier checkpoint's batch 7
        is never taken for this one's.
        """
        if self._run_id is None:
            path = self._path_class(f"{self.root}/run")
            stored = self._read_text(path)
            if stored is not None:
                self._run_id = stored.strip()
            else:
                import uuid

                run = uuid.uuid4().hex
                self._write_text(path, run, overwrite=False)  # never replaces one: the id stays
                self._run_id = run
        return self._run_id

    def _mark_path(self, name: str, batch_id: int) -> Any:
        return self._path_class(f"{self.root}/{name}-{batch_id}.done")

    def marked(self, name: str, batch_id: int) -> bool:
        """Whether :meth:`mark` ran for ``(name, batch_id)`` (a side effect already done)."""
        path = self._mark_path(name, batch_id)
        return bool(self._fs(path).exists(path))

    def mark(self, name: str, batch_id: int) -> None:
        """Record that the side effect ``name`` of ``batch_id`` is done (an empty file)."""
        path = self._mark_path(name, batch_id)
        self._fs(path).create(path, True).close()

    def write(self, record: BatchRecord) -> None:
        """Write (or overwrite: a replay writes the same content) and prune old records."""
        path = self._path(record.batch_id)
        fs = self._fs(path)
        self._write_text(path, record.to_json(), overwrite=True)
        if record.batch_id >= self.retain:
            gone = record.batch_id - self.retain
            old = [self._path(gone)]
            if record.snapshot is None or record.snapshot.batch_id != gone:
                # the latest snapshot's marker stays: a restart checks it
                old.append(self._mark_path(SNAPSHOT_MARK, gone))
            for path in old:
                if fs.exists(path):
                    fs.delete(path, False)

    def unmark(self, name: str, batch_id: int) -> None:
        """Remove a marker that no restart will check any more."""
        path = self._mark_path(name, batch_id)
        fs = self._fs(path)
        if fs.exists(path):
            fs.delete(path, False)


# -------------------------------------------------------------------- keys
def tiles_key(kind: str, entity: str) -> str:
    """Redis hash of one key's tiles (``kind``: user, item or sales)."""
    return online_keys.key("tiles", kind, online_keys.encode_part(entity))


def sales_tile_key(tile_start: int) -> str:
    """Hash of one tile's sales: sales key (``item|category|region``) -> ``[item, cat, region, units]``."""
    return online_keys.key("tiles", "sales-by-tile", str(int(tile_start)))


def stream_run_key() -> str:
    """String: the run id (:meth:`BatchLog.run_id`) of the checkpoint that last wrote tiles."""
    return online_keys.key("stream", "run")


def top_base_key() -> str:
    """Hash of the top lists' base: units per sales key over the window's closed tiles."""
    return online_keys.key("stream", "top-base")


DIRTY_TTL_SECONDS = 24 * 3600
"""TTL of the per-tile sets of touched entities (snapshots read them within a slide)."""


def dirty_key(kind: str, generation: int) -> str:
    """Set of entities of ``kind`` touched while the clock was in tile ``generation``."""
    return online_keys.key("stream", "dirty", kind, str(int(generation)))


# ---------------------------------------------------------- checkpoints
def spilled_bytes(frame: DataFrame) -> int:
    """Bytes of a ``localCheckpoint()`` frame's blocks held on disk rather than in memory.

    Why: the job holds each micro-batch in memory once (``localCheckpoint``) and every
    sink reads that copy. A batch larger than the JVM's storage memory goes to disk in
    part, serialized on the way out and again on each read: in the drain's profile at a
    2 GB heap and 1M-record batches that was a twentieth of the executors' samples, and
    the drains ran a fifth slower than with a 4 GB heap (docs/streaming-performance.md,
    "The batch's copy on disk"). 0 for a frame that is not a checkpoint.
    """
    plan = frame._jdf.queryExecution().analyzed()  # type: ignore[attr-defined]
    if plan.getClass().getSimpleName() != "LogicalRDD":
        return 0
    rdd_id = plan.rdd().id()
    infos = frame.sparkSession.sparkContext._jsc.sc().getRDDStorageInfo()  # type: ignore[attr-defined]
    return sum(int(info.diskSize()) for info in infos if info.id() == rdd_id)


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
    open_from: int | None = None
    """First tile (epoch s) this batch or a later one may still change:
    ``tile_of(previous clock - allowed lateness)``; ``None``: every tile is open."""
    run: str = ""
    """The checkpoint's run id (:meth:`BatchLog.run_id`): whose batch ids these are."""

    @property
    def current(self) -> int:
        return pyf.tile_of(self.as_of_us, self.slide)

    @property
    def cutoff(self) -> int:
        """Tiles at or before it have left every window as of the clock."""
        return self.current - self.long_window


def _emit_schema() -> Any:
    """Schema of what the pass yields: nothing, but ``mapInArrow`` needs one. A type, not
    DDL text, which PySpark would parse in the JVM every batch."""
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField("view", StringType()), StructField("value", StringType())])


def update_batches(batches: Iterator[Any], *, cfg: PassConfig) -> Iterator[Any]:
    """``mapInArrow`` body: one partition of :func:`keyed_rows` -> Redis; yields nothing.

    Per key (users, items, sales keys ``item|category|region``), pipelined by
    chunks: read the stored tiles and marker, merge this batch's tiles unless the
    marker says they are in already, write the changed tiles, drop the expired
    ones and set the marker in one ``MULTI``/``EXEC``; then finalize users and
    items as of the clock and write them in Feast's layout, and item metadata
    from the item rows.
    """
    with _cyclic_gc_paused():
        deltas: dict[tuple[str, str], list[dict[str, Any]]] = {}
        metadata = pyf.ItemMetadata()
        for batch in batches:
            for row in batch.to_pylist():
                kind = row["kind"]
                deltas.setdefault((kind, row["key"]), []).append(pyf.TILE_OF_ROW[kind](row))
                if kind == ITEM:
                    metadata.add(row)
        _update(deltas, metadata.rows(), cfg)
    yield from ()


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one pass, then restore it.

    The pass builds hundreds of thousands of small dicts and lists (tiles, rows,
    encoded hashes) and keeps a batch's tiles alive to the end, so the collector's
    generation thresholds fire over and over, each older generation scanning every
    tile held so far; none of it is cyclic (reference counting frees it). On a
    200k-event batch of a large store the pass took about a fifth less CPU without
    it (4.1-5.7 s against 5.1-7.8 s a batch, four batches each in alternating
    processes). The worker is reused by the next task, so the collector's state is
    put back.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def batch_marker(cfg: PassConfig) -> str:
    """The ``_b`` value of a key this batch merged into: ``<run id>:<batch id>``."""
    return f"{cfg.run}:{cfg.batch_id}" if cfg.run else str(cfg.batch_id)


def merged_already(marker: bytes | str | None, cfg: PassConfig) -> bool:
    """Whether a key's ``_b`` says this batch is in its tiles already (this is a replay).

    Only a marker of the same run can: another checkpoint's batch ids count from 0
    too, and say nothing about this one's. A marker without a run (written before
    markers named one) is compared by batch id, as it was then, so a replay right
    after an upgrade still adds nothing twice.
    """
    if marker is None:
        return False
    text = marker.decode() if isinstance(marker, bytes) else marker
    run, sep, batch = text.rpartition(":")
    if sep and run != cfg.run:
        return False
    return int(batch) >= cfg.batch_id


BASE_FIELD = "_base"
"""Hash field of an item's :class:`pipelines.streaming.pyfeatures.ItemBase`."""
_META_FIELDS = (MARKER_FIELD.encode(), BASE_FIELD.encode())


def _item_reads(cfg: PassConfig) -> tuple[dict[str, tuple[int, int]], list[int]]:
    """The base's ranges after this batch and the open tiles (read every batch) of an item."""
    ranges = _windows_of_base(cfg)
    end_long = ranges[pyf.LONG_WINDOW][1]
    return ranges, list(_tile_range(end_long, cfg.current + cfg.slide, cfg.slide))


def _moves(old: Mapping[str, tuple[int, int]] | None, ranges: Mapping[str, tuple[int, int]],
           slide: int) -> tuple[dict[str, list[int]], dict[str, list[int]], set[str]] | None:
    """How a base (item or top lists) covering ``old`` moves to ``ranges``: the tiles to
    add to and remove from each window, and the windows to empty first (their old range
    is behind the new one: add it all); ``None`` when it must be rebuilt from every
    tile (none yet, or a range moved back, as after a checkpoint reset)."""
    if old is None:
        return None
    add: dict[str, list[int]] = {}
    sub: dict[str, list[int]] = {}
    reset: set[str] = set()
    for w, (a2, b2) in ranges.items():
        a, b = old.get(w, (0, 0))
        if a2 < a or b2 < b:
            return None
        if a2 >= b:
            reset.add(w)
            add[w], sub[w] = list(_tile_range(a2, b2, slide)), []
        else:
            add[w] = list(_tile_range(b, b2, slide))
            sub[w] = list(_tile_range(a, a2, slide))
    return add, sub, reset


Base = pyf.ItemBase | pyf.UserBase
"""The ``_base`` of a user's or an item's tiles."""


def _new_base(kind: str, ranges: Mapping[str, tuple[int, int]], cfg: PassConfig) -> Base:
    if kind == USER:
        return pyf.UserBase(ranges, last_items_n=cfg.last_items_n)
    return pyf.ItemBase(ranges)


def _stored_base(kind: str, raw: bytes | None, cfg: PassConfig) -> Base | None:
    """The base as stored, or ``None`` when there is none to move (a key whose tiles
    were written before it had a base, or a user's kept for another ``last_items_n``)."""
    if raw is None:
        return None
    if kind == USER:
        base = pyf.UserBase.from_json(raw)
        return base if base.n == cfg.last_items_n else None
    return pyf.ItemBase.from_json(raw)


def _rebuilt(kind: str, tiles: Mapping[int, Mapping[str, Any]],
             ranges: Mapping[str, tuple[int, int]], cfg: PassConfig) -> Base:
    base = _new_base(kind, ranges, cfg)
    for w, (a, b) in ranges.items():
        base.add_all(w, [tiles[start] for start in sorted(t for t in tiles if a <= t < b)])
    return base


def _update(deltas: Mapping[tuple[str, str], list[dict[str, Any]]],
            metadata: list[dict[str, Any]], cfg: PassConfig) -> None:
    """Merge, write and finalize per chunk of keys.

    Sales keys read all their tiles. Users and items, once the clock of a previous
    batch is known, read only their base and open tiles, plus the tiles the base
    moves over since its last batch (a second round trip, or all tiles when the base
    must be rebuilt).
    """
    import redis

    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from pipelines import online_writer

    as_of = pyf.from_us(cfg.as_of_us)
    cutoff = cfg.cutoff
    ranges, open_starts = _item_reads(cfg)
    open_fields = [str(t) for t in open_starts]
    client = redis.Redis(**cfg.redis_kwargs)
    try:
        for chunk in _chunks(deltas.items(), _CHUNK):
            based = [cfg.open_from is not None and kind != SALES for (kind, _), _ in chunk]
            names = [tiles_key(kind, key) for (kind, key), _ in chunk]
            reads = CommandBatch(client)
            for name, item in zip(names, based, strict=True):
                if item:
                    reads.add("HMGET", name, *_META_FIELDS, *open_fields)
                else:
                    reads.add("HGETALL", name)
            stored = reads.execute()
            # items: the base as stored, and what moving it needs (a second round trip)
            bases: dict[int, Base | None] = {}
            plans: dict[int, Any] = {}
            for i, item in enumerate(based):
                if not item:
                    continue
                base = _stored_base(chunk[i][0][0], stored[i][1], cfg)
                plan = _moves(base.ranges if base is not None else None, ranges, cfg.slide)
                bases[i], plans[i] = base, plan
                if plan is None:
                    reads.add("HGETALL", names[i])
                else:
                    moved = sorted({t for w in plan[0] for t in (*plan[0][w], *plan[1][w])})
                    reads.add("HMGET", names[i], MARKER_FIELD, *map(str, moved))
                    plans[i] = (plan, moved)
            second = dict(zip(sorted(bases), reads.execute(), strict=True)) if bases else {}
            users: list[dict[str, Any]] = []
            items: list[dict[str, Any]] = []
            sales_tiles: set[int] = set()
            dirty: dict[str, list[str]] = {}
            tx = CommandBatch(client)
            for i, ((kind, key), batch_tiles) in enumerate(chunk):
                redis_key = names[i]
                base = None
                write_base = False
                if i in bases:
                    values = stored[i]
                    marker = values[0]
                    tiles = {t: orjson.loads(v) for t, v in zip(open_starts, values[2:],
                                                                 strict=True) if v is not None}
                    if plans[i] is None:  # rebuild from every tile
                        mapping = as_dict(second[i])
                        for f in _META_FIELDS:
                            mapping.pop(f, None)
                        every = {int(f): orjson.loads(v) for f, v in mapping.items()}
                        base = _rebuilt(kind, every, ranges, cfg)
                        expired = [str(t) for t in every if t <= cutoff]
                    else:
                        (add, sub, reset), moved = plans[i]
                        found = {t: orjson.loads(v) for t, v in zip(moved, second[i][1:],
                                                                    strict=True) if v is not None}
                        base = bases[i]
                        assert base is not None
                        for w in ranges:
                            if w in reset:
                                base.reset(w)
                            for t in add[w]:
                                if t in found:
                                    base.add(w, found[t])
                            for t in sub[w]:
                                if t in found:
                                    base.remove(w, found[t])
                        # tiles that left the 24h window: the removed ones, or after
                        # a jump past the old range, everything before the new one
                        gone = (_tile_range(base.ranges[pyf.LONG_WINDOW][0],
                                            ranges[pyf.LONG_WINDOW][0], cfg.slide)
                                if pyf.LONG_WINDOW in reset else sub[pyf.LONG_WINDOW])
                        expired = [str(t) for t in gone]
                    write_base = base.ranges != ranges or plans[i] is None
                    base.ranges = dict(ranges)
                else:
                    mapping = as_dict(stored[i])
                    marker = mapping.pop(MARKER_FIELD.encode(), None)
                    mapping.pop(BASE_FIELD.encode(), None)
                    tiles = {int(f): orjson.loads(v) for f, v in mapping.items()}
                    expired = [str(t) for t in tiles if t <= cutoff]
                merging = bool(batch_tiles) and not merged_already(marker, cfg)
                changed: dict[str, bytes] = {}
                if merging:
                    merge = pyf.MERGE[kind]
                    for delta in batch_tiles:
                        start = int(delta["tile_start"])
                        if start <= cutoff:
                            continue  # already outside every window as of the clock
                        old = tiles.get(start)
                        tiles[start] = (delta if old is None
                                        else merge(old, delta, last_items_n=cfg.last_items_n))
                        changed[str(start)] = orjson.dumps(tiles[start])
                if merging or write_base:
                    if expired:
                        tx.add("HDEL", redis_key, *expired)
                    fields: dict[str, Any] = dict(changed)
                    if merging:
                        fields[MARKER_FIELD] = batch_marker(cfg)
                    if write_base and base is not None:
                        fields[BASE_FIELD] = base.to_json()
                    tx.add("HSET", redis_key, *chain.from_iterable(fields.items()))
                    tx.add("EXPIRE", redis_key, cfg.ttl)
                if merging:
                    if kind == SALES:
                        for start_s in changed:
                            tile = tiles[int(start_s)]
                            tx.add("HSET", sales_tile_key(int(start_s)), key, orjson.dumps(
                                [tile["item_id"], tile["category_id"], tile["region"],
                                 int(tile["units"])]))
                            sales_tiles.add(int(start_s))
                    else:
                        dirty.setdefault(kind, []).append(key)
                if base is not None:
                    opened = [tiles[t] for t in sorted(tiles) if t >= ranges[pyf.LONG_WINDOW][1]]
                    rows = users if kind == USER else items
                    rows.append(base.finalize(key, opened, as_of, slide_seconds=cfg.slide))
                elif kind == USER:
                    live = [t for start, t in tiles.items() if start > cutoff]
                    users.append(pyf.finalize_user(key, live, as_of, slide_seconds=cfg.slide,
                                                   last_items_n=cfg.last_items_n))
                elif kind == ITEM:
                    live = [t for start, t in tiles.items() if start > cutoff]
                    items.append(pyf.finalize_item(key, live, as_of, slide_seconds=cfg.slide))
            for start in sales_tiles:
                tx.add("EXPIRE", sales_tile_key(start), cfg.ttl)
            for kind, keys in dirty.items():
                tx.add("SADD", dirty_key(kind, cfg.current), *keys)
                tx.add("EXPIRE", dirty_key(kind, cfg.current), cfg.dirty_ttl)
            tx.execute_transaction()
            if users:
                online_writer.write_entity_rows(client, USER_ACTIVITY, users, ttl_seconds=cfg.ttl)
            if items:
                online_writer.write_entity_rows(client, ITEM_STATS, items, ttl_seconds=cfg.ttl)
        if metadata:
            online_writer.write_item_metadata(client, metadata, ttl_seconds=cfg.ttl)
    finally:
        client.close()


_RANGE_FIELD = b"_range"


def _windows_of_base(cfg: PassConfig) -> dict[str, tuple[int, int]]:
    """Per window, the tiles ``[first, end)`` the base covers after this batch: the
    window's tiles as of the clock that are closed (before ``cfg.open_from``)."""
    current = cfg.current
    first = {w: current - seconds + cfg.slide for w, seconds in pyf.WINDOW_SECONDS.items()}
    closed_end = min(first.values()) if cfg.open_from is None else min(cfg.open_from,
                                                                      current + cfg.slide)
    return {w: (first[w], max(first[w], closed_end)) for w in first}


def _tile_range(start: int, end: int, slide: int) -> range:
    return range(start, end, slide) if end > start else range(0)


def _apply_tile(units: dict[str, list[Any]], entries: Mapping[bytes, bytes], window: str,
                sign: int) -> None:
    for field, value in entries.items():
        item, cat, region, n = orjson.loads(value)
        entry = units.get(field.decode("utf-8"))
        if entry is None:
            entry = units[field.decode("utf-8")] = [item, cat, region,
                                                    dict.fromkeys(pyf.WINDOW_SECONDS, 0)]
        entry[3][window] += sign * int(n)


def write_top_lists(cfg: PassConfig, top_n: int) -> None:
    """Top sellers / trending of every scope: the base plus the open tiles.

    The base (units per sales key over each window's closed tiles) is moved to this
    batch's range, reading only the tiles that closed or left the window since, and
    replaced with its new range in one transaction; the open tiles (from
    ``cfg.open_from`` to the clock, about ``allowed lateness / slide`` of them) are
    added on top. Tiles that left the 24h window are deleted.
    """
    import redis

    from pipelines import online_writer

    client = redis.Redis(**cfg.redis_kwargs)
    try:
        stored = client.hgetall(top_base_key())
        old_raw = stored.pop(_RANGE_FIELD, None)
        old = ({w: (int(r[0]), int(r[1])) for w, r in orjson.loads(old_raw).items()}
               if old_raw is not None else None)
        units: dict[str, list[Any]] = {}
        for field, value in stored.items():
            item, cat, region, per_window = orjson.loads(value)
            units[field.decode("utf-8")] = [item, cat, region, per_window]
        new = _windows_of_base(cfg)
        plan = _moves(old, new, cfg.slide)
        if plan is None:  # no base yet, or one from a range moved back: from zero
            plan = ({w: list(_tile_range(a, b, cfg.slide)) for w, (a, b) in new.items()},
                    {w: [] for w in new}, set(new))
        add, sub, reset = plan
        for entry in units.values():
            for w in reset:
                entry[3][w] = 0
        changed = sorted({t for w in new for t in (*add[w], *sub[w])})
        open_tiles = {w: list(_tile_range(end, cfg.current + cfg.slide, cfg.slide))
                      for w, (_, end) in new.items()}
        wanted = sorted({*changed, *(t for ts in open_tiles.values() for t in ts)})
        with client.pipeline(transaction=False) as pipe:
            for start in wanted:
                pipe.hgetall(sales_tile_key(start))
            tiles = dict(zip(wanted, pipe.execute(), strict=True))
        if changed or old != new:
            for w in new:
                for start in add[w]:
                    _apply_tile(units, tiles[start], w, +1)
                for start in sub[w]:
                    _apply_tile(units, tiles[start], w, -1)
            units = {k: e for k, e in units.items() if any(e[3].values())}
            left = sub[pyf.LONG_WINDOW]  # tiles that left the 24h window
            with client.pipeline(transaction=True) as tx:
                tx.delete(top_base_key())
                tx.hset(top_base_key(), mapping={
                    _RANGE_FIELD: orjson.dumps({w: list(r) for w, r in new.items()}),
                    **{k: orjson.dumps(e) for k, e in units.items()}})
                tx.expire(top_base_key(), cfg.ttl)
                if left:
                    tx.delete(*[sales_tile_key(t) for t in left])
                tx.execute()
        totals: dict[tuple[str, str, str], dict[str, int]] = {}
        for item, cat, region, per_window in units.values():
            totals[(item, cat, region)] = dict(per_window)
        for w, starts in open_tiles.items():
            for start in starts:
                for value in tiles[start].values():
                    item, cat, region, n = orjson.loads(value)
                    per_window = totals.setdefault((item, cat, region),
                                                   dict.fromkeys(pyf.WINDOW_SECONDS, 0))
                    per_window[w] += int(n)
        rows = pyf.rank_top_items(totals, pyf.from_us(cfg.as_of_us), top_n=top_n)
        if rows:
            online_writer.write_top_items(client, rows, top_n=top_n, prune=True)
    finally:
        client.close()


# -------------------------------------------------------------- the store
USER, ITEM, SALES = "user", "item", "sales"
"""Tile kinds (the ``kind`` part of :func:`tiles_key`)."""


def keyed_rows(events: DataFrame, *, slide_seconds: int, last_items_n: int,
               partitions: int, folder: TileFolder = "auto") -> DataFrame:
    """A batch's events -> :func:`features.tiles.keyed_tiles`' rows, hash-partitioned by
    (kind, key), folded by ``folder`` (:func:`pipelines.streaming.tile_fold.tiles`: by
    default shopstream's ``TileFold`` when the session has it, else Spark's aggregation).

    The role rows are partitioned by (kind, key) *before* they are folded, so that
    shuffle is the only one: every tile of a key is in one partition, which is what
    the per-key pass needs.
    """
    from pipelines.streaming.tile_fold import tiles

    return tiles(events, slide_seconds=slide_seconds, last_items_n=last_items_n,
                 partitions=partitions, folder=folder)


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

    def claim(self, run: str) -> str | None:
        """Record ``run`` as the checkpoint run writing the tiles; returns the run recorded
        before (``None``: none was), so a caller can tell when the tiles hold another's."""
        import redis

        client = redis.Redis(**self.redis_kwargs)
        try:
            previous = client.set(stream_run_key(), run, get=True)
        finally:
            client.close()
        return previous.decode() if isinstance(previous, bytes) else previous

    def config(self, batch_id: int, as_of_us: int, open_from: int | None = None,
               run: str = "") -> PassConfig:
        return PassConfig(self.redis_kwargs, batch_id, as_of_us, self.slide, self.long_window,
                          self.last_items_n, self.ttl, self.dirty_ttl, open_from, run)

    def apply(self, spark: SparkSession, events: DataFrame, *, batch_id: int, as_of_us: int,
              open_from: int | None = None, run: str = "") -> None:
        """Merge a batch into Redis and write the touched entities' features (one Spark job).

        ``open_from``: :attr:`PassConfig.open_from`; with it, users and items keep a base
        over their closed tiles (``None``: every tile is read). ``run``: the checkpoint's
        run id (:attr:`PassConfig.run`).
        """
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        rows = keyed_rows(events, slide_seconds=self.slide, last_items_n=self.last_items_n,
                          partitions=partitions)
        cfg = self.config(batch_id, as_of_us, open_from, run)
        rows.mapInArrow(partial(update_batches, cfg=cfg), _emit_schema()).write.format(
            "noop").mode("overwrite").save()

    def write_top_here(self, *, batch_id: int, as_of_us: int, open_from: int | None = None) -> None:
        """Recompute and replace every top list, in the calling process (the driver).

        What the stream runs beside the next micro-batch: the work is a few hundred
        Redis commands and a ranking in Python, which a one-task Spark job only
        delays (scheduling, a worker round trip). ``open_from``:
        :attr:`PassConfig.open_from` (``None`` reads every tile of the window).
        """
        write_top_lists(self.config(batch_id, as_of_us, open_from), self.top_n)
