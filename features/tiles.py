"""Layer 1 of the feature computation: validated events -> per-tile partial aggregates.

Windows are sliding ("the last hour, as of now") and are built from *tiles*, as
Chronon does. The tile size ``s`` is the ``feature_slide_seconds`` setting
(60 s by default) and is the same for every window::

    tile_start(t) = floor(epoch_seconds(t) / s) * s

A tile holds the partial aggregate of one entity's events whose ``event_time``
falls in ``[tile_start, tile_start + s)``. :mod:`features.windows` (layer 2)
sums the tiles of a window into feature rows as of a time ``T``.

Three tile tables, each keyed by the entity and ``tile_start``:

* :func:`user_tiles` -- ``user_id``: views, carts, purchases, spend (sum of
  ``price * quantity`` over purchases), the set of items viewed, per-category
  activity weights (:data:`ACTIVITY_WEIGHTS`), the latest event time, the
  last ``N`` distinct items viewed with their view times, and the last ``N``
  distinct items purchased with their purchase times.
* :func:`item_tiles` -- ``item_id``: views, carts, purchases, units (sum of
  ``quantity`` over purchases), revenue (sum of ``price * quantity`` over
  purchases) and the item's category (from its latest event in the tile).
* :func:`sales_tiles` -- ``(item_id, category_id, region)``: purchases, units
  and revenue; the input of top sellers and trending per scope.

Streaming use
-------------
Each tile function is one ``groupBy(keys..., window(event_time, s))`` with
plain aggregate expressions (``sum``, ``max``, ``max_by``, ``collect_set``,
``collect_list``) followed by a row-wise projection. That is what Structured
Streaming runs in a stateful aggregation: with
``events.withWatermark("event_time", ...)`` upstream, the tumbling ``window``
on the watermarked column lets Spark evict closed tiles, in append or update
mode. No distinct aggregates, no sorting, no joins, no second aggregation.
The same functions run on static DataFrames for the backfill and from
``foreachBatch``.

Extra grouping columns (``by``) let the backfill build "head" tiles per as-of
time (see :func:`features.windows.features_over_time`); the stream leaves it
empty.

Every function here is DataFrame in, DataFrame out: no session, no I/O, no
settings read (sizes are parameters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from features.events import EVENT_TYPES

__all__ = [
    "ACTIVITY_WEIGHTS",
    "USER_TILE_COLUMNS",
    "ITEM_TILE_COLUMNS",
    "SALES_TILE_COLUMNS",
    "tile_start_seconds",
    "sum_category_weights",
    "latest_distinct_items",
    "user_tiles",
    "item_tiles",
    "sales_tiles",
    "ITEM_METADATA_COLUMNS",
    "item_metadata",
    "TILE_KINDS",
    "KEYED_TILE_COLUMNS",
    "sales_key",
    "keyed_tiles",
    "ROLE_EVENT_COLUMNS",
    "role_events",
    "ROLE_ROW_COLUMNS",
    "role_rows",
]

ACTIVITY_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}
)
"""Weight of one event of each type in a user's category affinity."""

USER_TILE_COLUMNS: tuple[str, ...] = (
    "user_id",
    "tile_start",
    "views",
    "carts",
    "purchases",
    "spend",
    "items_viewed",
    "category_weights",
    "last_event_time",
    "last_viewed",
    "last_purchased",
)
"""Columns of :func:`user_tiles` (after any ``by`` columns).

``tile_start`` bigint epoch seconds; ``views``/``carts``/``purchases`` bigint;
``spend`` double; ``items_viewed`` array<string> (distinct, unordered);
``category_weights`` array<struct<category_id: string, weight: double>> (one
entry per category); ``last_event_time`` timestamp; ``last_viewed``
array<struct<event_time: timestamp, item_id: string>>, at most ``N`` distinct
items, most recent first (ties: item_id ascending); ``last_purchased`` the same
for purchases.
"""

ITEM_TILE_COLUMNS: tuple[str, ...] = (
    "item_id",
    "tile_start",
    "category_id",
    "category_time",
    "views",
    "carts",
    "purchases",
    "units",
    "revenue",
)
"""Columns of :func:`item_tiles` (after any ``by`` columns).

``category_id`` is the category of the item's latest event in the tile (ties:
the greatest category_id)
(``category_time`` its event time, so layer 2 can pick the latest across
tiles); counts and ``units`` bigint, ``revenue`` double.
"""

