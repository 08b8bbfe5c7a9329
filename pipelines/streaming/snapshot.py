"""The stream's feature snapshots: what serving read, appended to the offline store.

Once per slide (when the clock enters a new tile) the stream records, for every
user and item it touched since the previous snapshot, the feature row Redis holds
for it -- the row ``get_online_features`` returns, with its own ``event_timestamp``
(the clock of the batch that last wrote it) -- and every top sellers and trending
list with its as-of time, in the backfill's snapshot format
(:func:`pipelines.offline_store.write_snapshots`). So training reads exactly what
serving saw, and each row equals the backfill's recomputation as of its timestamp
(``shopstream verify`` checks the same values in Redis).

Why read Redis rather than finalize the entities again as of the clock: the
re-finalization was the slowest step of the stream (every entity touched in the
last slide, 10k+ at 1,000 events/s, read, finalized and rewritten inside one
micro-batch). Reading back what was written needs no tiles and no Spark state,
so it runs beside the stream (:class:`pipelines.streaming.online.OnlineFeatures`
submits it), not inside a batch. A row written by a later batch before the
snapshot reads it is simply that later row: a true "serving saw this" row, which
the next snapshot may record again (same entity and timestamp; Feast keeps the
latest ``created``).

The entities come from the per-tile sets of touched entities the micro-batch pass
keeps (:func:`pipelines.stream_state.dirty_key`). A reader process beside the driver
(:func:`_reader`, at a lower CPU priority) reads them and the entities' hashes,
pipelined. On a local store it writes the staged tables itself, with pyarrow
(:func:`stage_served`); on a remote one (``s3a://``) it hands the rows back as Arrow
tables and the driver gives them to Spark, which writes them with one short JVM task
per table in the background scheduler pool (:data:`pipelines.spark.BACKGROUND_POOL`).

Why not Spark tasks: the snapshot runs beside the micro-batches, on the same task
slots. Read by Python tasks on the executors it held both slots of ``local[2]`` for
seconds at each slide boundary (a Python worker per task, under contention), and the
micro-batch waited for them: probes at 1,000 events/s took 7-9 s there, 2-4 s
elsewhere. Read by one process it costs about 40 us per entity (6,000 users: 0.25 s
on an idle core) and the slots a fraction of a second. Why not a driver thread (as
before): see :func:`_reader`. The tables of one snapshot are in the driver's memory
while it is written: about 1 KB per touched entity, so 100,000 entities touched per
slide take about 100 MB.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime
from multiprocessing import get_context
from typing import TYPE_CHECKING, Any, TypeVar

from features import online_keys
from features.feast_layout import (
    ITEM_STATS,
    USER_ACTIVITY,
    ViewSpec,
    decode_timestamp,
    timestamp_field,
)
from pipelines import offline_store
from pipelines.settings import Settings
from pipelines.stream_state import ITEM, USER, dirty_key

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["served_rows", "served_top_rows", "served_tables", "arrow_schema", "arrow_table", "arrow_frame", "local_frame",
           "write_served_snapshot", "stage_served", "warm_reader", "staging_path", "view_schema", "TOP_SCHEMA", "STAGING"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_CHUNK = 1000
"""Entities per pipelined round trip."""

STAGING = "_stream_staging"
"""Directory beside the snapshot tables where the stream stages a snapshot."""
_SPARK_TYPES = {"int64": "bigint", "double": "double", "string": "string",
                "timestamp": "timestamp", "string_list": "array<string>",
                "double_list": "array<double>"}
TOP_SCHEMA = ("kind string, window string, category_id string, region string, item_id string, "
              "score double, rank int, event_timestamp timestamp")
"""DDL of the top-list snapshot rows (:data:`features.windows.TOP_ITEM_COLUMNS` minus ``created``)."""
_VIEWS = {USER: USER_ACTIVITY, ITEM: ITEM_STATS}
_VIEW_BY_NAME = {spec.name: spec for spec in _VIEWS.values()}


def view_schema(spec: ViewSpec) -> str:
    """DDL of a feature view's rows: join key, features, event timestamp."""
    cols = [f"{spec.join_key} string"]
    cols += [f"{name} {_SPARK_TYPES[kind]}" for name, kind in spec.features]
    cols.append("event_timestamp timestamp")
    return ", ".join(cols)


