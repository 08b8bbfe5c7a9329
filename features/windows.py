"""Layer 2 of the feature computation: tiles + an as-of time -> feature rows.

Semantics (decided for shopstream; the stream and the backfill share them)
-----------------------------------------------------------------------------
*Tiles.* The tile size ``s`` is the ``feature_slide_seconds`` setting (60 s),
one size for every window; ``tile_start(t) = floor(epoch_seconds(t)/s)*s``
(:mod:`features.tiles` builds them).

*Sliding windows.* A window of length ``W`` (``1h`` = 3600 s, ``24h`` = 86400 s)
"as of ``T``" covers the ``W/s`` most recent tiles, including the partial tile
that contains ``T``: the events with ``tile_start(event_time) > tile_start(T) - W``
and ``event_time <= T``. So the window is up to one tile longer than ``W`` in
wall-clock terms and slides once per tile, which is the refresh cadence. An event
exactly at ``T`` counts; an event a microsecond after ``T`` does not.

*Finalize.* :func:`finalize_user_features`, :func:`finalize_item_features` and
:func:`finalize_top_items` take tiles and ``T`` (a literal, or a column so that
one call computes many as-of times) and sum the tiles of each window. They
assume the tiles hold only events at or before ``T`` -- true of the stream's
state "now"; the backfill builds a separate *head* tile per as-of time from
the events of ``T``'s own tile that are ``<= T`` (:func:`features_over_time`).
Tiles after ``tile_start(T)`` are ignored. Every ``(entity, T)`` present in the
input gets a row; tiles older than the long window contribute zeros, so a caller
that passes an entity's expired tiles gets one all-zero row for it (the backfill
emits exactly one such row when an entity falls out of the 24h window, so a
point-in-time lookup after that reads zeros, not stale counts).

*Per user* (window suffix ``_1h`` / ``_24h``): ``views``, ``carts``
(add-to-carts), ``purchases``, ``spend`` (sum of ``price * quantity`` of
purchases); ``distinct_items_viewed_1h``; over the 24h window: ``last_event_time``
(truncated to whole seconds, as Feast's ``UnixTimestamp`` stores seconds; null
when no event), the category affinity (:data:`features.tiles.ACTIVITY_WEIGHTS`:
view 1, add-to-cart 3, purchase 5, summed per category) as parallel arrays
``category_affinity_ids`` / ``category_affinity_weights`` sorted by weight
descending then category ascending, ``top_category`` their first entry (null
when none), ``last_viewed_items``: the last ``N`` distinct items viewed,
most recent first (equal times by item_id ascending), and
``last_purchased_items``: the same for purchases (serving removes them from
the user's recommendations).

*Per item*: ``views``, ``carts``, ``purchases``, ``units`` (sum of quantity of
purchases), ``revenue`` (sum of ``price * quantity`` of purchases) per window;
``conversion_rate_{w} = purchases_{w} / views_{w}``, **0.0 when views are 0**
(so it is always defined; it can exceed 1 when purchases arrive without views,
as in order-only data sets); ``category_id`` from the item's latest event in
the 24h window; and the trending score (:func:`trending_score`).

*Trending score.* The last hour's units against the 24h average hourly pace,
add-one smoothed so it is finite and positive at zero::

    trending_score = (units_1h + 1) / (units_24h * 3600/86400 + 1)

1.0 means "selling at its daily pace", above 1 "hotter than usual". An item
with no sales scores 1.0.

*Top sellers and trending* (:func:`finalize_top_items`): units sold per item
per scope -- global, per category, per region, per category x region -- in each
window; kind ``top`` ranks by units (windows 1h and 24h), kind ``trend`` ranks
by the trending score (window ``1h`` only, since it already compares 1h with
24h; only items with a sale in the last hour are candidates). Only items with
units > 0 in the window rank; the top ``N`` per scope, ties broken by
``item_id`` ascending, rank 1-based and deterministic.

Output rows carry only types Feast can store: bigint (Int64), double
(Float64), string (String), timestamp (UnixTimestamp), array<string>
(Array(String)), array<double> (Array(Float64)); ``event_timestamp`` is the
as-of time ``T`` and ``created`` the computation time.

Everything here is DataFrame in, DataFrame out: no session, no I/O, no settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from features.online_keys import WINDOWS
from features.tiles import (
    item_tiles,
    latest_distinct_items,
    sales_tiles,
    sum_category_weights,
    tile_start_seconds,
    user_tiles,
)

__all__ = [
    "WINDOW_SECONDS",
    "SHORT_WINDOW",
    "LONG_WINDOW",
    "USER_FEATURE_COLUMNS",
    "ITEM_FEATURE_COLUMNS",
    "TOP_ITEM_COLUMNS",
    "AsOf",
    "FeatureFrames",
    "in_window",
    "conversion_rate",
    "trending_score",
    "finalize_user_features",
    "finalize_item_features",
    "finalize_top_items",
    "features_over_time",
]

WINDOW_SECONDS: Mapping[str, int] = MappingProxyType({"1h": 3600, "24h": 86400})
"""Window name (as in :data:`features.online_keys.WINDOWS`) -> length in seconds."""
assert tuple(WINDOW_SECONDS) == WINDOWS
SHORT_WINDOW = "1h"
LONG_WINDOW = "24h"

USER_FEATURE_COLUMNS: tuple[str, ...] = (
    "user_id",
    "views_1h",
    "views_24h",
    "carts_1h",
    "carts_24h",
    "purchases_1h",
    "purchases_24h",
    "spend_1h",
    "spend_24h",
    "distinct_items_viewed_1h",
    "last_event_time",
    "top_category",
    "category_affinity_ids",
    "category_affinity_weights",
    "last_viewed_items",
    "last_purchased_items",
    "event_timestamp",
    "created",
)
"""Columns of :func:`finalize_user_features`, in order (Feast view ``user_activity``)."""

ITEM_FEATURE_COLUMNS: tuple[str, ...] = (
    "item_id",
    "category_id",
    "views_1h",
    "views_24h",
    "carts_1h",
    "carts_24h",
    "purchases_1h",
    "purchases_24h",
    "units_1h",
    "units_24h",
    "revenue_1h",
    "revenue_24h",
    "conversion_rate_1h",
    "conversion_rate_24h",
    "trending_score",
    "event_timestamp",
    "created",
)
"""Columns of :func:`finalize_item_features`, in order (Feast view ``item_stats``)."""

TOP_ITEM_COLUMNS: tuple[str, ...] = (
    "kind",
    "window",
    "category_id",
    "region",
    "item_id",
    "score",
    "rank",
    "event_timestamp",
    "created",
)
"""Columns of :func:`finalize_top_items`.

