"""The in-process client (sync and async) against a real redis-server and the seeded store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from features.feast_layout import USER_ACTIVITY
from pipelines.online_writer import write_entity_rows
from pipelines.settings import Settings
from serving.client import AsyncServingClient, ServingClient
from serving.errors import InvalidParameter, UnknownItem
from serving.models import RecommendationsResponse
from tests.integration.test_serving_data import (
    COLD_USER,
    DE,
    IDLE_USER,
    KNOWN_ITEM_WITHOUT_NEIGHBOURS,
    KNOWN_USER,
    NEW_USER,
    RECS,
    TOLERANT_TIMEOUTS,
    UK,
    UNKNOWN_ITEM,
    SeededStore,
    seed_store,
    switch_live,
    user_rows,
    write_model,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def serving_settings(make_settings: Any) -> Settings:
    """The session's servers with :data:`TOLERANT_TIMEOUTS`."""
    return make_settings(**TOLERANT_TIMEOUTS)


@pytest.fixture()
def seeded(serving_settings: Settings, redis_client: Any) -> SeededStore:
    return seed_store(redis_client, serving_settings)


@pytest.fixture()
def client(serving_settings: Settings, seeded: SeededStore) -> Iterator[ServingClient]:
    with ServingClient(serving_settings) as c:
        yield c


def _ids(answer: Any) -> list[str]:
    return [i.item_id for i in answer.items]


def _assert_fresh(answer: Any, name: str, seeded: SeededStore) -> None:
    fresh = answer.freshness[name]
    assert fresh.as_of == seeded.as_of
    assert fresh.age_ms is not None and 0 <= fresh.age_ms < 120_000


def test_top_sellers_global_window_1h(client: ServingClient, seeded: SeededStore) -> None:
    answer = client.top_sellers("1h", k=3)
    assert _ids(answer) == ["85123A", "22423", "85099B"]
    assert [i.score for i in answer.items] == [12.0, 9.0, 7.0]
    assert {i.source for i in answer.items} == {"top_sellers_global"}
    assert answer.scope == "global" and answer.window == "1h" and not answer.degraded
    assert answer.model_version == "v1"
    _assert_fresh(answer, "top_sellers", seeded)


def test_top_sellers_scoped_by_category_region_and_both(client: ServingClient) -> None:
    by_region = client.top_sellers("24h", region=DE, k=10)
    assert _ids(by_region) == ["22720", "20725", "22086", "84406B"]
    assert by_region.scope == "region" and by_region.region == DE
    assert {i.source for i in by_region.items} == {"top_sellers_region"}
    by_category = client.top_sellers("24h", category="BAGS")
    assert _ids(by_category) == ["20725", "85099B"]
    assert {i.source for i in by_category.items} == {"top_sellers_category"}
    both = client.top_sellers("24h", category="BAGS", region=UK)
    assert _ids(both) == ["20725", "85099B"] and both.scope == "category_region"
    assert [i.score for i in both.items] == [20.0, 7.0]


def test_top_sellers_of_an_unknown_scope_is_empty(client: ServingClient) -> None:
    answer = client.top_sellers("1h", region="Atlantis")
    assert answer.items == [] and not answer.degraded
    assert answer.freshness["top_sellers"].as_of is None


def test_trending_by_region(client: ServingClient, seeded: SeededStore) -> None:
    answer = client.trending("1h", region=UK, k=2)
    assert _ids(answer) == ["47566", "85099B"]
    assert {i.source for i in answer.items} == {"trending"}
    _assert_fresh(answer, "trending", seeded)


def test_recommendations_rerank_with_the_users_last_hour(client: ServingClient, seeded: SeededStore) -> None:
    model_order = sorted(RECS["v1"][KNOWN_USER], key=lambda i: -RECS["v1"][KNOWN_USER][i])
    answer = client.recommendations(KNOWN_USER, k=8, region=UK)
    assert answer.known_user and answer.model_version == "v1" and not answer.degraded
    model_items = [i.item_id for i in answer.items if i.source == "model"]
    # The user's categories of the last minutes (KITCHEN: top affinity and last viewed;
    # LIGHTS: viewed) move up against the model's order; HOME and PARTY move down.
    assert model_order == ["85123A", "71053", "84406B", "21730", "47566", "22720", "22423", "84029G"]
    assert model_items == ["85123A", "71053", "21730", "84406B", "22720", "22423", "47566"]
    # Items trending in the user's region are mixed in, never first, never repeated.
    trending = [i for i in answer.items if i.source == "trending"]
    assert trending and answer.items[0].source == "model"
    assert {i.item_id for i in trending} <= {"47566", "85099B", "71053"}
    assert len(_ids(answer)) == len(set(_ids(answer))) == 8
    _assert_fresh(answer, "user_activity", seeded)
    _assert_fresh(answer, "trending", seeded)
    # When the live version was switched in (training records it with the switch).
    assert answer.freshness["model"].age_ms is not None and answer.freshness["model"].age_ms < 120_000


def test_recommendations_of_an_idle_user_keep_the_model_order(client: ServingClient) -> None:
    answer = client.recommendations(IDLE_USER, k=5)
    assert [i.item_id for i in answer.items if i.source == "model"] == ["84029G", "22720", "85123A"]
    assert [i.source for i in answer.items[3:]] == ["trending", "trending"]  # fills the rest