def served_rows(set_keys: Iterable[str], *, redis_kwargs: dict[str, Any], view: str
                ) -> Iterator[tuple[Any, ...]]:
    """The members of the touched-entity sets -> their rows as Redis holds them.

    Rows are tuples in :func:`view_schema` order. An entity in several sets is read
    once; one without a row (its key expired) is left out.
    """
    import redis

    spec = _VIEW_BY_NAME[view]
    ts_field = timestamp_field(spec.name)
    client = redis.Redis(**redis_kwargs)
    try:
        entities: set[str] = set()
        for set_key in set_keys:
            entities.update(m.decode("utf-8") for m in client.sscan_iter(set_key, count=1000))
        ordered = sorted(entities)
        for start in range(0, len(ordered), _CHUNK):
            chunk = ordered[start:start + _CHUNK]
            with client.pipeline(transaction=False) as pipe:
                for entity in chunk:
                    pipe.hgetall(spec.redis_key(entity))
                stored = pipe.execute()
            for entity, mapping in zip(chunk, stored, strict=True):
                stamp = decode_timestamp(mapping.get(ts_field))
                if stamp is None:
                    continue
                values = spec.decode(mapping)
                yield (entity, *(values[name] for name in spec.feature_names), stamp)
    finally:
        client.close()


def served_top_rows(_: Iterable[Any], *, redis_kwargs: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Every top sellers / trending list as Redis holds it -> snapshot rows.

    The lists and their as-of times (``top:meta``) are read in one ``MULTI``, so each
    list is paired with the as-of time it was written with (lists are replaced
    atomically with it). Ranks follow the backfill's rule: score descending, then
    ``item_id`` ascending. The as-of time is the one serving reports (epoch ms).
    """
    import redis

    from pipelines.online_writer import top_item_key

    client = redis.Redis(**redis_kwargs)
    try:
        meta = client.hgetall(online_keys.top_meta_key())
        names = sorted(f.decode("utf-8") for f in meta)
        with client.pipeline(transaction=True) as tx:
            tx.hgetall(online_keys.top_meta_key())
            for name in names:
                tx.zrange(top_item_key(*name.split(":", 2)), 0, -1, withscores=True)
            replies = tx.execute()
        meta = {k.decode("utf-8"): int(v) for k, v in replies[0].items()}
        for name, members in zip(names, replies[1:], strict=True):
            if name not in meta or not members:
                continue
            kind, window, scope = name.split(":", 2)
            category, region = online_keys.parse_scope(scope)
            as_of = datetime.fromtimestamp(meta[name] / 1000, tz=UTC)
            ranked = sorted(((m.decode("utf-8"), float(s)) for m, s in members),
                            key=lambda pair: (-pair[1], pair[0]))
            for rank, (item, score) in enumerate(ranked, start=1):
                yield kind, window, category, region, item, score, rank, as_of
    finally:
        client.close()


class _Files:
    """The few Hadoop ``FileSystem`` calls the staging needs (any URI the store uses)."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark._jvm  # type: ignore[attr-defined]
        assert jvm is not None
        self._path_class = getattr(jvm, "org.apache.hadoop.fs.Path")  # by full name: one lookup
        self._conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]

    def _path(self, uri: str) -> Any:
        return self._path_class(uri)

    def exists(self, uri: str) -> bool:
        path = self._path(uri)
        return bool(path.getFileSystem(self._conf).exists(path))

    def move_data_files(self, src: str, dst: str) -> int:
        """Move every data file under ``src`` to the same relative place under ``dst``
        (``_SUCCESS``, checksums and other hidden files stay); returns how many."""
        root = self._path(src)
        fs = root.getFileSystem(self._conf)
        if not fs.exists(root):
            return 0
        prefix = root.toUri().getPath().rstrip("/") + "/"
        moved = 0
        files = fs.listFiles(root, True)
        found = []
        while files.hasNext():
            found.append(files.next().getPath())
        for path in found:
            relative = path.toUri().getPath()[len(prefix):]
            if any(part.startswith(("_", ".")) for part in relative.split("/")):
                continue
            target = self._path(f"{dst.rstrip('/')}/{relative}")
            fs.mkdirs(target.getParent())
            if not fs.rename(path, target):
                if not fs.exists(target):
                    raise OSError(f"could not move {path} to {target}")
                fs.delete(path, False)  # an earlier attempt copied it (object stores)
            moved += 1
        return moved

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        fs = path.getFileSystem(self._conf)
        if fs.exists(path):
            fs.delete(path, True)


def staging_path(settings: Settings, stage_id: int | str, name: str | None = None) -> str:
    """Where snapshot ``stage_id`` is written before its files move into the tables
    (the micro-batch stream's are ``<run id>-<batch id>``,
    :meth:`pipelines.stream_state.BatchLog.run_id`; Real-time Mode's ``rt-<tile>``)."""
    root = f"{settings.offline_path}/{offline_store.FEATURES}/{STAGING}/{stage_id}"
    return root if name is None else f"{root}/{name}"