SALES_TILE_COLUMNS: tuple[str, ...] = (
    "item_id",
    "category_id",
    "region",
    "tile_start",
    "purchases",
    "units",
    "revenue",
)
"""Columns of :func:`sales_tiles` (after any ``by`` columns); only purchases make rows."""



def _is(event_type: str) -> Column:
    return F.col("event_type") == F.lit(event_type)


def tile_start_seconds(ts: Column | str, slide_seconds: int) -> Column:
    """``floor(epoch_seconds(ts) / s) * s`` as a bigint column (exact for sub-second times)."""
    col = F.col(ts) if isinstance(ts, str) else ts
    micros = F.unix_micros(col)
    step = F.lit(int(slide_seconds) * 1_000_000)
    # floor division on longs; pmod keeps it right for times before 1970 too
    return ((micros - F.pmod(micros, step)) / F.lit(1_000_000)).cast("bigint")


def _count(cond: Column) -> Column:
    return F.sum(F.when(cond, F.lit(1)).otherwise(F.lit(0))).cast("bigint")


def _amount(cond: Column) -> Column:
    value = F.col("price") * F.col("quantity").cast("double")
    return F.coalesce(F.sum(F.when(cond, value)), F.lit(0.0)).cast("double")


def _units(cond: Column) -> Column:
    return F.coalesce(F.sum(F.when(cond, F.col("quantity").cast("bigint"))), F.lit(0)).cast(
        "bigint"
    )


def _window(slide_seconds: int) -> Column:
    if slide_seconds < 1:
        raise ValueError("slide_seconds must be >= 1")
    return F.window("event_time", f"{int(slide_seconds)} seconds").alias("_tile")


def _tile_start_from_window() -> Column:
    return F.unix_seconds(F.col("_tile.start")).alias("tile_start")


def _activity_weight() -> Column:
    weight = F.lit(None).cast("double")
    for event_type, value in reversed(list(ACTIVITY_WEIGHTS.items())):
        weight = F.when(F.col("event_type") == F.lit(event_type), F.lit(float(value))).otherwise(
            weight
        )
    return weight


def sum_category_weights(entries: Column) -> Column:
    """Merge an array<struct<category_id, weight>> into one entry per category (summed).

    Row-wise (higher-order functions), so it runs after a streaming aggregation
    and in layer 2. Entry order is unspecified.
    """
    cats = F.array_distinct(F.transform(entries, lambda e: e["category_id"]))
    return F.transform(
        cats,
        lambda c: F.struct(
            c.alias("category_id"),
            F.aggregate(
                F.filter(entries, lambda e: e["category_id"] == c),
                F.lit(0.0),
                lambda acc, e: acc + e["weight"],
            ).alias("weight"),
        ),
    )


def latest_distinct_items(entries: Column, n: int) -> Column:
    """The ``n`` most recent distinct items of an array<struct<event_time, item_id>>.

    Most recent first; equal times are ordered by item_id ascending, so the
    result is deterministic. Row-wise (higher-order functions).
    """
    ordered = F.array_sort(
        entries,
        lambda left, right: F.when(left["event_time"] > right["event_time"], F.lit(-1))
        .when(left["event_time"] < right["event_time"], F.lit(1))
        .when(left["item_id"] < right["item_id"], F.lit(-1))
        .when(left["item_id"] > right["item_id"], F.lit(1))
        .otherwise(F.lit(0)),
    )
    # one pass over the sorted array keeps an entry if its item is not in yet, up to n
    # (a filter that looks back at the sorted array would sort it again per element)
    empty = F.filter(entries, lambda e: F.lit(False))
    return F.aggregate(
        ordered,
        empty,
        lambda kept, e: F.when(
            (F.size(kept) >= F.lit(int(n)))
            | F.array_contains(F.transform(kept, lambda k: k["item_id"]), e["item_id"]),
            kept,
        ).otherwise(F.concat(kept, F.array(e))),
    )


