"""Writes features into the Redis online store: pipelined, per Spark partition or batch.

Three kinds of data, each with its layout documented where the keys are built:

* **Entity features** (``user_activity``, ``item_stats``) in Feast's own Redis
  layout (:mod:`features.feast_layout`), so ``FeatureStore.get_online_features``
  reads them. One ``HSET`` (+ ``EXPIRE``) per entity, pipelined; with
  ``skip_older`` one ``HMGET`` of the stored ``_ts:{view}`` per entity first, in
  the same batch's pipeline, so a stored value with a *later* event timestamp is
  never overwritten (an equal timestamp is overwritten: a recomputation wins).
  Two round trips per batch of rows, never one per row.
* **Top sellers / trending** sorted sets (:func:`features.online_keys.top_sellers_key`,
  :func:`~features.online_keys.trending_key`), replaced atomically: every new
  list is written to a temporary key (``ZADD`` + trim to top N), then one
  ``MULTI``/``EXEC`` renames each over its live key, sets :data:`TOP_TTL` and
  records the as-of time (epoch ms) in the :func:`~features.online_keys.top_meta_key`
  hash. Readers see the old list or the new one, never a half-written one.
  With ``prune``, scopes that no longer have any sales lose their keys in the
  same transaction. A list whose stored as-of is newer than the new one is left
  alone (a late backfill never overwrites the stream's fresher lists). A writer
  that keeps a :class:`TopListsWritten` rewrites only the lists that changed since
  its last write; the others keep their members and get the new as-of and TTL.
* **Item metadata** hashes (:func:`~features.online_keys.item_meta_key`):
  ``category_id``, ``region``, ``price``, ``updated_ms``, with the
  ``online_ttl_seconds`` TTL refreshed on every write.

Spark use: the ``*_partition_writer`` factories return picklable callables for
``df.foreachPartition`` (the stream calls them from ``foreachBatch``); each
creates its Redis client on the executor, where it is used, from plain
connection keyword arguments. Top lists are small (scopes x N), so
:func:`write_top_items_df` collects them to the driver and writes them in one
transaction, which is also what makes ``prune`` correct.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING, Any

from google.protobuf.timestamp_pb2 import Timestamp

from features import online_keys
from features.feast_layout import PROJECT, ViewSpec, timestamp_field
from pipelines.redis_batch import CommandBatch
from pipelines.settings import Settings

if TYPE_CHECKING:
    import redis
    from pyspark.sql import DataFrame

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "write_entity_rows",
    "EncodedRows",
    "encode_entity_rows",
    "not_older",
    "add_entity_writes",
    "add_item_metadata",
    "entity_partition_writer",
    "write_entity_features",
    "write_top_items",
    "write_top_lists",
    "epoch_ms",
    "write_top_items_df",
    "write_item_metadata",
    "item_metadata_partition_writer",
    "write_item_metadata_df",
    "top_item_key",
    "TopListsWritten",
]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1000
"""Rows per pipeline round trip (HMGET + HSET/EXPIRE)."""


def _batches(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(rows)
    while batch := list(islice(it, size)):
        yield batch


def _as_dict(row: Any) -> Mapping[str, Any]:
    return row.asDict() if hasattr(row, "asDict") else row


@lru_cache(maxsize=4096)
def _ts_nanos(data: bytes | None) -> int | None:
    """Nanoseconds of a serialized Timestamp (cached: a flush's rows share their clock's)."""
    if not data:
        return None
    ts = Timestamp()
    ts.ParseFromString(data)
    return ts.seconds * 1_000_000_000 + ts.nanos


def epoch_ms(ts: datetime) -> int:
    """Epoch milliseconds of ``ts`` (naive: UTC), as every online timestamp is stored."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return int(ts.timestamp() * 1000)