def write_served_snapshot(spark: SparkSession, settings: Settings, redis_kwargs: dict[str, Any],
                          generations: Iterable[int], stage_id: int | str,
                          done: Callable[[], None] | None = None) -> None:
    """Add the snapshot of the entities touched in ``generations`` (tile starts) and the lists.

    Exactly once per ``stage_id`` (what asked for it), even when a crash
    interrupts it and a new process runs it again: the three tables are written to
    a staging directory first (read from Redis by the reader process, which on a
    local store writes them too; elsewhere small Spark jobs write them one after
    another); once all three are complete, their files move into the
    tables (a rename each), then ``done()`` records it and the staging goes. A run
    after a crash keeps the staged tables that were complete, so what moves in is
    what the first run read, and moves only the files still staged.
    """
    tiles = sorted(set(generations))
    files = _Files(spark)
    names = [spec.name for spec in _VIEWS.values()] + ["top_items"]
    todo = [name for name in names
            if not files.exists(staging_path(settings, stage_id, name) + "/_SUCCESS")]
    ddl = {**{spec.name: view_schema(spec) for spec in _VIEWS.values()}, "top_items": TOP_SCHEMA}
    schemas = {name: arrow_schema(ddl[name]) for name in todo}
    started = time.monotonic()
    if not todo:
        rows, timing = {}, "already staged"
    elif _stages_locally(staging_path(settings, stage_id)):
        # a local store: the reader process writes the tables too, so no Spark task
        # takes a slot from the micro-batches
        staged = _in_reader(stage_served, redis_kwargs, tiles, dict(schemas),
                            {name: staging_path(settings, stage_id, name) for name in todo})
        rows = staged["rows"]
        timing = f"read from Redis {staged['read_s']:.2f}s, staged {staged['write_s']:.2f}s"
    else:
        tables = _in_reader(served_tables, redis_kwargs, tiles, dict(schemas))
        read_s = time.monotonic() - started
        rows = {name: table.num_rows for name, table in tables}
        frames = [(arrow_frame(spark, table, ddl[name]), name) for name, table in tables]
        # one table after another: each is a one-task job, and a task is never preempted,
        # so side by side they held up to both of local[2]'s slots when a micro-batch's
        # stage began (the batch beside the write took +0.6-1.4 s over the one before it;
        # one at a time +0.1-1.3 s)
        for frame, name in frames:
            _stage(frame, settings, name, staging_path(settings, stage_id, name))
        timing = (f"read from Redis {read_s:.2f}s, "
                  f"staged by Spark {time.monotonic() - started - read_s:.2f}s")
    moving = time.monotonic()
    for name in names:
        files.move_data_files(staging_path(settings, stage_id, name),
                              offline_store.snapshot_path(settings, name))
    if done is not None:
        done()
    files.delete(staging_path(settings, stage_id))
    # one line per snapshot: it shares the cores with the stream, so its size and
    # length are what an operator compares with a slow batch at the slide boundary
    log.info("feature snapshot %s: %s; %s, moved in %.2fs", stage_id,
             ", ".join(f"{name} {count:,} rows" for name, count in rows.items()) or "no tables",
             timing, time.monotonic() - moving)


def _stages_locally(staging: str) -> bool:
    """Whether the reader process writes the staged tables (a local store: pyarrow
    writes there directly; an object store's credentials live in Spark's config)."""
    return offline_store.local_dir(staging) is not None


def _struct(ddl: str) -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = _parse_datatype_string(ddl)
    assert isinstance(struct, StructType)
    return struct


def arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema Spark reads as ``ddl`` (parsing DDL needs the driver's JVM)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(_struct(ddl), timezone="UTC")


def arrow_table(rows: Iterable[tuple[Any, ...]], schema: pa.Schema) -> pa.Table:
    """Rows in the schema's column order -> an Arrow table of that schema."""
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) or [()] * len(schema)
    return pa.Table.from_arrays([pa.array(list(values), type=field.type)
                                 for values, field in zip(columns, schema, strict=True)],
                                schema=schema)


def arrow_frame(spark: SparkSession, table: pa.Table, ddl: str) -> DataFrame:
    """A one-partition DataFrame of an Arrow table the driver holds.

    Not ``createDataFrame(list, schema)``: that checks and re-serializes the rows in a
    Python task, and a Python worker started beside a busy micro-batch took seconds
    of a task slot (a 6-row snapshot table held one for 2 s). Arrow goes straight into
    the JVM; writing it is a short JVM-only task.
    """
    return spark.createDataFrame(table, schema=_struct(ddl)).coalesce(1)


def local_frame(spark: SparkSession, rows: Iterable[tuple[Any, ...]], ddl: str) -> DataFrame:
    """:func:`arrow_frame` of rows the driver holds."""
    return arrow_frame(spark, arrow_table(rows, arrow_schema(ddl)), ddl)