def user_tiles(
    events: DataFrame,
    *,
    slide_seconds: int,
    last_items_n: int,
    by: Sequence[str] = (),
) -> DataFrame:
    """Per-(user, tile) partial aggregates of validated events.

    Parameters
    ----------
    events
        Validated events (:data:`features.events.VALID_COLUMNS`); static or
        streaming (with a watermark on ``event_time`` for a bounded state).
    slide_seconds
        Tile size ``s`` (the ``feature_slide_seconds`` setting).
    last_items_n
        How many distinct recently viewed items a tile keeps (``feature_last_items_n``).
    by
        Extra grouping columns kept in front of the output (backfill only).

    Returns
    -------
    DataFrame
        ``by`` columns, then :data:`USER_TILE_COLUMNS`.
    """
    view_pair = F.struct(F.col("event_time").alias("event_time"), F.col("item_id").alias("item_id"))
    category_entry = F.struct(
        F.col("category_id").alias("category_id"), _activity_weight().alias("weight")
    )
    agg = events.groupBy(*by, "user_id", _window(slide_seconds)).agg(
        _count(_is("view")).alias("views"),
        _count(_is("add_to_cart")).alias("carts"),
        _count(_is("purchase")).alias("purchases"),
        _amount(_is("purchase")).alias("spend"),
        F.collect_set(F.when(_is("view"), F.col("item_id"))).alias("_items"),
        F.collect_list(category_entry).alias("_categories"),
        F.max("event_time").alias("last_event_time"),
        F.collect_list(F.when(_is("view"), view_pair)).alias("_viewed"),
        F.collect_list(F.when(_is("purchase"), view_pair)).alias("_purchased"),
    )
    return agg.select(
        *by,
        "user_id",
        _tile_start_from_window(),
        "views",
        "carts",
        "purchases",
        "spend",
        F.col("_items").alias("items_viewed"),
        sum_category_weights(F.col("_categories")).alias("category_weights"),
        "last_event_time",
        latest_distinct_items(F.col("_viewed"), last_items_n).alias("last_viewed"),
        latest_distinct_items(F.col("_purchased"), last_items_n).alias("last_purchased"),
    )


def item_tiles(events: DataFrame, *, slide_seconds: int, by: Sequence[str] = ()) -> DataFrame:
    """Per-(item, tile) partial aggregates of validated events.

    Returns ``by`` columns, then :data:`ITEM_TILE_COLUMNS`. See :func:`user_tiles`
    for the parameters.
    """
    agg = events.groupBy(*by, "item_id", _window(slide_seconds)).agg(
        F.max_by("category_id", F.struct("event_time", "category_id")).alias("category_id"),
        F.max("event_time").alias("category_time"),
        _count(_is("view")).alias("views"),
        _count(_is("add_to_cart")).alias("carts"),
        _count(_is("purchase")).alias("purchases"),
        _units(_is("purchase")).alias("units"),
        _amount(_is("purchase")).alias("revenue"),
    )
    return agg.select(*by, "item_id", _tile_start_from_window(), *ITEM_TILE_COLUMNS[2:])


def sales_tiles(events: DataFrame, *, slide_seconds: int, by: Sequence[str] = ()) -> DataFrame:
    """Per-(item, category, region, tile) sales of validated events (purchases only).

    Returns ``by`` columns, then :data:`SALES_TILE_COLUMNS`.
    """
    agg = (
        events.where(_is("purchase"))
        .groupBy(*by, "item_id", "category_id", "region", _window(slide_seconds))
        .agg(
            F.count(F.lit(1)).cast("bigint").alias("purchases"),
            _units(F.lit(True)).alias("units"),
            _amount(F.lit(True)).alias("revenue"),
        )
    )
    return agg.select(
        *by, "item_id", "category_id", "region", _tile_start_from_window(), *SALES_TILE_COLUMNS[4:]
    )


ITEM_METADATA_COLUMNS: tuple[str, ...] = ("item_id", "category_id", "region", "price", "event_time")
"""Columns of :func:`item_metadata`."""


def item_metadata(events: DataFrame) -> DataFrame:
    """Each item's latest category, region and price (for the ``item_meta_key`` hashes).

    ``category_id`` and ``region`` come from the item's latest event, ``price``
    from its latest event that has one (null if none did); ``event_time`` is the
    latest event time. One aggregation with ``max_by``, so it also runs as a
    streaming aggregation (update mode).
    """
    # ties on event_time are broken by the value itself, so the result is deterministic
    priced = F.when(F.col("price").isNotNull(), F.struct("event_time", "price"))
    return events.groupBy("item_id").agg(
        F.max_by("category_id", F.struct("event_time", "category_id")).alias("category_id"),
        F.max_by("region", F.struct("event_time", "region")).alias("region"),
        F.max_by("price", priced).alias("price"),
        F.max("event_time").alias("event_time"),
    )


# ------------------------------------------------------------ one aggregation
TILE_KINDS: tuple[str, ...] = ("user", "item", "sales")
"""The ``kind`` values of :func:`keyed_tiles`, one per tile table above."""