def test_recommendations_for_a_cold_user_come_from_their_category_and_region(
    client: ServingClient, seeded: SeededStore
) -> None:
    answer = client.recommendations(COLD_USER, k=6, region=UK)
    assert not answer.known_user and answer.model_version == "v1"
    sources = [i.source for i in answer.items]
    # BAGS in the United Kingdom first, BAGS anywhere, then the region's top sellers.
    assert answer.items[0].item_id == "20725" and sources[0] == "top_sellers_category_region"
    assert "85099B" in _ids(answer)[:3]
    assert "top_sellers_region" in sources
    assert set(sources) <= {"top_sellers_category_region", "top_sellers_category",
                            "top_sellers_region", "top_sellers_global", "trending"}
    assert len(set(_ids(answer))) == 6
    _assert_fresh(answer, "top_sellers_category_region", seeded)


def test_recommendations_for_a_stranger_are_global_top_sellers(client: ServingClient) -> None:
    answer = client.recommendations(NEW_USER, k=4)
    assert not answer.known_user
    global_items = [i.item_id for i in answer.items if i.source == "top_sellers_global"]
    assert global_items[:2] == ["84029G", "21730"]  # the 24h fallback window
    assert answer.freshness["user_activity"].as_of is None


def test_recommendations_follow_the_live_pointer(client: ServingClient, redis_client: Any) -> None:
    assert client.recommendations(KNOWN_USER, k=3).model_version == "v1"
    write_model(redis_client, "v2")
    switched = client.recommendations(KNOWN_USER, k=3, region=DE)
    assert switched.model_version == "v2"
    assert [i.item_id for i in switched.items if i.source == "model"][:2] == ["20725", "85099B"]
    switch_live(redis_client, "v1")
    assert client.recommendations(KNOWN_USER, k=3).model_version == "v1"


def test_recommendations_exclude_recent_purchases(serving_settings: Settings, redis_client: Any,
                                                  seeded: SeededStore) -> None:
    # user_activity carries the user's last purchased items (the stream and backfill compute them)
    row = dict(user_rows(seeded.as_of)[0], last_purchased_items=["85123A"])
    write_entity_rows(redis_client, USER_ACTIVITY, [row])
    with ServingClient(serving_settings) as c:
        assert "85123A" not in _ids(c.recommendations(KNOWN_USER, k=5))
        assert "85123A" in _ids(c.recommendations(KNOWN_USER, k=5, exclude_purchased=False))


def test_similar_items_of_a_known_item(client: ServingClient) -> None:
    answer = client.similar_items("85123A", k=5)
    assert _ids(answer) == ["71053", "21730", "84406B"]  # never the item itself
    assert {i.source for i in answer.items} == {"model"} and answer.model_version == "v1"
    assert answer.freshness["model"].as_of is not None


def test_similar_items_without_neighbours_fall_back_to_its_category(client: ServingClient) -> None:
    answer = client.similar_items(KNOWN_ITEM_WITHOUT_NEIGHBOURS, k=3)
    assert KNOWN_ITEM_WITHOUT_NEIGHBOURS not in _ids(answer)
    assert answer.items[0].source == "top_sellers_category"  # HOME
    assert answer.items[0].item_id == "84406B"


def test_similar_items_of_an_unknown_item_raise(client: ServingClient) -> None:
    with pytest.raises(UnknownItem, match="unknown item"):
        client.similar_items(UNKNOWN_ITEM)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c: c.top_sellers("7d"), "window"),
        (lambda c: c.top_sellers("1h", k=0), "k"),
        (lambda c: c.top_sellers("1h", k=101), "k"),
        (lambda c: c.top_sellers("1h", category="a/b"), "category"),
        (lambda c: c.recommendations("x" * 65), "user_id"),
        (lambda c: c.recommendations("u1", region="*"), "region"),
        (lambda c: c.similar_items(""), "item_id"),
    ],
)
def test_bad_parameters_raise_invalid_parameter(client: ServingClient, call: Any, param: str) -> None:
    with pytest.raises(InvalidParameter) as info:
        call(client)
    assert info.value.param == param


def test_ready_reports_redis_and_the_live_model(client: ServingClient, redis_client: Any) -> None:
    ready = client.ready()
    assert ready.status == "ready" and ready.redis and ready.model_version == "v1"
    redis_client.delete("ss:v1:model:live")
    not_ready = client.ready()
    assert not_ready.status == "not_ready" and not_ready.redis and "live model" in (not_ready.detail or "")


def test_async_client_gives_the_same_answers(serving_settings: Settings, seeded: SeededStore,
                                             client: ServingClient) -> None:
    async def run() -> tuple[Any, ...]:
        async with AsyncServingClient(serving_settings) as c:
            return await asyncio.gather(
                c.top_sellers("1h", k=5),
                c.recommendations(KNOWN_USER, k=8, region=UK),
                c.recommendations(COLD_USER, k=5, region=UK),
                c.similar_items("85123A"),
                c.ready(),
            )

    top, recs, cold, similar, ready = asyncio.run(run())
    assert _ids(top) == _ids(client.top_sellers("1h", k=5))
    assert isinstance(recs, RecommendationsResponse)
    assert _ids(recs) == _ids(client.recommendations(KNOWN_USER, k=8, region=UK))
    assert _ids(cold) == _ids(client.recommendations(COLD_USER, k=5, region=UK))
    assert _ids(similar) == _ids(client.similar_items("85123A"))
    assert ready.status == "ready"