def _local_python_workers(df: DataFrame) -> None:
    """In local mode, make Spark's Python workers run this interpreter (the venv).

    PySpark starts workers with ``$PYSPARK_PYTHON`` or ``python3`` from PATH, which
    need not have redis / protobuf installed. ``pipelines.spark.spark_session``
    should pin it; until it does, local runs are fixed here. Clusters configure
    their executors' Python themselves.
    """
    import sys

    sc = df.sparkSession.sparkContext
    if (sc.master or "").startswith("local") and getattr(sc, "pythonExec", sys.executable) != sys.executable:
        logger.debug("Python workers: %s -> %s", sc.pythonExec, sys.executable)
        sc.pythonExec = sys.executable


# ------------------------------------------------------------ entity features
def write_entity_rows(
    client: redis.Redis,
    spec: ViewSpec,
    rows: Iterable[Any],
    *,
    project: str = PROJECT,
    ttl_seconds: int | None = None,
    skip_older: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> int:
    """Write feature rows of one view in Feast's Redis layout; returns rows written.

    Parameters
    ----------
    client
        A Redis client (created where it is used).
    spec
        The view (:data:`features.feast_layout.USER_ACTIVITY` / ``ITEM_STATS``).
    rows
        Dicts or Spark Rows with the view's columns (``spec.columns``; ``created``
        is not needed). Several rows for one entity: the latest event timestamp wins.
    ttl_seconds
        ``EXPIRE`` per entity key (Feast's ``key_ttl_seconds``); ``None``: no TTL.
    skip_older
        Leave an entity alone when Redis already holds a later event timestamp.
    """
    ts_field = timestamp_field(spec.name)
    written = 0
    for batch in _batches(rows, batch_size):
        encoded = encode_entity_rows(spec, batch, project)
        keys = list(encoded)
        if skip_older:
            reads = CommandBatch(client)
            for key in keys:
                reads.add("HGET", key, ts_field)
            keys = not_older(encoded, dict(zip(keys, reads.execute(), strict=True)))
        if not keys:
            continue
        writes = CommandBatch(client)
        add_entity_writes(writes, encoded, keys, ttl_seconds)
        writes.execute()
        written += len(keys)
    return written


EncodedRows = dict[bytes, tuple[int, list[bytes]]]
"""Entity rows of one view by Redis key: (event timestamp in ns, the row's ``HSET``
arguments, :meth:`~features.feast_layout.ViewSpec.hset_args`)."""


def encode_entity_rows(spec: ViewSpec, rows: Iterable[Any], project: str = PROJECT) -> EncodedRows:
    """Rows in Feast's layout, by Redis key; of several rows of one entity the latest
    event timestamp wins (the last of equal ones)."""
    encoded: EncodedRows = {}
    for row in rows:
        key, args = spec.hset_args(_as_dict(row), project)
        nanos = _ts_nanos(args[-1]) or 0  # hset_args puts the event timestamp last
        previous = encoded.get(key)
        if previous is None or nanos >= previous[0]:
            encoded[key] = (nanos, args)
    return encoded


def not_older(encoded: EncodedRows, stored: Mapping[bytes, bytes | None]) -> list[bytes]:
    """The keys of ``encoded`` whose stored event timestamp (``stored``: the ``_ts:{view}``
    field read from Redis, ``None`` when absent) is not later than the new row's: an
    equal one is overwritten, so a recomputation wins."""
    return [key for key, (nanos, _) in encoded.items()
            if (old := _ts_nanos(stored.get(key))) is None or old <= nanos]


def add_entity_writes(batch: CommandBatch, encoded: EncodedRows, keys: Iterable[bytes],
                      ttl_seconds: int | None) -> None:
    """Queue ``HSET`` (+ ``EXPIRE`` with a TTL) of each of ``keys``' encoded rows."""
    for key in keys:
        batch.add("HSET", key, *encoded[key][1])
        if ttl_seconds:
            batch.add("EXPIRE", key, ttl_seconds)


def _write_entity_partition(
    rows: Iterator[Any],
    *,
    redis_kwargs: dict[str, Any],
    spec: ViewSpec,
    project: str,
    ttl_seconds: int | None,
    skip_older: bool,
    batch_size: int,
) -> None:
    import redis

    client = redis.Redis(**redis_kwargs)
    try:
        write_entity_rows(client, spec, rows, project=project, ttl_seconds=ttl_seconds,
                          skip_older=skip_older, batch_size=batch_size)
    finally:
        client.close()


def entity_partition_writer(
    settings: Settings,
    spec: ViewSpec,
    *,
    skip_older: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    project: str = PROJECT,
) -> Callable[[Iterator[Any]], None]:
    """A picklable ``foreachPartition`` function writing ``spec`` rows (TTL: ``online_ttl_seconds``)."""
    from functools import partial

    from pipelines.connections import redis_kwargs

    return partial(
        _write_entity_partition,
        redis_kwargs=redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 5000)),
        spec=spec,
        project=project,
        ttl_seconds=settings.online_ttl_seconds,
        skip_older=skip_older,
        batch_size=batch_size,
    )


