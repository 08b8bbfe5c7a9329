"""The in-process serving client, sync and async, that the HTTP API is built on.

Use it from Python or a notebook::

    from pipelines.settings import Settings
    from serving.client import ServingClient

    with ServingClient(Settings()) as client:
        client.top_sellers(window="1h", region="United Kingdom", k=5)
        client.recommendations("u123", k=10)

    # in async code (FastAPI, a notebook cell with top-level await)
    client = AsyncServingClient(Settings())
    await client.recommendations("u123")
    await client.aclose()

How it stays fast
-----------------
Each request is written once, as a *flow*: a generator that yields the Redis
commands it needs and receives their replies (``sans-I/O``). The sync and the
async client only differ in how they run a flow's batches: each batch is one
pipelined round trip over a pooled connection (hiredis parses the replies when
installed, which redis-py picks by itself). A recommendation is normally one
round trip: the live model pointer, the user's candidates, the user's features
and the trending list, together. The live pointer is kept in process and
re-read inside that same pipeline, so a model switch is seen on the next
request at no extra cost; only the request that sees the switch pays a second
trip. Item categories (for the category boost) are cached in process.

How it stays safe
-----------------
Every Redis read has a socket timeout (``redis_socket_timeout_ms``), the pool
a connect timeout, the async client a deadline for the whole request
(``serving_deadline_ms``), and no retries with backoff (redis-py's default
would retry with sleeps of seconds). When Redis fails, a circuit breaker
answers from memory for ``serving_breaker_cooldown_ms`` before trying again:
lists come from the last known top sellers (``degraded=True``), or
:class:`~serving.errors.ServiceUnavailable` is raised when nothing suitable is
remembered. Recovery needs no action: the first request after the cool-down
probes Redis again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from features.online_keys import (
    WINDOWS,
    item_meta_key,
    live_model_key,
    model_versions_key,
    scope_for,
    similar_items_key,
    top_meta_field,
    top_meta_key,
    top_sellers_key,
    trending_key,
    user_recs_key,
)
from pipelines.connections import redis_kwargs, redis_pool_kwargs
from pipelines.settings import Settings
from serving.errors import ServiceUnavailable, UnknownItem
from serving.features import Cmd, NoUserFeatures, UserFeatureReader
from serving.metrics import ServingMetrics
from serving.models import (
    Freshness,
    RankedItem,
    ReadyResponse,
    RecommendationsResponse,
    SimilarItemsResponse,
    Source,
    TopItemsResponse,
)
from serving.rerank import (
    Pair,
    RerankParams,
    UserFeatures,
    blend_fallback,
    is_active,
    rerank,
    user_signals,
)
from serving.validation import (
    K_DEFAULT,
    TRENDING_WINDOWS,
    check_id,
    check_k,
    check_optional_id,
    check_window,
)

__all__ = ["ServingClient", "AsyncServingClient", "ITEM_CATEGORY_FIELD"]

log = logging.getLogger(__name__)

ITEM_CATEGORY_FIELD = "category_id"
"""Field of the item metadata hash (:func:`features.online_keys.item_meta_key`) read here."""

T = TypeVar("T")
Flow = Generator[list[Cmd], list[Any], T]

_STORE_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError, asyncio.TimeoutError)
_OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, OSError, asyncio.TimeoutError,
)
_KIND_SHORT = {"top_sellers": "top", "trending": "trend"}
_SCOPE_NAMES = {"global": "global", "cat": "category", "reg": "region", "catreg": "category_region"}
_SCOPE_SOURCES: dict[str, Source] = {
    "global": "top_sellers_global",
    "category": "top_sellers_category",
    "region": "top_sellers_region",
    "category_region": "top_sellers_category_region",
}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _scope_name(scope: str) -> str:
    return _SCOPE_NAMES[scope.split("=", 1)[0]]


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _int(raw: Any) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _pairs(raw: Any) -> list[Pair]:
    """Raw ``ZREVRANGE ... WITHSCORES`` reply -> ``(item, score)`` pairs.

    RESP2 sends ``[member, score, member, score, ...]`` (scores as text); RESP3
    ``[[member, score], ...]``.
    """
    if not raw:
        return []
    if isinstance(raw[0], list):
        return [(m.decode(), float(v)) for m, v in raw]
    it = iter(raw)
    return [(m.decode(), float(v)) for m, v in zip(it, it, strict=True)]


def _seconds_to_ms(raw: Any) -> int | None:
    """A ``ZSCORE`` in epoch seconds (the live-switch time training records) -> epoch ms."""
    if raw is None:
        return None
    try:
        return int(float(raw) * 1000)
    except (TypeError, ValueError):
        return None


def _freshness(as_of_ms: int | None, now_ms: int) -> Freshness:
    if as_of_ms is None:
        return Freshness(as_of=None, age_ms=None)
    return Freshness(
        as_of=datetime.fromtimestamp(as_of_ms / 1000, UTC), age_ms=max(now_ms - as_of_ms, 0)
    )


def _zrange(key: str, n: int) -> Cmd:
    return ("ZREVRANGE", key, 0, n - 1, "WITHSCORES")


# ----------------------------------------------------------------- in-process state
class _TTLCache:
    """A small thread-safe-enough map with a size cap and per-entry expiry.

    Dict operations are atomic under the GIL; the worst a race can do is
    evict one entry too many.
    """

    def __init__(self, max_size: int, ttl_s: float) -> None:
        self.max_size = max_size
        self.ttl_s = ttl_s
        self._data: dict[str, tuple[str | None, float]] = {}

    def get(self, key: str, now: float) -> tuple[bool, str | None]:
        entry = self._data.get(key)
        if entry is None or entry[1] < now:
            return False, None
        return True, entry[0]

    def get_many(self, keys: Sequence[str], now: float) -> tuple[dict[str, str | None], list[str]]:
        """``(hits, misses)``: the cached values (misses map to None) and the keys to fetch."""
        data = self._data
        found: dict[str, str | None] = {}
        missing: list[str] = []
        for key in keys:
            entry = data.get(key)
            if entry is not None and entry[1] >= now:
                found[key] = entry[0]
            elif key not in found:
                missing.append(key)
                found[key] = None
        return found, missing

    def put(self, key: str, value: str | None, now: float) -> None:
        if self.max_size <= 0:
            return
        if len(self._data) >= self.max_size and key not in self._data:
            try:
                self._data.pop(next(iter(self._data)))
            except (StopIteration, KeyError, RuntimeError):
                pass
        self._data[key] = (value, now + self.ttl_s)


@dataclass(frozen=True, slots=True)
class _Remembered:
    items: tuple[Pair, ...]
    as_of_ms: int | None
    fetched_ms: int


class _Memory:
    """The last known top-sellers / trending lists, served when Redis is down."""

    def __init__(self, max_lists: int = 1024) -> None:
        self.max_lists = max_lists
        self._lists: OrderedDict[tuple[str, str, str], _Remembered] = OrderedDict()
        self._lock = threading.Lock()

    def remember(
        self, kind: str, window: str, scope: str, items: Sequence[Pair],
        as_of_ms: int | None, now_ms: int, *, stale_after_ms: int = 60_000,
    ) -> None:
        key = (kind, window, scope)
        with self._lock:
            old = self._lists.get(key)
            # A short list (asked with a small k) does not replace a longer fresh one.
            if old is not None and len(items) < len(old.items) and now_ms - old.fetched_ms < stale_after_ms:
                self._lists.move_to_end(key)
                return
            self._lists[key] = _Remembered(tuple(items), as_of_ms, now_ms)
            self._lists.move_to_end(key)
            while len(self._lists) > self.max_lists:
                self._lists.popitem(last=False)

    def recall(self, kind: str, window: str, scope: str) -> _Remembered | None:
        return self._lists.get((kind, window, scope))


class _Breaker:
    """Open after ``threshold`` failures in a row: skip Redis for ``cooldown_ms``, then let
    requests probe it (one failed probe re-opens it, one success closes it)."""

    def __init__(self, cooldown_ms: int, threshold: int = 1) -> None:
        self.cooldown_s = cooldown_ms / 1000.0
        self.threshold = threshold
        self.failures = 0
        self.open_until = 0.0
        self.is_open = False

    def allow(self) -> bool:
        return not self.is_open or time.monotonic() >= self.open_until

    def failure(self) -> bool:
        """Record a failure; True when this opened the breaker (it was closed)."""
        self.failures += 1
        if self.failures < self.threshold:
            return False
        self.open_until = time.monotonic() + self.cooldown_s
        was_open, self.is_open = self.is_open, True
        return not was_open

    def success(self) -> bool:
        """Record a success; True when this closed an open breaker."""
        self.failures = 0
        if self.is_open:
            self.is_open = False
            return True
        return False


# ----------------------------------------------------------------------- the core
class _Core:
    """Flows, fallbacks and state shared by :class:`ServingClient` and :class:`AsyncServingClient`.

    No I/O here: flows yield batches of commands and receive replies.
    """

    def __init__(
        self, settings: Settings, *, metrics: ServingMetrics | None,
        user_features: UserFeatureReader | None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.reader: UserFeatureReader = user_features or NoUserFeatures()
        self.params = RerankParams(
            category_boost=settings.serving_category_boost,
            trending_share=settings.serving_trending_share,
        )
        self.live_version: str | None = None
        self.live_seen = False
        self.switch_ms: dict[str, int | None] = {}
        """When each version went live (epoch ms, from training's version history): read once
        per version and switch, since it only changes when the pointer does."""
        self.categories = _TTLCache(settings.serving_item_cache_size, settings.serving_item_cache_ttl_seconds)
        self.memory = _Memory()
        self.breaker = _Breaker(settings.serving_breaker_cooldown_ms, settings.serving_breaker_failures)

    # --- bookkeeping ------------------------------------------------------
    def see_live(self, raw: Any) -> str | None:
        """Store the live pointer read from Redis and return it.

        Flows compare it with the version *they* used to build their batch (not
        with :attr:`live_version`, which a concurrent request may have updated).
        """
        version = _text(raw)
        if version != self.live_version:
            if self.live_seen:
                log.info("live model version changed: %s -> %s", self.live_version, version)
            self.live_version = version
            if version is not None:
                self.switch_ms.pop(version, None)  # switched (back) to it: a new switch time
        self.live_seen = True
        return version

    def on_success(self) -> None:
        if self.breaker.failures == 0 and not self.breaker.is_open:
            return  # the common case: nothing to record
        if self.breaker.success():
            log.warning("online store reachable again (%s); leaving degraded mode",
                        self.settings.redis_url_redacted)
        if self.metrics:
            self.metrics.set_redis_up(True)

    def on_failure(self, op: str, exc: BaseException) -> None:
        if isinstance(exc, (redis.TimeoutError, TimeoutError, asyncio.TimeoutError)):
            kind = "timeout"
        elif isinstance(exc, _OUTAGE_ERRORS):
            kind = "connection"
        else:
            kind = "response"
        if self.metrics:
            self.metrics.redis_error(kind)
        if not isinstance(exc, _OUTAGE_ERRORS):
            # A data or programming problem (a key of the wrong type, a bad argument), not
            # an outage: this answer degrades, the breaker stays closed.
            log.error("online store rejected a %s read: %s: %s", op, type(exc).__name__, exc)
            return
        if self.breaker.failure():
            log.warning(
                "online store %s unavailable (%s: %s); answering from memory, retrying in %d ms",
                self.settings.redis_url_redacted, type(exc).__name__, str(exc)[:200] or kind,
                self.settings.serving_breaker_cooldown_ms,
            )
        if self.metrics:
            self.metrics.set_redis_up(False)

    def fallback_used(self, reason: str) -> None:
        if self.metrics:
            self.metrics.fallback(reason)

    def cached_category(self, item_id: str, now_s: float) -> tuple[bool, str | None]:
        return self.categories.get(item_id, now_s)

    # --- flows -----------------------------------------------------------
    def top_items_flow(
        self, kind: str, window: str, category: str | None, region: str | None, k: int
    ) -> Flow[TopItemsResponse]:
        scope = scope_for(category, region)
        key = top_sellers_key(window, scope) if kind == "top_sellers" else trending_key(window, scope)
        replies = yield [
            ("GET", live_model_key()),
            _zrange(key, k),
            ("HGET", top_meta_key(), top_meta_field(_KIND_SHORT[kind], window, scope)),  # type: ignore[arg-type]
        ]
        now = _now_ms()
        live = self.see_live(replies[0])
        items = _pairs(replies[1])
        as_of = _int(replies[2])
        self.memory.remember(kind, window, scope, items, as_of, now)
        return self._top_response(kind, window, scope, category, region, items, as_of, now,
                                  model_version=live)

    def _top_response(
        self, kind: str, window: str, scope: str, category: str | None, region: str | None,
        items: Sequence[Pair], as_of: int | None, now: int, *, model_version: str | None,
        degraded: bool = False, fetched_ms: int | None = None,
    ) -> TopItemsResponse:
        scope_name = _scope_name(scope)
        source: Source = "trending" if kind == "trending" else _SCOPE_SOURCES[scope_name]
        freshness = {kind: _freshness(as_of, now)}
        if degraded:
            freshness["memory"] = _freshness(fetched_ms, now)
        return TopItemsResponse(
            kind=kind,  # type: ignore[arg-type]
            window=window,
            scope=scope_name,
            category=category if scope_name in ("category", "category_region") else None,
            region=region if scope_name in ("region", "category_region") else None,
            items=[RankedItem(item_id=i, score=v, source=source) for i, v in items],
            model_version=model_version,
            degraded=degraded,
            freshness=freshness,
        )

    def top_items_fallback(
        self, kind: str, window: str, category: str | None, region: str | None, k: int
    ) -> TopItemsResponse:
        scope = scope_for(category, region)
        for candidate_scope in dict.fromkeys((scope, scope_for())):
            remembered = self.memory.recall(kind, window, candidate_scope)
            if remembered is not None:
                self.fallback_used("degraded")
                cat = category if candidate_scope == scope else None
                reg = region if candidate_scope == scope else None
                return self._top_response(
                    kind, window, candidate_scope, cat, reg, remembered.items[:k],
                    remembered.as_of_ms, _now_ms(), model_version=self.live_version, degraded=True,
                    fetched_ms=remembered.fetched_ms,
                )
        raise ServiceUnavailable(
            f"{kind.replace('_', ' ')} are unavailable: the online store did not answer in "
            "time and no earlier answer is kept in memory; retry shortly"
        )

    def recommendations_flow(
        self, user_id: str, k: int, exclude_purchased: bool, region: str | None
    ) -> Flow[RecommendationsResponse]:
        settings = self.settings
        version = self.live_version
        n_candidates = max(settings.serving_candidates, k)
        # Enough trending items for the mixed-in slots, the ones the model already holds,
        # and filling up when the model has few candidates.
        n_slots = int(k * self.params.trending_share + 0.5)
        n_trending = min(k + n_slots + 5, 200) if self.params.trending_share > 0 else 0
        t_window = settings.serving_trending_window
        t_scope = scope_for(None, region)
        feature_cmd = self.reader.command(user_id)

        batch: list[Cmd] = [("GET", live_model_key())]
        if n_trending:
            batch.append(_zrange(trending_key(t_window, t_scope), n_trending))
            batch.append(("HGET", top_meta_key(), top_meta_field("trend", t_window, t_scope)))
        if feature_cmd is not None:
            batch.append(feature_cmd)
        want_switch_time = bool(version) and version not in self.switch_ms
        if version:
            batch.append(_zrange(user_recs_key(version, user_id), n_candidates))
            if want_switch_time:
                batch.append(("ZSCORE", model_versions_key(), version))
        replies = yield batch

        now = _now_ms()
        it = iter(replies)
        live = self.see_live(next(it))
        trending: list[Pair] = []
        trending_as_of: int | None = None
        if n_trending:
            trending = _pairs(next(it))
            trending_as_of = _int(next(it))
        features: UserFeatures | None = None
        if feature_cmd is not None:
            features = self.reader.decode(next(it))
        candidates: list[Pair] = []
        if version:
            candidates = _pairs(next(it))
            if want_switch_time:
                self.switch_ms[version] = _seconds_to_ms(next(it))
        if live != version:
            # The live model moved since this process last looked: read the new version's
            # candidates (one more trip, once per switch and process).
            candidates = []
            if live:
                fresh = yield [_zrange(user_recs_key(live, user_id), n_candidates),
                               ("ZSCORE", model_versions_key(), live)]
                candidates = _pairs(fresh[0])
                self.switch_ms[live] = _seconds_to_ms(fresh[1])
        model_as_of = self.switch_ms.get(live) if live else None

        # Item categories: only when the boost or the cold-start path can use them.
        needed: list[str] = []
        if features is not None:
            if candidates and self.params.category_boost > 0 and is_active(features, now):
                needed = [c[0] for c in candidates] + list(features.last_items_viewed)
            elif not candidates:
                needed = list(features.last_items_viewed)
        categories = yield from self._categories_flow(needed)

        freshness: dict[str, Freshness] = {}
        if features is not None or feature_cmd is not None:
            freshness[self.reader.name] = _freshness(features.as_of_ms if features else None, now)
        if n_trending:
            freshness["trending"] = _freshness(trending_as_of, now)
        if live:
            freshness["model"] = _freshness(model_as_of, now)

        personal: list[tuple[Source, list[Pair]]] = []
        global_items: list[Pair] = []
        if not candidates:
            self.fallback_used("cold_start")
            signals = user_signals(features, categories, now,
                                   max_recent_categories=self.params.max_recent_categories)
            # The storefront's region wins; else the region the user's features carry, if any.
            home = region or (features.region if features is not None else None)
            personal, global_items, tier_freshness = yield from self._cold_start_flow(
                signals.recent_categories, home, k + len(signals.purchased)
            )
            freshness.update(tier_freshness)

        items = rerank(
            candidates,
            features=features,
            item_categories=categories,
            trending=trending,
            k=k,
            now_ms=now,
            params=self.params,
            exclude_purchased=exclude_purchased,
            fallback_personal=personal,
            fallback_global=global_items,
        )
        return RecommendationsResponse(
            user_id=user_id,
            known_user=bool(candidates),
            items=items,
            model_version=live,
            freshness=freshness,
        )

    def _categories_flow(self, item_ids: Sequence[str]) -> Generator[list[Cmd], list[Any], dict[str, str | None]]:
        """Categories of ``item_ids``: from the in-process cache, the misses in one trip."""
        if not item_ids:
            return {}
        now_s = time.monotonic()
        found, missing = self.categories.get_many(item_ids, now_s)
        if missing:
            missing = list(dict.fromkeys(missing))
            replies = yield [("HGET", item_meta_key(i), ITEM_CATEGORY_FIELD) for i in missing]
            for item, raw in zip(missing, replies, strict=True):
                category = _text(raw)
                found[item] = category
                self.categories.put(item, category, now_s)
        return found

    def _cold_start_flow(
        self, recent_categories: Sequence[str], region: str | None, n: int
    ) -> Generator[list[Cmd], list[Any], tuple[list[tuple[Source, list[Pair]]], list[Pair], dict[str, Freshness]]]:
        """Top sellers of the user's recent categories (in their region when known), their
        region, then global: one trip."""
        window = self.settings.serving_fallback_window
        tiers: list[tuple[Source, str]] = []
        for category in recent_categories:
            if region:
                tiers.append(("top_sellers_category_region", scope_for(category, region)))
            tiers.append(("top_sellers_category", scope_for(category)))
        if region:
            tiers.append(("top_sellers_region", scope_for(None, region)))
        tiers.append(("top_sellers_global", scope_for()))
        batch: list[Cmd] = []
        for _, scope in tiers:
            batch.append(_zrange(top_sellers_key(window, scope), n))
            batch.append(("HGET", top_meta_key(), top_meta_field("top", window, scope)))
        replies = yield batch
        now = _now_ms()
        personal: list[tuple[Source, list[Pair]]] = []
        global_items: list[Pair] = []
        freshness: dict[str, Freshness] = {}
        for i, (source, scope) in enumerate(tiers):
            items = _pairs(replies[2 * i])
            as_of = _int(replies[2 * i + 1])
            self.memory.remember("top_sellers", window, scope, items, as_of, now)
            if source == "top_sellers_global":
                global_items = items
            else:
                personal.append((source, items))
            if items:
                # The oldest list of a kind is what bounds the answer's freshness.
                prev = freshness.get(source)
                fresh = _freshness(as_of, now)
                if prev is None or (fresh.age_ms or 0) > (prev.age_ms or 0):
                    freshness[source] = fresh
        return personal, global_items, freshness

    def recommendations_fallback(
        self, user_id: str, k: int, region: str | None
    ) -> RecommendationsResponse:
        window = self.settings.serving_fallback_window
        scopes: list[tuple[Source, str]] = []
        if region:
            scopes.append(("top_sellers_region", scope_for(None, region)))
        scopes.append(("top_sellers_global", scope_for()))
        for source, scope in scopes:
            remembered = self.memory.recall("top_sellers", window, scope)
            if remembered is not None and remembered.items:
                self.fallback_used("degraded")
                now = _now_ms()
                return RecommendationsResponse(
                    user_id=user_id,
                    known_user=False,
                    items=[RankedItem(item_id=i, score=v, source=source)
                           for i, v in remembered.items[:k]],
                    model_version=self.live_version,
                    degraded=True,
                    freshness={source: _freshness(remembered.as_of_ms, now),
                               "memory": _freshness(remembered.fetched_ms, now)},
                )
        raise ServiceUnavailable(
            "recommendations are unavailable: the online store did not answer in time and "
            "no top sellers are kept in memory yet; retry shortly"
        )

    def similar_flow(self, item_id: str, k: int) -> Flow[SimilarItemsResponse]:
        version = self.live_version
        batch: list[Cmd] = [
            ("GET", live_model_key()),
            ("HGET", item_meta_key(item_id), ITEM_CATEGORY_FIELD),
        ]
        want_switch_time = bool(version) and version not in self.switch_ms
        if version:
            batch.append(_zrange(similar_items_key(version, item_id), k + 1))
            if want_switch_time:
                batch.append(("ZSCORE", model_versions_key(), version))
        replies = yield batch
        now = _now_ms()
        live = self.see_live(replies[0])
        category = _text(replies[1])
        if category is not None:
            self.categories.put(item_id, category, time.monotonic())
        similar: list[Pair] = []
        if version:
            similar = _pairs(replies[2])
            if want_switch_time:
                self.switch_ms[version] = _seconds_to_ms(replies[3])
        if live != version:
            similar = []
            if live:
                fresh = yield [_zrange(similar_items_key(live, item_id), k + 1),
                               ("ZSCORE", model_versions_key(), live)]
                similar = _pairs(fresh[0])
                self.switch_ms[live] = _seconds_to_ms(fresh[1])
        model_as_of = self.switch_ms.get(live) if live else None
        model_freshness = {"model": _freshness(model_as_of, now)} if live else {}
        if similar:
            items = [RankedItem(item_id=i, score=v, source="model")
                     for i, v in similar if i != item_id][:k]
            return SimilarItemsResponse(item_id=item_id, items=items, model_version=live,
                                        freshness=model_freshness)
        if category is None:
            self.fallback_used("unknown_item")
            raise UnknownItem("unknown item: the online store has no similar items and no metadata for it")
        # Known item the model has no neighbours for: top sellers of its category, then global.
        self.fallback_used("similar_top_sellers")
        personal, global_items, freshness = yield from self._cold_start_flow([category], None, k + 1)
        items = blend_fallback(personal, global_items, k=k, exclude={item_id})
        return SimilarItemsResponse(item_id=item_id, items=items, model_version=live,
                                    freshness={**model_freshness, **freshness})

    def similar_fallback(self, item_id: str, k: int) -> SimilarItemsResponse:
        window = self.settings.serving_fallback_window
        hit, category = self.categories.get(item_id, time.monotonic())
        scopes: list[tuple[Source, str]] = []
        if hit and category:
            scopes.append(("top_sellers_category", scope_for(category)))
        scopes.append(("top_sellers_global", scope_for()))
        for source, scope in scopes:
            remembered = self.memory.recall("top_sellers", window, scope)
            if remembered is not None and remembered.items:
                self.fallback_used("degraded")
                now = _now_ms()
                items = [RankedItem(item_id=i, score=v, source=source)
                         for i, v in remembered.items if i != item_id][:k]
                return SimilarItemsResponse(
                    item_id=item_id, items=items, model_version=self.live_version, degraded=True,
                    freshness={source: _freshness(remembered.as_of_ms, now),
                               "memory": _freshness(remembered.fetched_ms, now)},
                )
        raise ServiceUnavailable(
            "similar items are unavailable: the online store did not answer in time and no "
            "top sellers are kept in memory yet; retry shortly"
        )

    def warm_flow(self) -> Flow[None]:
        """Refresh the live pointer and the remembered global top sellers / trending lists."""
        size = self.settings.serving_fallback_size
        lists = [("top_sellers", w) for w in WINDOWS] + [("trending", w) for w in TRENDING_WINDOWS]
        batch: list[Cmd] = [("GET", live_model_key())]
        for kind, window in lists:
            key = top_sellers_key(window, scope_for()) if kind == "top_sellers" else trending_key(window, scope_for())
            batch.append(_zrange(key, size))
            field = top_meta_field(_KIND_SHORT[kind], window, scope_for())  # type: ignore[arg-type]
            batch.append(("HGET", top_meta_key(), field))
        replies = yield batch
        now = _now_ms()
        self.see_live(replies[0])
        for i, (kind, window) in enumerate(lists):
            self.memory.remember(kind, window, scope_for(), _pairs(replies[1 + 2 * i]),
                                 _int(replies[2 + 2 * i]), now, stale_after_ms=0)
        return None

    def ready_flow(self) -> Flow[ReadyResponse]:
        replies = yield [("PING",), ("GET", live_model_key())]
        live = self.see_live(replies[1])
        if live is None:
            return ReadyResponse(status="not_ready", redis=True, model_version=None,
                                 detail="no live model: the live model pointer is not set")
        return ReadyResponse(status="ready", redis=True, model_version=live)

    def ready_fallback(self, exc: BaseException | None) -> ReadyResponse:
        return ReadyResponse(status="not_ready", redis=False, model_version=self.live_version,
                             detail="the online store did not answer in time")


# ------------------------------------------------------------------- the drivers
def _serving_redis_kwargs(settings: Settings, *, asyncio: bool = False) -> dict[str, Any]:
    """Pool options for serving: short connect timeout, no health-check PINGs, no retries.

    redis-py 7's default ``Retry`` retries three times with exponential backoff
    starting at one second, which would turn a 50 ms timeout into seconds; the
    circuit breaker decides when to try again instead.
    """
    kwargs = redis_kwargs(settings)
    kwargs["socket_connect_timeout"] = settings.serving_redis_connect_timeout_ms / 1000.0
    kwargs["health_check_interval"] = 0
    return redis_pool_kwargs(kwargs, asyncio=asyncio)


def _advance(flow: Flow[T], replies: list[Any] | None) -> tuple[list[Cmd] | None, T | None]:
    """Feed replies to a flow: its next batch, or ``(None, result)`` when it finished."""
    try:
        return flow.send(replies), None  # type: ignore[arg-type]
    except StopIteration as stop:
        return None, stop.value


class _Checks:
    """Argument checks shared by both clients (the API has already applied the same rules)."""

    @staticmethod
    def top(window: str, category: str | None, region: str | None, k: int, *,
            trending: bool = False) -> tuple[str, str | None, str | None, int]:
        return (check_window(window, trending=trending), check_optional_id("category", category),
                check_optional_id("region", region), check_k(k))


class ServingClient:
    """Synchronous in-process client (thread-safe; one pool per client).

    Parameters
    ----------
    settings
        Redis address, timeouts and re-ranking knobs.
    user_features
        How to read a user's features; default: Feast's layout through
        :func:`serving.features.default_reader` when the feature repository is
        available, else none.
    metrics
        Optional counters for fallbacks and Redis errors.
    """

    def __init__(
        self, settings: Settings, *, user_features: UserFeatureReader | None = None,
        metrics: ServingMetrics | None = None,
    ) -> None:
        from serving.features import default_reader

        self.settings = settings
        self._core = _Core(settings, metrics=metrics,
                           user_features=user_features or default_reader(settings))
        pool = redis.BlockingConnectionPool(
            max_connections=settings.serving_redis_max_connections,
            timeout=settings.serving_deadline_ms / 1000.0,
            retry=Retry(NoBackoff(), 0),
            **_serving_redis_kwargs(settings),
        )
        self._redis = redis.Redis(connection_pool=pool)

    # --- lifecycle -------------------------------------------------------
    def close(self) -> None:
        self._redis.close()
        self._redis.connection_pool.disconnect()

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def live_model_version(self) -> str | None:
        """The live model version as last read (no I/O)."""
        return self._core.live_version

    # --- driver ----------------------------------------------------------
    def _run(self, op: str, flow: Flow[T], fallback: Callable[[], T]) -> T:
        core = self._core
        if not core.breaker.allow():
            flow.close()
            return fallback()
        try:
            batch, result = _advance(flow, None)
            while batch is not None:
                batch, result = _advance(flow, self._execute(batch))
        except _STORE_ERRORS as exc:
            flow.close()
            core.on_failure(op, exc)
            return fallback()
        core.on_success()
        return result  # type: ignore[return-value]

    def _execute(self, batch: list[Cmd]) -> list[Any]:
        """One round trip: every command of ``batch`` written at once, the raw replies read.

        A pipeline without redis-py's per-command bookkeeping (response callbacks,
        option dicts): the flows parse the raw replies themselves. A connection that
        failed mid-way is dropped, never returned to the pool half-read.
        """
        pool = self._redis.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(batch), check_health=False)
            return [conn.read_response() for _ in batch]
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    # --- API ---------------------------------------------------------------
    def top_sellers(self, window: str = "1h", category: str | None = None,
                    region: str | None = None, k: int = K_DEFAULT) -> TopItemsResponse:
        """Best sellers by units in ``window`` for a scope (global when neither filter is given)."""
        window, category, region, k = _Checks.top(window, category, region, k)
        return self._run("top_sellers", self._core.top_items_flow("top_sellers", window, category, region, k),
                         lambda: self._core.top_items_fallback("top_sellers", window, category, region, k))

    def trending(self, window: str = "1h", category: str | None = None,
                 region: str | None = None, k: int = K_DEFAULT) -> TopItemsResponse:
        """Items trending in ``window`` (``1h``: the last hour against the 24h pace) for a scope."""
        window, category, region, k = _Checks.top(window, category, region, k, trending=True)
        return self._run("trending", self._core.top_items_flow("trending", window, category, region, k),
                         lambda: self._core.top_items_fallback("trending", window, category, region, k))

    def recommendations(self, user_id: str, k: int = K_DEFAULT, *, exclude_purchased: bool = True,
                        region: str | None = None) -> RecommendationsResponse:
        """The live model's candidates for ``user_id`` re-ranked with their fresh features.

        ``region`` (the shopper's country, as the storefront knows it) selects
        the trending list mixed in and the cold-start top sellers.
        """
        user_id = check_id("user_id", user_id)
        k = check_k(k)
        region = check_optional_id("region", region)
        return self._run(
            "recommendations",
            self._core.recommendations_flow(user_id, k, bool(exclude_purchased), region),
            lambda: self._core.recommendations_fallback(user_id, k, region),
        )

    def similar_items(self, item_id: str, k: int = K_DEFAULT) -> SimilarItemsResponse:
        """Items like ``item_id`` (the live model's neighbours, else top sellers of its category)."""
        item_id = check_id("item_id", item_id)
        k = check_k(k)
        return self._run("similar", self._core.similar_flow(item_id, k),
                         lambda: self._core.similar_fallback(item_id, k))

    def ready(self) -> ReadyResponse:
        """Whether Redis answers and a live model pointer is set (ignores the breaker)."""
        flow = self._core.ready_flow()
        try:
            batch, result = _advance(flow, None)
            while batch is not None:
                batch, result = _advance(flow, self._execute(batch))
        except _STORE_ERRORS as exc:
            return self._core.ready_fallback(exc)
        self._core.on_success()
        return result  # type: ignore[return-value]

    def warm(self) -> bool:
        """Read the live pointer and the global lists into memory; False if Redis failed."""
        result = self._run("warm", self._with_true(self._core.warm_flow()), lambda: False)
        return bool(result)

    @staticmethod
    def _with_true(flow: Flow[None]) -> Flow[bool]:
        yield from flow
        return True


class AsyncServingClient:
    """Asynchronous in-process client for asyncio code (the HTTP API, notebooks).

    Same methods as :class:`ServingClient`, as coroutines, plus a deadline
    (``serving_deadline_ms``) on the whole Redis part of each call.
    """

    def __init__(
        self, settings: Settings, *, user_features: UserFeatureReader | None = None,
        metrics: ServingMetrics | None = None,
    ) -> None:
        from serving.features import default_reader

        self.settings = settings
        self._core = _Core(settings, metrics=metrics,
                           user_features=user_features or default_reader(settings))
        self._deadline_s = settings.serving_deadline_ms / 1000.0
        pool = aioredis.BlockingConnectionPool(
            max_connections=settings.serving_redis_max_connections,
            timeout=self._deadline_s,
            retry=AsyncRetry(NoBackoff(), 0),
            **_serving_redis_kwargs(settings, asyncio=True),
        )
        self._redis = aioredis.Redis(connection_pool=pool)

    async def aclose(self) -> None:
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()

    async def __aenter__(self) -> AsyncServingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def live_model_version(self) -> str | None:
        return self._core.live_version

    async def _execute(self, batch: list[Cmd]) -> list[Any]:
        """One round trip (see :meth:`ServingClient._execute`)."""
        pool = self._redis.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(conn.pack_commands(batch), check_health=False)
            return [await conn.read_response() for _ in batch]
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        finally:
            await pool.release(conn)

    async def _run(self, op: str, flow: Flow[T], fallback: Callable[[], T]) -> T:
        core = self._core
        if not core.breaker.allow():
            flow.close()
            return fallback()
        try:
            async with asyncio.timeout(self._deadline_s):
                batch, result = _advance(flow, None)
                while batch is not None:
                    batch, result = _advance(flow, await self._execute(batch))
        except _STORE_ERRORS as exc:
            flow.close()
            core.on_failure(op, exc)
            return fallback()
        core.on_success()
        return result  # type: ignore[return-value]

    async def top_sellers(self, window: str = "1h", category: str | None = None,
                          region: str | None = None, k: int = K_DEFAULT) -> TopItemsResponse:
        window, category, region, k = _Checks.top(window, category, region, k)
        return await self._run(
            "top_sellers", self._core.top_items_flow("top_sellers", window, category, region, k),
            lambda: self._core.top_items_fallback("top_sellers", window, category, region, k))

    async def trending(self, window: str = "1h", category: str | None = None,
                       region: str | None = None, k: int = K_DEFAULT) -> TopItemsResponse:
        window, category, region, k = _Checks.top(window, category, region, k, trending=True)
        return await self._run(
            "trending", self._core.top_items_flow("trending", window, category, region, k),
            lambda: self._core.top_items_fallback("trending", window, category, region, k))

    async def recommendations(self, user_id: str, k: int = K_DEFAULT, *, exclude_purchased: bool = True,
                              region: str | None = None) -> RecommendationsResponse:
        user_id = check_id("user_id", user_id)
        k = check_k(k)
        region = check_optional_id("region", region)
        return await self._run(
            "recommendations",
            self._core.recommendations_flow(user_id, k, bool(exclude_purchased), region),
            lambda: self._core.recommendations_fallback(user_id, k, region),
        )

    async def similar_items(self, item_id: str, k: int = K_DEFAULT) -> SimilarItemsResponse:
        item_id = check_id("item_id", item_id)
        k = check_k(k)
        return await self._run("similar", self._core.similar_flow(item_id, k),
                               lambda: self._core.similar_fallback(item_id, k))

    async def ready(self) -> ReadyResponse:
        flow = self._core.ready_flow()
        try:
            async with asyncio.timeout(self._deadline_s):
                batch, result = _advance(flow, None)
                while batch is not None:
                    batch, result = _advance(flow, await self._execute(batch))
        except _STORE_ERRORS as exc:
            return self._core.ready_fallback(exc)
        self._core.on_success()
        return result  # type: ignore[return-value]

    async def warm(self) -> bool:
        result = await self._run("warm", ServingClient._with_true(self._core.warm_flow()), lambda: False)
        return bool(result)