``kind`` is ``top`` (score = units) or ``trend`` (score = trending score);
``window`` ``1h``/``24h``; ``category_id`` / ``region`` name the scope (null =
all), so the writer builds the key with :func:`features.online_keys.scope_for`;
``rank`` 1..N; ``event_timestamp`` the as-of time, ``created`` the computation time.
"""

AsOf = datetime | Column | str
"""An as-of time: a datetime literal, a timestamp column, or the name of one."""

_AS_OF = "_as_of"


def _as_of_col(as_of: AsOf) -> Column:
    if isinstance(as_of, Column):
        return as_of
    if isinstance(as_of, str):
        return F.col(as_of)
    if as_of.tzinfo is None:
        as_of = as_of.replace(tzinfo=UTC)
    return F.lit(as_of.astimezone(UTC)).cast("timestamp")


def _created_col(created: datetime | None) -> Column:
    return F.current_timestamp() if created is None else _as_of_col(created)


def _check_slide(slide_seconds: int) -> None:
    for name, seconds in WINDOW_SECONDS.items():
        if slide_seconds < 1 or seconds % slide_seconds:
            raise ValueError(f"slide_seconds={slide_seconds} must divide the {name} window")


def in_window(tile_start: Column, as_of: Column, window: str, slide_seconds: int) -> Column:
    """True when a tile is one of the ``W/s`` most recent tiles as of ``as_of``."""
    current = tile_start_seconds(as_of, slide_seconds)
    return (tile_start > current - F.lit(WINDOW_SECONDS[window])) & (tile_start <= current)


def conversion_rate(purchases: Column, views: Column) -> Column:
    """``purchases / views``, 0.0 when there are no views."""
    return F.when(views > 0, purchases.cast("double") / views.cast("double")).otherwise(
        F.lit(0.0)
    )


def trending_score(units_short: Column, units_long: Column) -> Column:
    """``(units_1h + 1) / (units_24h * 1h/24h + 1)``: finite, 1.0 at zero sales."""
    ratio = WINDOW_SECONDS[SHORT_WINDOW] / WINDOW_SECONDS[LONG_WINDOW]
    return (units_short.cast("double") + F.lit(1.0)) / (
        units_long.cast("double") * F.lit(ratio) + F.lit(1.0)
    )


def _in(window: str) -> Column:
    """The per-row flag :func:`_prepare` computed: the tile is in ``window`` as of ``T``."""
    return F.col(f"_in_{window}")


def _prepare(tiles: DataFrame, as_of: AsOf, slide_seconds: int) -> DataFrame:
    """Tiles at or before ``tile_start(T)``, with ``T`` and one in-window flag per window.

    The flags are computed once per row here rather than in every aggregate.
    """
    _check_slide(slide_seconds)
    with_as_of = tiles.withColumn(_AS_OF, _as_of_col(as_of).cast("timestamp"))
    current = tile_start_seconds(F.col(_AS_OF), slide_seconds)
    flags = {
        f"_in_{w}": (F.col("tile_start") > F.col("_current") - F.lit(seconds))
        for w, seconds in WINDOW_SECONDS.items()
    }
    return (with_as_of.withColumn("_current", current)
            .where(F.col("tile_start") <= F.col("_current"))
            .withColumns(flags)
            .drop("_current"))


def _windowed(column: str, window: str, slide_seconds: int, kind: str = "bigint") -> Column:
    zero = F.lit(0.0) if kind == "double" else F.lit(0)
    return F.coalesce(F.sum(F.when(_in(window), F.col(column))), zero).cast(kind)


def _windowed_list(column: str, window: str, slide_seconds: int) -> Column:
    return F.flatten(F.collect_list(F.when(_in(window), F.col(column))))


def finalize_user_features(
    tiles: DataFrame,
    as_of: AsOf,
    *,
    slide_seconds: int,
    last_items_n: int,
    created: datetime | None = None,
) -> DataFrame:
    """User feature rows as of ``T`` from :func:`features.tiles.user_tiles` output.

    Parameters
    ----------
    tiles
        User tiles (static; e.g. the stream's state in ``foreachBatch``).
    as_of
        ``T``: a datetime, or a timestamp column / column name of ``tiles`` to
        compute many as-of times at once (one row per user and distinct ``T``).
    slide_seconds
        The tile size the tiles were built with.
    last_items_n
        Length of ``last_viewed_items`` and ``last_purchased_items``.
    created
        Value of the ``created`` column (default: the current timestamp).

    Returns
    -------
    DataFrame
        :data:`USER_FEATURE_COLUMNS`, one row per (user, ``T``).
    """
    prepared = _prepare(tiles, as_of, slide_seconds)
    aggs: list[Column] = []
    for name in ("views", "carts", "purchases"):
        for window in WINDOW_SECONDS:
            aggs.append(_windowed(name, window, slide_seconds).alias(f"{name}_{window}"))
    for window in WINDOW_SECONDS:
        aggs.append(_windowed("spend", window, slide_seconds, "double").alias(f"spend_{window}"))
    long_cond = _in(LONG_WINDOW)
    aggs += [
        _windowed_list("items_viewed", SHORT_WINDOW, slide_seconds).alias("_items_1h"),
        F.max(F.when(long_cond, F.col("last_event_time"))).alias("_last_event_time"),
        _windowed_list("category_weights", LONG_WINDOW, slide_seconds).alias("_categories"),
        _windowed_list("last_viewed", LONG_WINDOW, slide_seconds).alias("_viewed"),
        _windowed_list("last_purchased", LONG_WINDOW, slide_seconds).alias("_purchased"),
    ]
    grouped = prepared.groupBy("user_id", _AS_OF).agg(*aggs)
    affinity = F.array_sort(
        sum_category_weights(F.col("_categories")),
        lambda left, right: F.when(left["weight"] > right["weight"], F.lit(-1))
        .when(left["weight"] < right["weight"], F.lit(1))
        .when(left["category_id"] < right["category_id"], F.lit(-1))
        .when(left["category_id"] > right["category_id"], F.lit(1))
        .otherwise(F.lit(0)),
    )
    return grouped.withColumn("_affinity", affinity).select(
        "user_id",
        *[f"{n}_{w}" for n in ("views", "carts", "purchases", "spend") for w in WINDOW_SECONDS],
        F.size(F.array_distinct(F.col("_items_1h"))).cast("bigint").alias(
            "distinct_items_viewed_1h"
        ),
        F.date_trunc("second", F.col("_last_event_time")).alias("last_event_time"),
        F.get(F.col("_affinity"), 0)["category_id"].alias("top_category"),
        F.transform(F.col("_affinity"), lambda e: e["category_id"]).alias("category_affinity_ids"),
        F.transform(F.col("_affinity"), lambda e: e["weight"]).alias("category_affinity_weights"),
        F.transform(
            latest_distinct_items(F.col("_viewed"), last_items_n), lambda e: e["item_id"]
        ).alias("last_viewed_items"),
        F.transform(
            latest_distinct_items(F.col("_purchased"), last_items_n), lambda e: e["item_id"]
        ).alias("last_purchased_items"),
        F.col(_AS_OF).alias("event_timestamp"),
        _created_col(created).alias("created"),
    )


def finalize_item_features(
    tiles: DataFrame,
    as_of: AsOf,
    *,
    slide_seconds: int,
    created: datetime | None = None,
) -> DataFrame:
    """Item feature rows as of ``T`` from :func:`features.tiles.item_tiles` output.

    Parameters are those of :func:`finalize_user_features`; returns
    :data:`ITEM_FEATURE_COLUMNS`, one row per (item, ``T``).
    """
    prepared = _prepare(tiles, as_of, slide_seconds)
    long_cond = _in(LONG_WINDOW)
    aggs: list[Column] = [
        # tiles of one item cover disjoint time ranges, so their category_time values
        # differ: a plain long ordering is deterministic (and keeps the hash aggregate)
        F.max_by(
            F.col("category_id"), F.when(long_cond, F.unix_micros(F.col("category_time")))
        ).alias("category_id"),
    ]
    for name in ("views", "carts", "purchases", "units"):
        for window in WINDOW_SECONDS:
            aggs.append(_windowed(name, window, slide_seconds).alias(f"{name}_{window}"))
    for window in WINDOW_SECONDS:
        aggs.append(
            _windowed("revenue", window, slide_seconds, "double").alias(f"revenue_{window}")
        )
    grouped = prepared.groupBy("item_id", _AS_OF).agg(*aggs)
    return grouped.select(
        "item_id",
        "category_id",
        *[f"{n}_{w}" for n in ("views", "carts", "purchases", "units", "revenue")
          for w in WINDOW_SECONDS],
        *[
            conversion_rate(F.col(f"purchases_{w}"), F.col(f"views_{w}")).alias(
                f"conversion_rate_{w}"
            )
            for w in WINDOW_SECONDS
        ],
        trending_score(F.col(f"units_{SHORT_WINDOW}"), F.col(f"units_{LONG_WINDOW}")).alias(
            "trending_score"
        ),
        F.col(_AS_OF).alias("event_timestamp"),
        _created_col(created).alias("created"),
    )


def finalize_top_items(
    tiles: DataFrame,
    as_of: AsOf,
    *,
    slide_seconds: int,
    top_n: int,
    created: datetime | None = None,
) -> DataFrame:
    """Top sellers and trending items per window and scope as of ``T``.

    Parameters
    ----------
    tiles
        :func:`features.tiles.sales_tiles` output.
    as_of
        ``T``, as in :func:`finalize_user_features`.
    slide_seconds
        The tile size the tiles were built with.
    top_n
        How many items each (kind, window, scope) keeps (``feature_top_n``).
    created
        Value of the ``created`` column (default: the current timestamp).

    Returns
    -------
    DataFrame
        :data:`TOP_ITEM_COLUMNS`; per (``T``, kind, window, scope) at most
        ``top_n`` rows ranked by score descending, then item_id ascending.
    """
    prepared = _prepare(tiles, as_of, slide_seconds)
    null = F.lit(None).cast("string")
    cat, reg = F.col("category_id"), F.col("region")
    scopes = F.array(
        F.struct(null.alias("c"), null.alias("r")),
        F.struct(cat.alias("c"), null.alias("r")),
        F.struct(null.alias("c"), reg.alias("r")),
        F.struct(cat.alias("c"), reg.alias("r")),
    )
    # windowed units per (T, item, category, region) first, then summed per scope: the
    # scope explode (x4) runs on the reduced rows rather than on every tile
    per_key = prepared.groupBy(_AS_OF, "item_id", "category_id", "region").agg(
        *[_windowed("units", w, slide_seconds).alias(f"units_{w}") for w in WINDOW_SECONDS]
    )
    scoped = per_key.select(
        _AS_OF, "item_id", *[f"units_{w}" for w in WINDOW_SECONDS],
        F.explode(scopes).alias("_scope"),
    ).select(
        _AS_OF,
        "item_id",
        *[f"units_{w}" for w in WINDOW_SECONDS],
        F.col("_scope.c").alias("category_id"),
        F.col("_scope.r").alias("region"),
    )
    units = scoped.groupBy(_AS_OF, "category_id", "region", "item_id").agg(
        *[F.sum(f"units_{w}").cast("bigint").alias(f"units_{w}") for w in WINDOW_SECONDS]
    )
    candidates = [
        F.struct(
            F.lit("top").alias("kind"),
            F.lit(w).alias("window"),
            F.col(f"units_{w}").cast("double").alias("score"),
            (F.col(f"units_{w}") > 0).alias("ok"),
        )
        for w in WINDOW_SECONDS
    ]
    candidates.append(
        F.struct(
            F.lit("trend").alias("kind"),
            F.lit(SHORT_WINDOW).alias("window"),
            trending_score(F.col(f"units_{SHORT_WINDOW}"), F.col(f"units_{LONG_WINDOW}")).alias(
                "score"
            ),
            (F.col(f"units_{SHORT_WINDOW}") > 0).alias("ok"),
        )
    )
    exploded = (
        units.select(_AS_OF, "category_id", "region", "item_id",
                     F.explode(F.array(*candidates)).alias("_c"))
        .where(F.col("_c.ok"))
        .select(
            _AS_OF,
            F.col("_c.kind").alias("kind"),
            F.col("_c.window").alias("window"),
            "category_id",
            "region",
            "item_id",
            F.col("_c.score").alias("score"),
        )
    )
    ranking = Window.partitionBy(_AS_OF, "kind", "window", "category_id", "region").orderBy(
        F.col("score").desc(), F.col("item_id").asc()
    )
    return (
        exploded.withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= F.lit(int(top_n)))
        .select(
            "kind", "window", "category_id", "region", "item_id", "score",
            F.col("rank").cast("int").alias("rank"),
            F.col(_AS_OF).alias("event_timestamp"),
            _created_col(created).alias("created"),
        )
    )


class FeatureFrames(NamedTuple):
    """The three outputs of a batch computation (lazy DataFrames)."""

    users: DataFrame
    items: DataFrame
    top_items: DataFrame


def _epoch_micros(ts: datetime) -> int:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    delta = ts.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _floor_div(a: Column, b: int) -> Column:
    return ((a - F.pmod(a, F.lit(b))) / F.lit(b)).cast("bigint")


def _ceil_div(a: Column, b: int) -> Column:
    return -_floor_div(-a, b)


def _explode_as_of(df: DataFrame, lo: Column, hi: Column, start_us: int, step_us: int,
                   count: int) -> DataFrame:
    """Repeat each row for the as-of indices ``j`` in ``[lo, hi] ∩ [0, count)``."""
    lo = F.greatest(lo, F.lit(0))
    hi = F.least(hi, F.lit(count - 1))
    j = F.explode(F.sequence(lo, hi))
    return (
        df.where(lo <= hi)
        .select("*", j.alias("_j"))
        .withColumn(_AS_OF, F.timestamp_micros(F.lit(start_us) + F.col("_j") * F.lit(step_us)))
        .drop("_j")
    )


def features_over_time(
    events: DataFrame,
    *,
    start: datetime,
    step_seconds: int,
    count: int,
    slide_seconds: int,
    last_items_n: int,
    top_n: int,
    created: datetime | None = None,
) -> FeatureFrames:
    """Batch features at ``T_j = start + j * step_seconds`` for ``j = 0 .. count-1``.

    The exact window semantics of the module docstring at every ``T_j``, without
    a join: each *full* tile (``tile_start < tile_start(T_j)``) is repeated for
    the as-of times whose windows it can reach, plus the first one after its
    24h window has passed (so the entity gets one all-zero row), and each event
    in the tile of some ``T_j`` and at or before it goes into a *head* tile for
    that ``T_j``. Events after the last ``T_j`` are ignored; to be complete at
    ``T_0`` the input should start 24h before it.

    Parameters
    ----------
    events
        Validated events (static), deduplicated by ``event_id`` and ``event_time``.
    start, step_seconds, count
        The as-of series (``step_seconds`` >= 1, any value; the snapshot cadence).
    slide_seconds, last_items_n, top_n, created
        As in the finalize functions.

    Returns
    -------
    FeatureFrames
        ``users`` (:data:`USER_FEATURE_COLUMNS`), ``items``
        (:data:`ITEM_FEATURE_COLUMNS`), ``top_items`` (:data:`TOP_ITEM_COLUMNS`).
    """
    _check_slide(slide_seconds)
    if step_seconds < 1 or count < 1:
        raise ValueError("step_seconds and count must be >= 1")
    start_us = _epoch_micros(start)
    step_us = int(step_seconds) * 1_000_000
    slide_us = int(slide_seconds) * 1_000_000
    long_us = WINDOW_SECONDS[LONG_WINDOW] * 1_000_000

    last_us = start_us + (count - 1) * step_us
    events = events.where(F.unix_micros(F.col("event_time")) <= F.lit(last_us))

    # head events: T_j in [event_time, tile_start(event) + s)
    event_us = F.unix_micros(F.col("event_time"))
    tile_us = tile_start_seconds(F.col("event_time"), slide_seconds) * F.lit(1_000_000)
    head_events = _explode_as_of(
        events,
        _ceil_div(event_us - F.lit(start_us), step_us),
        _ceil_div(tile_us + F.lit(slide_us - start_us), step_us) - F.lit(1),
        start_us, step_us, count,
    )

    def expand_full(tiles: DataFrame) -> DataFrame:
        # T_j in [tile_start + s, tile_start + 24h + step)
        t0 = F.col("tile_start") * F.lit(1_000_000)
        return _explode_as_of(
            tiles,
            _ceil_div(t0 + F.lit(slide_us - start_us), step_us),
            _ceil_div(t0 + F.lit(long_us + step_us - start_us), step_us) - F.lit(1),
            start_us, step_us, count,
        )

    def both(tile_fn, **kwargs) -> DataFrame:  # type: ignore[no-untyped-def]
        full = expand_full(tile_fn(events, slide_seconds=slide_seconds, **kwargs))
        head = tile_fn(head_events, slide_seconds=slide_seconds, by=[_AS_OF], **kwargs)
        return full.unionByName(head)

    users = finalize_user_features(
        both(user_tiles, last_items_n=last_items_n), _AS_OF,
        slide_seconds=slide_seconds, last_items_n=last_items_n, created=created,
    )
    items = finalize_item_features(
        both(item_tiles), _AS_OF, slide_seconds=slide_seconds, created=created
    )
    top = finalize_top_items(both(sales_tiles), _AS_OF, slide_seconds=slide_seconds, top_n=top_n,
                             created=created)
    return FeatureFrames(users, items, top)