def write_entity_features(
    rows: DataFrame, settings: Settings, spec: ViewSpec, *, skip_older: bool = True
) -> None:
    """Write a DataFrame of feature rows, one pipelined writer per partition."""
    _local_python_workers(rows)
    rows.select(spec.join_key, *spec.feature_names, "event_timestamp").foreachPartition(
        entity_partition_writer(settings, spec, skip_older=skip_older)
    )


# ------------------------------------------------------- top sellers / trending
def top_item_key(kind: str, window: str, scope: str) -> str:
    """The sorted set of one (kind, window, scope): top sellers or trending."""
    if kind == "top":
        return online_keys.top_sellers_key(window, scope)
    if kind == "trend":
        return online_keys.trending_key(window, scope)
    raise ValueError(f"kind must be 'top' or 'trend', got {kind!r}")


def _temp_key(final_key: str, token: str) -> str:
    # built with online_keys' own joiner, under a "tmp" part: never a live key
    return online_keys.key("tmp", token, online_keys.encode_part(final_key))


def _parse_meta_field(name: str) -> tuple[str, str, str]:
    kind, window, scope = name.split(":", 2)
    return kind, window, scope


TopSpec = tuple[str, str, str]
"""One top list: (kind, window, scope)."""


class TopListsWritten:
    """The lists one writer last wrote, so its next write can leave unchanged ones alone.

    Why: the Real-time feed ranks every list up to four times a second, and between two
    rankings only the scopes of the items sold in between change. Rewriting all of them
    (about 4 commands each, hundreds of lists) was most of a top write, which holds up
    the tiles waiting behind it.

    A list counts as unchanged only when its members and scores equal what this writer
    wrote, the as-of stored for it is the one this writer stored (nobody wrote it
    since), and its members were written less than ``max_age_s`` ago: a list lost
    another way (evicted under ``maxmemory``) is back within that. Start a new one
    whenever Redis may have lost data behind the writer's back, as after a reconnect.
    """

    def __init__(self, max_age_s: float = 60.0) -> None:
        self.max_age_s = max_age_s
        # list -> (members and scores, the as-of stored with them, when they were written)
        self._lists: dict[TopSpec, tuple[dict[str, float], int, float]] = {}

    def __len__(self) -> int:
        return len(self._lists)

    def unchanged(self, spec: TopSpec, members: Mapping[str, float], stored_ms: int | None,
                  now: float) -> bool:
        held = self._lists.get(spec)
        return (held is not None and held[1] == stored_ms and now - held[2] < self.max_age_s
                and held[0] == members)

    def wrote(self, spec: TopSpec, members: dict[str, float], as_of_ms: int, now: float,
              *, rewritten: bool) -> None:
        held = self._lists.get(spec)
        since = now if rewritten or held is None else held[2]
        self._lists[spec] = (members, as_of_ms, since)

    def forget(self, spec: TopSpec) -> None:
        self._lists.pop(spec, None)