def served_tables(redis_kwargs: dict[str, Any], tiles: list[int],
                  schemas: Mapping[str, pa.Schema]) -> list[tuple[str, pa.Table]]:
    """The snapshot tables named in ``schemas``, read from Redis: (name, Arrow table).

    Runs in the snapshot reader process (:func:`_reader`): picklable arguments in, Arrow
    tables out (they pickle as their buffers). An error other than Redis's comes back
    as a ``RuntimeError`` with the worker's traceback in its text: some exceptions
    (PySpark's) do not survive pickling, and the pool would report only a broken process.
    """
    import redis

    try:
        out = []
        for kind, spec in _VIEWS.items():
            if spec.name in schemas:
                rows = served_rows([dirty_key(kind, g) for g in tiles],
                                   redis_kwargs=redis_kwargs, view=spec.name)
                out.append((spec.name, arrow_table(rows, schemas[spec.name])))
        if "top_items" in schemas:
            out.append(("top_items", arrow_table(
                served_top_rows([], redis_kwargs=redis_kwargs), schemas["top_items"])))
        return out
    except redis.RedisError:
        raise  # picklable, and how the caller tells an outage
    except Exception as exc:
        import traceback

        raise RuntimeError(f"snapshot reader: {type(exc).__name__}: {exc}\n"
                           f"{traceback.format_exc()}") from None


def stage_served(redis_kwargs: dict[str, Any], tiles: list[int], schemas: Mapping[str, pa.Schema],
                 paths: Mapping[str, str]) -> dict[str, Any]:
    """:func:`served_tables`, each written to its staging path in the snapshot layout
    (:func:`pipelines.offline_store.write_snapshot_table`, local paths).

    Runs in the reader process; returns the rows per table and the seconds spent
    reading and writing. The rows of one snapshot share one ``created``.
    """
    started = time.monotonic()
    tables = served_tables(redis_kwargs, tiles, schemas)
    read_s = time.monotonic() - started
    created = datetime.now(UTC)
    try:
        rows = {name: offline_store.write_snapshot_table(table, paths[name], created)
                for name, table in tables}
    except OSError:
        raise  # picklable: a full disk or a permission names its path
    except Exception as exc:
        import traceback

        raise RuntimeError(f"snapshot reader: {type(exc).__name__}: {exc}\n"
                           f"{traceback.format_exc()}") from None
    return {"rows": rows, "read_s": read_s, "write_s": time.monotonic() - started - read_s}


def _warm() -> None:
    """Import what the reader runs, so the first snapshot does not pay for it."""
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import redis  # noqa: F401


def warm_reader() -> None:
    """Start the reader process now, not at the first slide boundary.

    Measured: the first snapshot's read took 9.7 s against 2-3 s warm (the spawn and
    its imports), beside the start-up minute's batches, already the slowest. A reader
    that died since (killed, out of memory) is replaced here, as ``_in_reader`` does.
    """
    try:
        _reader().submit(_warm)
    except BrokenProcessPool:
        _forget_reader()
        _reader().submit(_warm)


_READER: ProcessPoolExecutor | None = None
_READER_LOCK = threading.Lock()
READER_NICE = 10
"""How much lower the reader's CPU priority is than the job's (``os.nice``)."""


def _lower_priority() -> None:
    os.nice(READER_NICE)


def _reader() -> ProcessPoolExecutor:
    """The snapshot reader: one process of its own, started on first use and kept.

    Why a process: reading and decoding every touched entity is pure Python (about
    1.8 s of CPU for the ~12,000 entities a minute at 1,000 events/s), and in the
    driver it held the GIL against the Real-time tile feed, whose tiles then reached
    Redis 1-2.5 s late after every slide boundary. A process of its own shares no GIL
    and runs at a lower priority, so the feed and the micro-batches come first.
    ``spawn``: the driver is multi-threaded (py4j, the feed), which ``fork`` does not copy.
    """
    global _READER
    with _READER_LOCK:
        if _READER is None:
            _READER = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"),
                                          initializer=_lower_priority)
        return _READER


def _forget_reader() -> None:
    """Drop a reader that died (killed, out of memory): the next use starts a new one."""
    global _READER
    with _READER_LOCK:
        _READER = None


def _in_reader(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the reader process."""
    try:
        return _reader().submit(fn, *args).result()
    except BrokenProcessPool:
        _forget_reader()
        raise


def _stage(frame: DataFrame, settings: Settings, name: str, path: str) -> None:
    from pyspark.sql import functions as F

    offline_store.write_snapshots(frame.withColumn("created", F.current_timestamp()), settings,
                                  name, path=path, mode="overwrite")