KEYED_TILE_COLUMNS: tuple[str, ...] = (
    "kind", "key", "tile_start", "views", "carts", "purchases", "spend", "units",
    "items_viewed", "category_weights", "last_viewed", "last_purchased",
    "category_id", "item_id", "region", "price", "max_us", "price_us",
)
"""Columns of :func:`keyed_tiles`.

Every time is epoch microseconds (bigint): ``max_us`` is the latest event time
of the tile (a user tile's ``last_event_time``, an item tile's
``category_time``), ``last_viewed`` / ``last_purchased`` entries are
``struct<event_us, item_id>``, ``price_us`` the time of the latest priced event
(null if none). ``spend`` is a user's spend and an item's or a sale's revenue.
``category_id``, ``item_id``, ``region`` and ``price`` are those of the tile's latest event
(price: latest priced event; ties broken by the value), which gives an item's
metadata (:func:`item_metadata`) across tiles by the greatest ``max_us`` /
``price_us``.

Each column is computed only for the kinds that read it and is empty or null on the
others: the user-only lists and sets on item and sales rows; ``category_id`` and
``region`` on user rows; ``item_id`` (a sale's, its key's first part) on user and item
rows; ``price`` and ``price_us`` on user and sales rows. Why: each of those ``max_by``s
builds and compares a struct for every row it sees, and user rows are about half of
the exploded rows, so masking them skips most of that work (the aggregation's per-row
update was the largest part of the online path in the drain's profile).
"""


def sales_key(item_id: Column | str = "item_id", category_id: Column | str = "category_id",
              region: Column | str = "region") -> Column:
    """The one-string key of a sales tile: ``item|category|region``, each part URL-encoded."""
    parts = [F.col(c) if isinstance(c, str) else c for c in (item_id, category_id, region)]
    return F.concat_ws("|", *[F.url_encode(p) for p in parts])


def keyed_tiles(events: DataFrame, *, slide_seconds: int, last_items_n: int,
                partitions: int | None = None, windowed: bool | None = None) -> DataFrame:
    """The tiles of :func:`user_tiles`, :func:`item_tiles` and :func:`sales_tiles` in one
    aggregation, keyed by ``(kind, key, tile_start)`` (:data:`KEYED_TILE_COLUMNS`).

    Why: the stream merges tiles key by key outside Spark, so one shuffle of the
    events exploded into their roles (every event is a user event and an item
    event, a purchase also a sale) costs less than three group-bys, and a
    streaming query in update mode (Real-time Mode) may hold only one
    aggregation. Aggregates that belong to one kind are masked to it, so the
    buffers of the other kinds stay empty. The values are those of the three
    functions (``tests/integration/test_stream_realtime.py`` checks it).

    With ``partitions``, the exploded events are hash-partitioned by
    ``(kind, key)`` first: the aggregation then needs no other shuffle, and its
    output keeps every tile of a key in one partition (for per-key consumers).

    A streaming DataFrame is grouped by ``window(event_time)`` (``windowed``, by default
    ``events.isStreaming``), which lets a watermark evict closed tiles from the state.
    A static one (a micro-batch's) is grouped by the tile's start as a
    number, behind a 64-bit hash of ``(kind, key, tile_start)``: the aggregation (an
    ``ObjectHashAggregate`` that falls back to sorting its rows by the group) then
    compares two rows by that hash, Spark's 8-byte sort prefix, where the group began with
    the kind, the same few bytes for every row, and ended with the window's struct, whose
    comparison was an eighth of the operator's samples. The rows are the same either way.

    The stream calls this every micro-batch; its column expressions (some 200
    objects, each built by a call into the JVM) are built once per Spark
    context and parameters and reused (:func:`_keyed_columns`): building them
    took 0.8 s of every 3 s batch on the driver.
    """
    cols = _keyed_columns(int(slide_seconds), int(last_items_n))
    exploded = _role_rows(events, cols, partitions)
    if events.isStreaming if windowed is None else windowed:
        return exploded.groupBy(*cols.group).agg(*cols.aggregates).select(*cols.output)
    return (exploded.select(cols.all, *cols.tile_group).groupBy(*cols.tile_group_names)
            .agg(*cols.aggregates).select(*cols.tile_output))


def _role_rows(events: DataFrame, cols: _KeyedColumns, partitions: int | None) -> DataFrame:
    exploded = events.select(*cols.used, cols.role).select(*cols.carried, *cols.role_fields)
    if partitions is not None:
        exploded = exploded.repartition(int(partitions), *cols.partition_keys)
    return exploded