def write_top_items(
    client: redis.Redis,
    rows: Iterable[Any],
    *,
    top_n: int,
    prune: bool = False,
    ttl_seconds: int = online_keys.TOP_TTL,
    written: TopListsWritten | None = None,
) -> int:
    """Replace top-seller / trending sorted sets atomically; returns lists written.

    Parameters
    ----------
    client
        A Redis client.
    rows
        :data:`features.windows.TOP_ITEM_COLUMNS` rows for **one** as-of time
        (each (kind, window, scope) complete: the rows are the whole new list).
    top_n
        Lists are trimmed to this many members (highest scores).
    prune
        The rows cover every scope: delete lists (and meta fields) of the same
        kind and window that are absent, i.e. scopes with no sales any more.
    ttl_seconds
        TTL of each list and of the meta hash (:data:`features.online_keys.TOP_TTL`).
    written
        What this writer wrote before (updated here): lists equal to it are not
        rewritten, only stamped with the new as-of (:class:`TopListsWritten`).
    """
    lists: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    as_of_ms: int | None = None
    # tens of thousands of rows share a few hundred scopes and one timestamp: encode each once
    scopes: dict[tuple[Any, Any], str] = {}
    stamps: dict[Any, int] = {}
    for row in rows:
        r = _as_dict(row)
        where = (r["category_id"], r["region"])
        scope = scopes.get(where)
        if scope is None:
            scope = scopes[where] = online_keys.scope_for(*where)
        lists[(r["kind"], r["window"], scope)][str(r["item_id"])] = float(r["score"])
        stamp = r["event_timestamp"]
        ms = stamps.get(stamp)
        if ms is None:
            ms = stamps[stamp] = epoch_ms(stamp)
        if as_of_ms is not None and ms != as_of_ms:
            raise ValueError("write_top_items takes the rows of a single as-of time")
        as_of_ms = ms
    if as_of_ms is None:
        return 0
    return write_top_lists(client, lists, as_of_ms, top_n=top_n, prune=prune,
                           ttl_seconds=ttl_seconds, written=written)


def write_top_lists(
    client: redis.Redis,
    lists: Mapping[TopSpec, dict[str, float]],
    as_of_ms: int,
    *,
    top_n: int,
    prune: bool = False,
    ttl_seconds: int = online_keys.TOP_TTL,
    written: TopListsWritten | None = None,
) -> int:
    """:func:`write_top_items` of lists already grouped: ``(kind, window, scope)`` -> item ->
    score, all as of ``as_of_ms`` (epoch ms). The Real-time feed keeps its lists in this
    shape (:class:`pipelines.streaming.pyfeatures.TopLists`), so it neither builds the rows
    nor has them parsed back: tens of thousands of rows per top write."""
    if not lists:
        return 0
    meta_key = online_keys.top_meta_key()

    # which lists may be (re)written: not those with a newer stored as-of
    stored: dict[bytes, bytes] = client.hgetall(meta_key)  # type: ignore[assignment]
    stored_ms = {k.decode(): int(v) for k, v in stored.items()}
    fields = {(kind, window, scope): online_keys.top_meta_field(kind, window, scope)  # type: ignore[arg-type]
              for kind, window, scope in lists}
    fresh = [spec for spec in lists if stored_ms.get(fields[spec], -1) <= as_of_ms]
    stale_fields: list[str] = []
    if prune:
        covered = {(kind, window) for kind, window, _ in lists}
        live = set(fields.values())
        for name, ms in stored_ms.items():
            kind, window, _ = _parse_meta_field(name)
            if name not in live and ms <= as_of_ms and (kind, window) in covered:
                stale_fields.append(name)

    now = time.monotonic()
    changed = [spec for spec in fresh if written is None or not written.unchanged(
        spec, lists[spec], stored_ms.get(fields[spec]), now)]
    token = uuid.uuid4().hex
    batch = CommandBatch(client)
    for spec in changed:
        tmp = _temp_key(top_item_key(*spec), token)
        batch.add("DEL", tmp)
        batch.add("ZADD", tmp, *[part for member, score in lists[spec].items()
                                 for part in (score, member)])
        batch.add("ZREMRANGEBYRANK", tmp, 0, -(top_n + 1))
        batch.add("EXPIRE", tmp, 300)  # a crashed writer leaves no litter behind
    batch.execute()
    for spec in changed:
        final = top_item_key(*spec)
        batch.add("RENAME", _temp_key(final, token), final)
    for spec in fresh:
        batch.add("EXPIRE", top_item_key(*spec), ttl_seconds)
    if fresh:
        batch.add("HSET", meta_key, *[part for spec in fresh
                                      for part in (fields[spec], str(as_of_ms))])
    for name in stale_fields:
        batch.add("DEL", top_item_key(*_parse_meta_field(name)))
        batch.add("HDEL", meta_key, name)
    if fresh or stale_fields:
        batch.add("EXPIRE", meta_key, ttl_seconds)
        batch.execute_transaction()
    if written is not None:
        rewritten = set(changed)
        for spec in fresh:
            written.wrote(spec, lists[spec], as_of_ms, now, rewritten=spec in rewritten)
        for name in stale_fields:
            written.forget(_parse_meta_field(name))
    if len(fresh) < len(lists):
        logger.info("kept %d top lists that Redis holds with a newer as-of",
                    len(lists) - len(fresh))
    return len(fresh)


