"""A micro-batch's tiles folded in the JVM: shopstream's ``TileFold`` over the role rows.

The micro-batch's online path needs :func:`features.tiles.keyed_tiles`' rows, one per
(kind, key, tile), each key's in one partition. Spark's aggregation of the role rows was the
largest part of the path's JVM time, and regrouping or reordering it did not make it cheaper
(docs/streaming-performance.md, "Where the online path's JVM time goes"). ``TileFold``
(``pipelines/infra/jvm/TileFold.java``, built into shopstream's jar) folds each partition's
role rows (:func:`features.tiles.role_rows`) into the same rows in one pass with a hash map.
``tests/integration/test_tile_fold.py`` holds its rows equal to Spark's.

Without the jar (no ``javac``), :func:`tiles` is Spark's aggregation, with the same rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TileFolder", "has_tile_fold", "folded_tiles", "tiles"]

TileFolder = Literal["auto", "jvm", "spark"]
"""Who folds the tiles: ``jvm`` (``TileFold``), ``spark`` (its aggregation,
:func:`features.tiles.keyed_tiles`), or ``auto``: ``jvm`` when the session has the class."""


def has_tile_fold(spark: object) -> bool:
    """Whether the session's JVM has ``TileFold`` (shopstream's jar was built)."""
    from pipelines.infra.jvm_jar import TILE_FOLD_CLASS, session_has_class

    return session_has_class(spark, TILE_FOLD_CLASS)


def folded_tiles(events: DataFrame, *, slide_seconds: int, last_items_n: int,
                 partitions: int) -> DataFrame:
    """``keyed_tiles(events, ..., partitions=partitions)``'s rows, folded by ``TileFold``:
    :data:`features.tiles.KEYED_TILE_COLUMNS`, every tile of a key in one partition.
    ``events``: a static DataFrame of valid events (a micro-batch's)."""
    from pyspark.sql import DataFrame as SparkDataFrame

    from features.events import EVENT_TYPES
    from features.tiles import TILE_KINDS, role_rows

    roles = role_rows(events, slide_seconds=slide_seconds, partitions=partitions)
    spark = events.sparkSession
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    jdf = jvm.shopstream.TileFold.apply(
        roles._jdf, int(slide_seconds), int(last_items_n),
        *(EVENT_TYPES.index(t) for t in ("view", "add_to_cart", "purchase")),
        *(TILE_KINDS.index(k) for k in ("user", "item", "sales")))
    return SparkDataFrame(jdf, spark)


def tiles(events: DataFrame, *, slide_seconds: int, last_items_n: int, partitions: int,
          folder: TileFolder = "auto") -> DataFrame:
    """A micro-batch's tiles (:data:`features.tiles.KEYED_TILE_COLUMNS`), hash-partitioned
    by (kind, key), folded by ``folder``."""
    from features.tiles import keyed_tiles

    use_jvm = folder == "jvm" or (folder == "auto" and has_tile_fold(events.sparkSession))
    if use_jvm:
        return folded_tiles(events, slide_seconds=slide_seconds, last_items_n=last_items_n,
                            partitions=partitions)
    return keyed_tiles(events, slide_seconds=slide_seconds, last_items_n=last_items_n,
                       partitions=partitions)