ROLE_ROW_COLUMNS: tuple[str, ...] = (
    "event_time", "item_id", "category_id", "region", "price", "quantity", "_event", "_weight",
    "kind", "key", "_role",
)
"""Columns of :func:`role_rows`: an event's fields, its type's code (``_event``, the index in
:data:`features.events.EVENT_TYPES`), its activity weight, and its role (``kind``, ``key``
and ``_role``, the index of the kind in :data:`TILE_KINDS`)."""


def role_rows(events: DataFrame, *, slide_seconds: int, partitions: int | None = None
              ) -> DataFrame:
    """The rows :func:`keyed_tiles` aggregates (:data:`ROLE_ROW_COLUMNS`): each event once
    per role, with its event type and role as numbers; with ``partitions``, hash-partitioned
    by ``(kind, key)``, so every tile's rows are in one partition.

    Why: a fold of these rows into tiles outside Spark's aggregation (the stream's, in the
    JVM: ``pipelines.streaming.tile_fold``) starts from the same rows, so both apply the
    same roles, masks and codes.
    """
    return _role_rows(events, _keyed_columns(int(slide_seconds), 1), partitions)


ROLE_EVENT_COLUMNS: tuple[str, ...] = (
    "kind", "key", "tile_start", "event_type", "event_us", "item_id", "category_id", "region",
    "price", "quantity",
)
"""Columns of :func:`role_events`."""


def role_events(events: DataFrame, *, slide_seconds: int, carry: Sequence[str] = ()) -> DataFrame:
    """Each event once per role (:func:`keyed_tiles`' explode: a user event, an item event,
    a purchase also a sale), keyed by ``(kind, key, tile_start)``, with no aggregation:
    :data:`ROLE_EVENT_COLUMNS`, the event time in epoch microseconds (``event_us``).

    Why: a consumer that folds these rows into tiles itself
    (:func:`pipelines.streaming.pyfeatures.role_row` and ``merge_keyed``) reaches the rows
    of :func:`keyed_tiles` without a streaming aggregation, the larger part of a Real-time
    query's CPU (docs/streaming-performance.md). ``carry``: columns of ``events`` kept
    after these (a stream's source partition and offset).
    """
    cols = _keyed_columns(int(slide_seconds), 1)
    exploded = events.select(*cols.used, "event_type", *carry, cols.role).select(
        *cols.role_fields, *_named("event_type", "event_time", "item_id", "category_id",
                                   "region", "price", "quantity", *carry))
    return exploded.select(
        "kind", "key", tile_start_seconds("event_time", int(slide_seconds)).alias("tile_start"),
        "event_type", F.unix_micros("event_time").alias("event_us"),
        "item_id", "category_id", "region", "price", "quantity", *carry)


@dataclass(frozen=True)
class _KeyedColumns:
    used: tuple[Column, ...]
    carried: tuple[Column, ...]
    role: Column
    role_fields: tuple[Column, ...]
    partition_keys: tuple[Column, ...]
    group: tuple[Column, ...]
    aggregates: tuple[Column, ...]
    output: tuple[Column, ...]
    all: Column
    tile_group: tuple[Column, ...]
    tile_group_names: tuple[Column, ...]
    tile_output: tuple[Column, ...]


_KEYED_CACHE: dict[tuple[Any, int, int], _KeyedColumns] = {}


def _keyed_columns(slide_seconds: int, last_items_n: int) -> _KeyedColumns:
    """The column expressions of :func:`keyed_tiles`, cached per active Spark context.

    Columns are unresolved expression trees, valid for any DataFrame of the same
    context; a new context (a restarted session) gets new ones.
    """
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    key = (context, slide_seconds, last_items_n)
    cached = _KEYED_CACHE.get(key)
    if cached is None:
        for stale in [k for k in _KEYED_CACHE if k[0] is not context]:
            del _KEYED_CACHE[stale]
        cached = _KEYED_CACHE[key] = _build_keyed_columns(slide_seconds, last_items_n)
    return cached