def write_top_items_df(top_items: DataFrame, settings: Settings, *, prune: bool = True) -> int:
    """Write the top lists of the **latest** as-of time in ``top_items`` (collected: small)."""
    from pyspark.sql import functions as F

    from pipelines.connections import redis_client

    row = top_items.agg(F.max("event_timestamp")).first()
    latest = row[0] if row is not None else None
    if latest is None:
        return 0
    rows = top_items.where(F.col("event_timestamp") == F.lit(latest)).collect()
    client = redis_client(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 5000))
    try:
        return write_top_items(client, rows, top_n=settings.feature_top_n, prune=prune)
    finally:
        client.close()


# --------------------------------------------------------------- item metadata
def write_item_metadata(
    client: redis.Redis,
    rows: Iterable[Any],
    *,
    ttl_seconds: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> int:
    """``HSET item_meta_key(item)`` category_id, region, price, updated_ms (+ EXPIRE); pipelined.

    ``rows`` are :data:`features.tiles.ITEM_METADATA_COLUMNS` rows. Returns rows written.
    """
    written = 0
    for batch in _batches(rows, batch_size):
        writes = CommandBatch(client)
        for row in batch:
            add_item_metadata(writes, row, ttl_seconds)
        writes.execute()
        written += len(batch)
    return written


def add_item_metadata(batch: CommandBatch, row: Any, ttl_seconds: int) -> None:
    """Queue the ``HSET`` + ``EXPIRE`` of one :data:`features.tiles.ITEM_METADATA_COLUMNS` row."""
    r = _as_dict(row)
    key = online_keys.item_meta_key(str(r["item_id"]))
    fields = ["category_id", str(r["category_id"]), "region", str(r["region"]),
              "updated_ms", str(epoch_ms(r["event_time"]))]
    if r.get("price") is not None:
        fields += ["price", repr(float(r["price"]))]
    batch.add("HSET", key, *fields)
    batch.add("EXPIRE", key, ttl_seconds)


def _write_item_metadata_partition(rows: Iterator[Any], *, redis_kwargs: dict[str, Any],
                                   ttl_seconds: int, batch_size: int) -> None:
    import redis

    client = redis.Redis(**redis_kwargs)
    try:
        write_item_metadata(client, rows, ttl_seconds=ttl_seconds, batch_size=batch_size)
    finally:
        client.close()


def item_metadata_partition_writer(
    settings: Settings, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> Callable[[Iterator[Any]], None]:
    """A picklable ``foreachPartition`` function for :func:`features.tiles.item_metadata` rows."""
    from functools import partial

    from pipelines.connections import redis_kwargs

    return partial(
        _write_item_metadata_partition,
        redis_kwargs=redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 5000)),
        ttl_seconds=settings.online_ttl_seconds,
        batch_size=batch_size,
    )


def write_item_metadata_df(metadata: DataFrame, settings: Settings) -> None:
    """Write :func:`features.tiles.item_metadata` rows, one pipelined writer per partition."""
    _local_python_workers(metadata)
    metadata.foreachPartition(item_metadata_partition_writer(settings))
