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
keeps (:func:`pipelines.stream_state.dirty_key`). The driver thread that writes the
snapshot reads them and the entities' hashes, pipelined, and hands the rows to Spark,
which writes them with one short JVM task per table in the background scheduler pool
(:data:`pipelines.spark.BACKGROUND_POOL`).

Why the driver reads: the snapshot runs beside the micro-batches, on the same task
slots. Read by Python tasks on the executors it held both slots of ``local[2]`` for
seconds at each slide boundary (a Python worker per task, under contention), and the
micro-batch waited for them: probes at 1,000 events/s took 7-9 s there, 2-4 s
elsewhere. Read here it costs the driver about 40 us per entity (6,000 users: 0.25 s)
and the slots a fraction of a second. The rows of one snapshot are in the driver's
memory while it is written: about 1 KB per touched entity, so 100,000 entities
touched per slide take about 100 MB.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

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
from pipelines.spark import inheriting
from pipelines.stream_state import ITEM, USER, dirty_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["served_rows", "served_top_rows", "local_frame", "write_served_snapshot", "staging_path", "view_schema",
           "TOP_SCHEMA", "STAGING"]

log = logging.getLogger(__name__)

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
    a staging directory first (read from Redis here, written by small Spark jobs
    side by side); once all three are complete, their files move into the
    tables (a rename each), then ``done()`` records it and the staging goes. A run
    after a crash keeps the staged tables that were complete, so what moves in is
    what the first run read, and moves only the files still staged.
    """
    tiles = sorted(set(generations))
    files = _Files(spark)
    names = [spec.name for spec in _VIEWS.values()] + ["top_items"]
    todo = [name for name in names
            if not files.exists(staging_path(settings, stage_id, name) + "/_SUCCESS")]
    frames: list[tuple[Any, str]] = []
    for kind, spec in _VIEWS.items():
        if spec.name in todo:
            rows = served_rows([dirty_key(kind, g) for g in tiles], redis_kwargs=redis_kwargs,
                               view=spec.name)
            frames.append((local_frame(spark, rows, view_schema(spec)), spec.name))
    if "top_items" in todo:
        top = served_top_rows([], redis_kwargs=redis_kwargs)
        frames.append((local_frame(spark, top, TOP_SCHEMA), "top_items"))
    if frames:
        with ThreadPoolExecutor(max_workers=len(frames), thread_name_prefix="snapshot-write") as pool:
            writes = [pool.submit(inheriting(spark, _stage), frame, settings, name,
                                  staging_path(settings, stage_id, name))
                      for frame, name in frames]
            for write in writes:
                write.result()
    for name in names:
        files.move_data_files(staging_path(settings, stage_id, name),
                              offline_store.snapshot_path(settings, name))
    if done is not None:
        done()
    files.delete(staging_path(settings, stage_id))


def local_frame(spark: SparkSession, rows: Iterable[tuple[Any, ...]], ddl: str) -> DataFrame:
    """A one-partition DataFrame of rows held by the driver, handed to the JVM as Arrow.

    Not ``createDataFrame(list, schema)``: that checks and re-serializes the rows in a
    Python task, and a Python worker started beside a busy micro-batch took seconds
    of a task slot (a 6-row snapshot table held one for 2 s). Arrow goes straight into
    the JVM; writing it is a short JVM-only task.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = _parse_datatype_string(ddl)
    assert isinstance(struct, StructType)
    schema = to_arrow_schema(struct, timezone="UTC")
    columns = list(zip(*rows, strict=True)) or [()] * len(schema)
    table = pa.Table.from_arrays([pa.array(list(values), type=field.type)
                                  for values, field in zip(columns, schema, strict=True)],
                                 schema=schema)
    return spark.createDataFrame(table, schema=struct).coalesce(1)


def _stage(frame: DataFrame, settings: Settings, name: str, path: str) -> None:
    from pyspark.sql import functions as F

    offline_store.write_snapshots(frame.withColumn("created", F.current_timestamp()), settings,
                                  name, path=path, mode="overwrite")
