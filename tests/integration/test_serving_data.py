"""The store the serving tests read, written by the pipelines' own writers; and the proof
that serving reads a user's features exactly as Feast's ``get_online_features`` does.

:func:`seed_store` is the one place the serving tests get their data from, so
swapping the synthetic data for the real backfill and training output changes
only this module:

* item metadata, top sellers / trending lists and ``user_activity`` rows go
  through :mod:`pipelines.online_writer` (the stream's and backfill's writer);
* per-version recommendations and similar items are hand-picked lists written to
  the :mod:`features.online_keys` keys that training's batch scoring writes (so the
  tests can name exact expectations), and the live switch is
  :func:`training.scoring.switch_live` itself.

``tests/integration/test_serving_pipelines.py`` runs serving on a store written
end to end by the backfill (Spark) and a fitted model's batch scoring.

The catalogue borrows real Online Retail ids (``85123A``, ``United Kingdom``,
``guest-536365``) so the id rules are exercised by real-looking values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from features import online_keys
from features.feast_layout import USER_ACTIVITY
from pipelines.online_writer import write_entity_rows, write_item_metadata, write_top_items
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

UK, DE = "United Kingdom", "Germany"

ITEMS: dict[str, str] = {
    "85123A": "LIGHTS", "71053": "LIGHTS", "21730": "LIGHTS",
    "84406B": "HOME", "84029G": "HOME",
    "22423": "KITCHEN", "22720": "KITCHEN",
    "47566": "PARTY", "22086": "PARTY",
    "85099B": "BAGS", "20725": "BAGS",
}
"""item -> category."""

SALES_1H: list[tuple[str, str, int]] = [
    ("85123A", UK, 12), ("22423", UK, 9), ("85099B", UK, 7), ("47566", UK, 5), ("20725", DE, 6),
    ("22086", DE, 4), ("71053", UK, 3), ("84406B", DE, 2),
]
"""(item, region, units) sold in the last hour."""
SALES_24H: list[tuple[str, str, int]] = SALES_1H + [
    ("84029G", UK, 40), ("21730", UK, 30), ("22720", DE, 25), ("20725", UK, 20),
]
TRENDING: dict[str, list[tuple[str, float]]] = {
    "global": [("47566", 6.0), ("22086", 5.0), ("85099B", 4.0), ("20725", 3.5)],
    UK: [("47566", 6.0), ("85099B", 4.0), ("71053", 2.5)],
    DE: [("22086", 5.0), ("20725", 3.5)],
}

KNOWN_USER = "u123"
"""Known to the model; active minutes ago in KITCHEN; bought 22423 recently (when the view
carries purchases)."""
IDLE_USER = "17850"
"""Known to the model; last seen three hours ago."""
COLD_USER = "guest-536365"
"""Unknown to the model; active in BAGS minutes ago, from the United Kingdom."""
NEW_USER = "u-new"
"""Unknown to the model and without features."""

RECS: dict[str, dict[str, dict[str, float]]] = {
    "v1": {
        KNOWN_USER: {"85123A": 0.95, "71053": 0.9, "84406B": 0.85, "21730": 0.8, "47566": 0.7,
                     "22720": 0.5, "22423": 0.45, "84029G": 0.4},
        IDLE_USER: {"84029G": 0.9, "22720": 0.8, "85123A": 0.3},
    },
    "v2": {
        KNOWN_USER: {"20725": 0.9, "85099B": 0.8, "22086": 0.7},
        IDLE_USER: {"22720": 0.9},
    },
}
SIMILAR: dict[str, dict[str, dict[str, float]]] = {
    "v1": {"85123A": {"71053": 0.92, "21730": 0.88, "85123A": 1.0, "84406B": 0.3}},
    "v2": {"85123A": {"21730": 0.95}},
}
KNOWN_ITEM_WITHOUT_NEIGHBOURS = "84029G"
UNKNOWN_ITEM = "NOPE-404"


TOLERANT_TIMEOUTS = {"redis_socket_timeout_ms": 1000, "serving_deadline_ms": 3000,
                     "serving_redis_connect_timeout_ms": 1000}
"""Timeouts for the functional serving tests: generous, so a stall of the shared 2-core
machine is not mistaken for an outage (the default timeouts are exercised by
``test_api_resilience.py``)."""


@dataclass(frozen=True)
class SeededStore:
    """What :func:`seed_store` wrote, for assertions."""

    as_of: datetime
    live_version: str


def _top_rows(kind: str, window: str, lists: dict[tuple[str | None, str | None], dict[str, float]],
              as_of: datetime) -> Iterable[dict[str, Any]]:
    for (category, region), scores in lists.items():
        for item, score in scores.items():
            yield {"kind": kind, "window": window, "category_id": category, "region": region,
                   "item_id": item, "score": score, "event_timestamp": as_of}


def _scoped(sales: list[tuple[str, str, int]]) -> dict[tuple[str | None, str | None], dict[str, float]]:
    lists: dict[tuple[str | None, str | None], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for item, region, units in sales:
        category = ITEMS[item]
        for scope in ((None, None), (category, None), (None, region), (category, region)):
            lists[scope][item] += units
    return {scope: dict(scores) for scope, scores in lists.items()}


def write_catalogue(client: Any, settings: Settings, as_of: datetime) -> None:
    """Item metadata and top sellers / trending lists, through the online writer."""
    write_item_metadata(
        client,
        [{"item_id": item, "category_id": cat, "region": UK, "price": 2.55, "event_time": as_of}
         for item, cat in ITEMS.items()],
        ttl_seconds=settings.online_ttl_seconds,
    )
    trending = {(None, None if scope == "global" else scope): dict(items)
                for scope, items in TRENDING.items()}
    rows = [
        *_top_rows("top", "1h", _scoped(SALES_1H), as_of),
        *_top_rows("top", "24h", _scoped(SALES_24H), as_of),
        *_top_rows("trend", "1h", trending, as_of),
    ]
    write_top_items(client, rows, top_n=settings.feature_top_n)


def user_rows(as_of: datetime) -> list[dict[str, Any]]:
    """``user_activity`` rows: an active known user, an idle known user, an active cold user."""
    base = {
        "views_24h": 0, "carts_1h": 0, "carts_24h": 0, "purchases_1h": 0, "purchases_24h": 0,
        "spend_1h": 0.0, "spend_24h": 0.0, "distinct_items_viewed_1h": 0,
        "event_timestamp": as_of,
    }
    return [
        dict(base, user_id=KNOWN_USER, views_1h=4, purchases_1h=1,
             last_event_time=as_of - timedelta(minutes=5), top_category="KITCHEN",
             category_affinity_ids=["KITCHEN", "LIGHTS"], category_affinity_weights=[9.0, 2.0],
             last_viewed_items=["22720", "85123A"]),
        dict(base, user_id=IDLE_USER, views_1h=0, last_event_time=as_of - timedelta(hours=3),
             top_category="KITCHEN", category_affinity_ids=["KITCHEN"],
             category_affinity_weights=[3.0], last_viewed_items=["22720"]),
        dict(base, user_id=COLD_USER, views_1h=2, last_event_time=as_of - timedelta(minutes=2),
             top_category="BAGS", category_affinity_ids=["BAGS"], category_affinity_weights=[2.0],
             last_viewed_items=["20725", "85099B"]),
    ]


def write_user_features(client: Any, settings: Settings, as_of: datetime) -> None:
    write_entity_rows(client, USER_ACTIVITY, user_rows(as_of), ttl_seconds=settings.online_ttl_seconds)


def write_model(client: Any, version: str, *, make_live: bool = True) -> None:
    """A model version's recommendations and similar items, then (optionally) the switch."""
    with client.pipeline(transaction=False) as pipe:
        for user, items in RECS[version].items():
            pipe.zadd(online_keys.user_recs_key(version, user), items)
            pipe.expire(online_keys.user_recs_key(version, user), online_keys.REC_TTL)
        for item, items in SIMILAR[version].items():
            pipe.zadd(online_keys.similar_items_key(version, item), items)
            pipe.expire(online_keys.similar_items_key(version, item), online_keys.REC_TTL)
        pipe.execute()
    if make_live:
        switch_live(client, version)


