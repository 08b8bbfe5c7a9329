"""``shopstream verify``: streamed online features vs a batch recomputation over the same events.

For a sample of users and items that have events in a time range:

1. read what the stream wrote to Redis (Feast's layout, decoded with
   :mod:`features.feast_layout`), including each entity's event timestamp
   ``T`` (the stream's clock when it last updated the entity);
2. recompute the same features as of each entity's ``T`` with the backfill's
   transform (:func:`features.windows.features_over_time`) over the raw events
   in the offline store -- the valid, deduplicated, on-time events the stream
   itself stored;
3. compare value by value: integers, strings, timestamps and lists exactly,
   doubles to a relative 1e-9 (a sum of prices in another order may differ in
   its last bit).

Top sellers and trending lists are compared for every scope as of the lists'
own as-of time (the ``top:meta`` hash): same items, same scores.

No events go to the driver: only the sampled ids, their online values and the
recomputed rows of those ids (small by construction).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from features import online_keys
from features.feast_layout import (
    ITEM_STATS,
    USER_ACTIVITY,
    ViewSpec,
    decode_timestamp,
    timestamp_field,
)
from features.windows import LONG_WINDOW, WINDOW_SECONDS, features_over_time
from pipelines import offline_store
from pipelines.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Mismatch", "VerifyReport", "run_verify", "compare_values", "REL_TOL"]

log = logging.getLogger(__name__)

REL_TOL = 1e-9
"""Relative tolerance for doubles (summation order), everything else is exact."""


@dataclass(frozen=True)
class Mismatch:
    kind: str
    entity: str
    as_of: datetime | None
    feature: str
    online: Any
    batch: Any


@dataclass
class VerifyReport:
    """Per kind (``user_activity``, ``item_stats``, ``top_items``): how many matched."""

    kind: str
    compared: int = 0
    matched: int = 0
    as_of_times: int = 0
    missing_online: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.matched / self.compared if self.compared else 1.0


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=REL_TOL)


def compare_values(spec: ViewSpec, online: Mapping[str, Any], batch: Mapping[str, Any]) -> list[str]:
    """Names of the features whose values differ (doubles within :data:`REL_TOL`)."""
    bad = []
    for name, kind in spec.features:
        a, b = online.get(name), batch.get(name)
        if kind == "double":
            ok = _close(a, b)
        elif kind == "double_list":
            ok = (a is None) == (b is None) and (
                a is None or (len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))))
        else:
            ok = a == b
        if not ok:
            bad.append(name)
    return bad


def _read_online(client: Any, spec: ViewSpec, ids: list[str]) -> dict[str, tuple[datetime | None, dict]]:
    """id -> (event timestamp, decoded features) for the ids that have a value."""
    with client.pipeline(transaction=False) as pipe:
        for entity in ids:
            pipe.hgetall(spec.redis_key(entity))
        stored = pipe.execute()
    out = {}
    ts_field = timestamp_field(spec.name)
    for entity, mapping in zip(ids, stored, strict=True):
        if ts_field in mapping:
            out[entity] = (decode_timestamp(mapping[ts_field]), spec.decode(mapping))
    return out


def _normalized(spec: ViewSpec, row: Mapping[str, Any]) -> dict[str, Any]:
    """A recomputed row as Redis would hold it (encode, then decode: same rounding, nulls)."""
    _, mapping = spec.encode(row)
    return spec.decode(mapping)


def _sample_ids(events: DataFrame, column: str, sample: int, seed: int) -> list[str]:
    from pyspark.sql import functions as F

    ids = (events.select(column).distinct()
           .orderBy(F.xxhash64(F.col(column), F.lit(seed)), column).limit(sample))
    return [r[0] for r in ids.collect()]


def _recompute(spark: SparkSession, settings: Settings, events: DataFrame,
               as_of: datetime) -> Any:
    return features_over_time(
        events, start=as_of, step_seconds=1, count=1,
        slide_seconds=settings.feature_slide_seconds,
        last_items_n=settings.feature_last_items_n, top_n=settings.feature_top_n,
    )


def _verify_entities(spark: SparkSession, settings: Settings, client: Any, spec: ViewSpec,
                     events: DataFrame, ids: list[str], max_as_of: int,
                     report: VerifyReport) -> None:
    from pyspark.sql import functions as F

    online = _read_online(client, spec, ids)
    report.missing_online = len(ids) - len(online)
    by_time: dict[datetime, list[str]] = {}
    for entity, (ts, _) in online.items():
        if ts is not None:
            by_time.setdefault(ts, []).append(entity)
    # the as-of times that cover the most sampled entities, at most max_as_of of them
    chosen = sorted(by_time, key=lambda t: (-len(by_time[t]), t))[:max_as_of]
    report.as_of_times = len(chosen)
    long = timedelta(seconds=WINDOW_SECONDS[LONG_WINDOW] + settings.feature_slide_seconds)
    for as_of in sorted(chosen):
        group = by_time[as_of]
        scoped = events.where(F.col(spec.join_key).isin(group)).where(
            (F.col("event_time") > F.lit(as_of - long)) & (F.col("event_time") <= F.lit(as_of)))
        frames = _recompute(spark, settings, scoped, as_of)
        rows = frames.users if spec is USER_ACTIVITY else frames.items
        batch = {r[spec.join_key]: _normalized(spec, r.asDict()) for r in rows.collect()}
        for entity in group:
            report.compared += 1
            values = online[entity][1]
            expected = batch.get(entity)
            if expected is None:
                report.mismatches.append(Mismatch(spec.name, entity, as_of, "*", values, None))
                continue
            bad = compare_values(spec, values, expected)
            if bad:
                report.mismatches.extend(
                    Mismatch(spec.name, entity, as_of, name, values.get(name), expected.get(name))
                    for name in bad)
            else:
                report.matched += 1


def _verify_top(spark: SparkSession, settings: Settings, client: Any, events: DataFrame,
                report: VerifyReport) -> None:
    from pyspark.sql import functions as F

    meta = {k.decode(): int(v) for k, v in client.hgetall(online_keys.top_meta_key()).items()}
    if not meta:
        return
    # compare the lists of the most common as-of time (the stream writes all at once)
    as_of_ms, _ = Counter(meta.values()).most_common(1)[0]
    as_of = datetime.fromtimestamp(as_of_ms / 1000, tz=UTC)
    report.as_of_times = 1
    long = timedelta(seconds=WINDOW_SECONDS[LONG_WINDOW] + settings.feature_slide_seconds)
    scoped = events.where((F.col("event_time") > F.lit(as_of - long))
                          & (F.col("event_time") <= F.lit(as_of)))
    rows = _recompute(spark, settings, scoped, as_of).top_items.collect()
    expected: dict[str, dict[str, float]] = {}
    for r in rows:
        scope = online_keys.scope_for(r["category_id"], r["region"])
        name = online_keys.top_meta_field(r["kind"], r["window"], scope)
        expected.setdefault(name, {})[r["item_id"]] = float(r["score"])
    fields = {name for name, ms in meta.items() if ms == as_of_ms} | set(expected)
    from pipelines.online_writer import top_item_key

    for name in sorted(fields):
        kind, window, scope = name.split(":", 2)
        stored = {m.decode(): s for m, s in
                  client.zrange(top_item_key(kind, window, scope), 0, -1, withscores=True)}
        want = expected.get(name, {})
        report.compared += 1
        same = stored.keys() == want.keys() and all(_close(stored[k], want[k]) for k in want)
        if same:
            report.matched += 1
        else:
            report.mismatches.append(Mismatch("top_items", name, as_of, "members", stored, want))


def run_verify(
    settings: Settings,
    *,
    sample: int = 200,
    since: datetime | None = None,
    until: datetime | None = None,
    kinds: Iterable[str] = ("user_activity", "item_stats", "top_items"),
    max_as_of: int = 25,
    seed: int = 0,
    spark: SparkSession | None = None,
) -> list[VerifyReport]:
    """Compare online values with the batch recomputation; one report per kind.

    Parameters
    ----------
    sample
        Users and items each (ids with events in ``[since, until]``, a
        deterministic pseudo-random pick by ``seed``).
    since, until
        Event-time range of the events whose entities are sampled (default: all).
    max_as_of
        At most this many distinct as-of times are recomputed per kind (the ones
        covering most of the sample); entities at other times are skipped.
    """
    from pipelines.connections import redis_client
    from pipelines.spark import spark_session

    spark = spark or spark_session(settings, app_name="shopstream-verify", kafka=False)
    offline_store.configure_parquet(spark)
    events = offline_store.read_events(spark, settings).persist()
    in_range = offline_store.read_events(spark, settings, since, until) if (since or until) \
        else events
    client = redis_client(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 10_000))
    reports = []
    try:
        for kind in kinds:
            report = VerifyReport(kind)
            if kind in (USER_ACTIVITY.name, ITEM_STATS.name):
                spec = USER_ACTIVITY if kind == USER_ACTIVITY.name else ITEM_STATS
                ids = _sample_ids(in_range, spec.join_key, sample, seed)
                _verify_entities(spark, settings, client, spec, events, ids, max_as_of, report)
            elif kind == "top_items":
                _verify_top(spark, settings, client, events, report)
            else:
                raise ValueError(f"unknown kind {kind!r}")
            log.info("verify %s: %d/%d match (%.1f%%) over %d as-of times", kind, report.matched,
                     report.compared, 100 * report.rate, report.as_of_times)
            reports.append(report)
    finally:
        client.close()
        events.unpersist()
    return reports