def _build_keyed_columns(slide_seconds: int, last_items_n: int) -> _KeyedColumns:
    # each exploded row carries its role and its event type as small numbers, and its
    # activity weight, all found once per event: the aggregates test them for every
    # row, where comparing the kind's and the event type's strings, six or more times a
    # row, was about 8 % of the aggregation's samples in a profile of the stream's drain
    role, event = F.col("_role"), F.col("_event")
    user = role == F.lit(TILE_KINDS.index("user"))
    sales = role == F.lit(TILE_KINDS.index("sales"))
    priced = (role == F.lit(TILE_KINDS.index("item"))) & F.col("price").isNotNull()

    def coded(event_type: str) -> Column:
        return event == F.lit(EVENT_TYPES.index(event_type))

    event_code = F.lit(None).cast("int")
    for code, event_type in reversed(list(enumerate(EVENT_TYPES))):
        event_code = F.when(_is(event_type), F.lit(code)).otherwise(event_code)

    def role_of(kind: str, key: Column) -> Column:
        return F.struct(F.lit(kind).alias("kind"), key.alias("key"),
                        F.lit(TILE_KINDS.index(kind)).alias("role"))

    roles = F.array(
        role_of("user", F.col("user_id")),
        role_of("item", F.col("item_id")),
        F.when(_is("purchase"), role_of("sales", sales_key())),
    )
    used = ("event_time", "item_id", "category_id", "region", "price", "quantity")
    purchase = coded("purchase")
    pair = F.struct(F.col("event_time").alias("event_time"), F.col("item_id").alias("item_id"))
    category_entry = F.struct(
        F.col("category_id").alias("category_id"), F.col("_weight").alias("weight"))
    aggregates = (
        _count(coded("view")).alias("views"),
        _count(coded("add_to_cart")).alias("carts"),
        _count(purchase).alias("purchases"),
        _amount(purchase).alias("spend"),
        _units(purchase).alias("units"),
        F.collect_set(F.when(user & coded("view"), F.col("item_id"))).alias("items_viewed"),
        F.collect_list(F.when(user, category_entry)).alias("_categories"),
        F.collect_list(F.when(user & coded("view"), pair)).alias("_viewed"),
        F.collect_list(F.when(user & purchase, pair)).alias("_purchased"),
        F.max_by("category_id", F.when(~user, F.struct("event_time", "category_id")))
        .alias("category_id"),
        F.max_by("item_id", F.when(sales, F.struct("event_time", "item_id"))).alias("item_id"),
        F.max_by("region", F.when(~user, F.struct("event_time", "region"))).alias("region"),
        F.max_by("price", F.when(priced, F.struct("event_time", "price"))).alias("price"),
        F.max("event_time").alias("_max_time"),
        F.max(F.when(priced, F.col("event_time"))).alias("_price_time"),
    )

    def micros(entries: Column) -> Column:
        return F.transform(entries, lambda e: F.struct(
            F.unix_micros(e["event_time"]).alias("event_us"), e["item_id"].alias("item_id")))

    values = (
        "views", "carts", "purchases", "spend", "units", "items_viewed",
        sum_category_weights(F.col("_categories")).alias("category_weights"),
        micros(latest_distinct_items(F.col("_viewed"), last_items_n)).alias("last_viewed"),
        micros(latest_distinct_items(F.col("_purchased"), last_items_n)).alias("last_purchased"),
        "category_id", "item_id", "region", "price",
        F.unix_micros("_max_time").alias("max_us"),
        F.unix_micros("_price_time").alias("price_us"),
    )
    tile_start = tile_start_seconds("event_time", slide_seconds)
    # every name as a column object, built here once: PySpark turns a name into a
    # column with three calls into the JVM each time it is given one, about 0.1 s of a
    # micro-batch for the names below
    return _KeyedColumns(
        used=_named(*used, event_code.alias("_event"), _activity_weight().alias("_weight")),
        carried=_named(*used, "_event", "_weight"),
        role=F.explode(F.filter(roles, lambda r: r.isNotNull())).alias("_r"),
        role_fields=(F.col("_r.kind").alias("kind"), F.col("_r.key").alias("key"),
                     F.col("_r.role").alias("_role")),
        partition_keys=_named("kind", "key"),
        group=(*_named("kind", "key"), _window(slide_seconds)),
        aggregates=aggregates,
        output=_named("kind", "key", _tile_start_from_window(), *values),
        all=F.col("*"),
        tile_group=(F.xxhash64("kind", "key", tile_start).alias("_group_hash"),
                    tile_start.alias("tile_start")),
        tile_group_names=_named("_group_hash", "kind", "key", "tile_start"),
        tile_output=_named("kind", "key", "tile_start", *values),
    )


def _named(*columns: Column | str) -> tuple[Column, ...]:
    """Names as column objects (``F.col``), expressions as they are."""
    return tuple(F.col(c) if isinstance(c, str) else c for c in columns)