def switch_live(client: Any, version: str) -> None:
    """Make ``version`` live the way training does (one transaction on the pointers)."""
    from training.scoring import switch_live as training_switch_live

    training_switch_live(client, version)


def seed_store(client: Any, settings: Settings, *, as_of: datetime | None = None,
               version: str = "v1") -> SeededStore:
    """Write everything the serving tests read into ``client``'s database."""
    as_of = (as_of or datetime.now(UTC)).replace(microsecond=0)
    write_catalogue(client, settings, as_of)
    write_user_features(client, settings, as_of)
    write_model(client, version)
    return SeededStore(as_of=as_of, live_version=version)


# ----------------------------------------------------------------------- tests
def test_reader_returns_what_feast_get_online_features_returns(
    make_settings: Any, redis_client: Any, tmp_path: Any
) -> None:
    from pipelines.feast_store import feature_store
    from serving.features import FeastUserFeatures

    settings = make_settings(data_dir=str(tmp_path / "data"))
    as_of = datetime.now(UTC).replace(microsecond=0)
    write_user_features(redis_client, settings, as_of)
    store = feature_store(settings)
    names = ["views_1h", "carts_1h", "purchases_1h", "last_event_time", "top_category",
             "category_affinity_ids", "category_affinity_weights", "last_viewed_items"]
    users = [KNOWN_USER, IDLE_USER, COLD_USER, NEW_USER]
    online = store.get_online_features(
        features=[f"user_activity:{n}" for n in names],
        entity_rows=[{"user_id": u} for u in users],
    ).to_dict()
    reader = FeastUserFeatures()
    for i, user in enumerate(users):
        _, key, *fields = reader.command(user)
        decoded = reader.decode(redis_client.hmget(key, fields))
        feast_row = {n: online[n][i] for n in names}
        if user == NEW_USER:
            assert decoded is None
            assert all(v is None for v in feast_row.values())
            continue
        assert decoded is not None
        assert decoded.events_1h == feast_row["views_1h"] + feast_row["carts_1h"] + feast_row["purchases_1h"]
        assert decoded.top_category == feast_row["top_category"]
        assert decoded.category_affinity == tuple(
            zip(feast_row["category_affinity_ids"], feast_row["category_affinity_weights"], strict=True)
        )
        assert decoded.last_items_viewed == tuple(feast_row["last_viewed_items"])
        feast_time = feast_row["last_event_time"]
        if isinstance(feast_time, datetime):
            feast_ms = int(feast_time.replace(tzinfo=feast_time.tzinfo or UTC).timestamp() * 1000)
        else:  # epoch seconds
            feast_ms = int(feast_time) * 1000
        assert decoded.last_event_time_ms == feast_ms
        assert decoded.as_of_ms == int(as_of.timestamp() * 1000)


def test_seed_store_writes_what_serving_reads(settings: Settings, redis_client: Any) -> None:
    seeded = seed_store(redis_client, settings)
    assert redis_client.get(online_keys.live_model_key()) == seeded.live_version.encode()
    top = redis_client.zrevrange(online_keys.top_sellers_key("1h", online_keys.scope_global()), 0, 0)
    assert top == [b"85123A"]
    assert redis_client.hget(online_keys.item_meta_key("85123A"), "category_id") == b"LIGHTS"
