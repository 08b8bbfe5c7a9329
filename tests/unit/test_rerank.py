"""Request-time re-ranking rules (pure functions, no Redis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.models import RankedItem
from serving.rerank import (
    ACTIVE_HORIZON_MS,
    RerankParams,
    Scored,
    UserFeatures,
    UserSignals,
    blend_fallback,
    mix_trending,
    rank_candidates,
    rerank,
    user_signals,
)

NOW = 1_750_000_000_000
CATS = {"a": "shoes", "b": "hats", "c": "shoes", "d": "bags", "e": "hats", "v1": "bags"}


def _ids(items: list[RankedItem] | list[tuple[str, float]]) -> list[str]:
    return [i[0] if isinstance(i, tuple) else i.item_id for i in items]


def _active_user(**changes: object) -> UserFeatures:
    values: dict[str, object] = {
        "as_of_ms": NOW - 2_000,
        "last_event_time_ms": NOW - 60_000,
        "events_1h": 3,
        "top_category": "hats",
        "category_affinity": (("hats", 6.0), ("bags", 3.0)),
        "last_items_viewed": (),
    }
    values.update(changes)
    return UserFeatures(**values)  # type: ignore[arg-type]


CANDIDATES = [Scored("a", 0.9), Scored("b", 0.5), Scored("c", 0.4), Scored("d", 0.3), Scored("e", 0.1)]


def test_rank_candidates_keeps_model_order_without_activity() -> None:
    ranked = rank_candidates(CANDIDATES[::-1], CATS, UserSignals(), category_boost=0.5)
    assert _ids(ranked) == ["a", "b", "c", "d", "e"]


def test_rank_candidates_boosts_active_categories() -> None:
    signals = UserSignals(active_categories={"hats": 1.0})
    ranked = rank_candidates(CANDIDATES, CATS, signals, category_boost=0.5)
    # b (hats): 0.5 normalised + 0.5 boost ties with a (1.0); the model score breaks the tie.
    # e (hats), the model's worst candidate, overtakes c and d.
    assert _ids(ranked) == ["a", "b", "e", "c", "d"]


def test_rank_candidates_boost_is_independent_of_score_scale() -> None:
    signals = UserSignals(active_categories={"hats": 1.0, "bags": 0.5})
    small = rank_candidates(CANDIDATES, CATS, signals, category_boost=0.5)
    large = rank_candidates([Scored(c.item_id, c.score * 1000) for c in CANDIDATES], CATS, signals,
                            category_boost=0.5)
    assert _ids(small) == _ids(large)


def test_rank_candidates_removes_excluded_and_duplicates() -> None:
    ranked = rank_candidates(CANDIDATES + [Scored("a", 0.01)], CATS, UserSignals(),
                             category_boost=0.5, exclude={"b"})
    assert _ids(ranked) == ["a", "c", "d", "e"]


def test_user_signals_weights_relative_affinity_and_last_viewed() -> None:
    features = _active_user(last_items_viewed=("c", "v1"))
    signals = user_signals(features, CATS, NOW)
    assert signals.active_categories == {"hats": 1.0, "bags": 0.5, "shoes": 1.0}
    assert signals.recent_categories == ("hats", "shoes")


def test_user_signals_inactive_user_has_no_active_categories() -> None:
    features = _active_user(last_event_time_ms=NOW - ACTIVE_HORIZON_MS - 1, events_1h=0)
    signals = user_signals(features, CATS, NOW)
    assert signals.active_categories == {}
    assert signals.recent_categories == ("hats", "bags")  # still used for cold start


def test_user_signals_without_features_is_empty() -> None:
    assert user_signals(None, CATS, NOW) == UserSignals()


def test_rerank_boosts_the_users_hour_categories() -> None:
    params = RerankParams(category_boost=1.0, trending_share=0.0)
    plain = rerank(CANDIDATES, features=None, item_categories=CATS, trending=[], k=5, now_ms=NOW,
                   params=params)
    boosted = rerank(CANDIDATES, features=_active_user(), item_categories=CATS, trending=[], k=5,
                     now_ms=NOW, params=params)
    assert _ids(plain) == ["a", "b", "c", "d", "e"]
    # hats (b, e) weigh 1 and bags (d) 0.5: b jumps to first, e ties with a (model score wins).
    assert _ids(boosted) == ["b", "a", "e", "d", "c"]
    assert all(item.source == "model" for item in boosted)
    assert [i.score for i in boosted if i.item_id == "e"] == [0.1]  # scores stay the model's


def test_rerank_does_not_boost_a_user_idle_for_over_an_hour() -> None:
    idle = _active_user(last_event_time_ms=NOW - 2 * ACTIVE_HORIZON_MS, events_1h=0)
    ranked = rerank(CANDIDATES, features=idle, item_categories=CATS, trending=[], k=5, now_ms=NOW,
                    params=RerankParams(category_boost=1.0, trending_share=0.0))
    assert _ids(ranked) == ["a", "b", "c", "d", "e"]


def test_rerank_removes_recent_purchases_unless_asked_not_to() -> None:
    buyer = _active_user(recent_purchases=("a", "zz"))
    params = RerankParams(category_boost=0.0, trending_share=0.0)
    kept = rerank(CANDIDATES, features=buyer, item_categories=CATS, trending=[], k=3, now_ms=NOW,
                  params=params)
    everything = rerank(CANDIDATES, features=buyer, item_categories=CATS, trending=[], k=3,
                        now_ms=NOW, params=params, exclude_purchased=False)
    assert _ids(kept) == ["b", "c", "d"]
    assert _ids(everything) == ["a", "b", "c"]


def test_mix_trending_spreads_slots_and_never_takes_the_first() -> None:
    base = [RankedItem(item_id=f"m{i}", score=1.0 - i / 10, source="model") for i in range(10)]
    trending = [Scored("t1", 9.0), Scored("t2", 8.0)]
    mixed = mix_trending(base, trending, k=10, share=0.2)
    assert len(mixed) == 10
    assert mixed[0].source == "model"
    assert [i for i, item in enumerate(mixed) if item.source == "trending"] == [3, 6]
    assert _ids(mixed)[:3] == ["m0", "m1", "m2"]


def test_mix_trending_skips_items_already_listed_and_excluded() -> None:
    base = [RankedItem(item_id=x, score=1.0, source="model") for x in ("a", "b", "c", "d")]
    trending = [Scored("a", 5.0), Scored("x", 4.0), Scored("y", 3.0)]
    mixed = mix_trending(base, trending, k=5, share=0.2, exclude={"x"})
    assert _ids(mixed) == ["a", "b", "y", "c", "d"]
    assert mixed[2].source == "trending"


def test_mix_trending_fills_up_when_the_model_is_short() -> None:
    base = [RankedItem(item_id="a", score=1.0, source="model")]
    mixed = mix_trending(base, [Scored("t1", 2.0), Scored("t2", 1.0), Scored("t3", 0.5)], k=3,
                         share=0.2)
    assert _ids(mixed) == ["a", "t1", "t2"]


def test_mix_trending_with_zero_share_is_the_base() -> None:
    base = [RankedItem(item_id=x, score=1.0, source="model") for x in ("a", "b")]
    assert mix_trending(base, [Scored("t", 1.0)], k=2, share=0.0) == base


def test_blend_fallback_alternates_personal_lists_then_global() -> None:
    personal = [
        ("top_sellers_category", [Scored("c1", 9.0), Scored("c2", 8.0), Scored("shared", 7.0)]),
        ("top_sellers_region", [Scored("shared", 5.0), Scored("r1", 4.0)]),
    ]
    blended = blend_fallback(personal, [Scored("g1", 100.0), Scored("c1", 90.0), Scored("g2", 80.0)],
                             k=7, exclude={"c2"})
    assert _ids(blended) == ["c1", "shared", "r1", "g1", "g2"]
    assert [i.source for i in blended] == [
        "top_sellers_category", "top_sellers_region", "top_sellers_region",
        "top_sellers_global", "top_sellers_global",
    ]


def test_rerank_cold_start_uses_fallbacks_and_trending() -> None:
    ranked = rerank(
        [], features=None, item_categories={}, trending=[Scored("t1", 3.0)], k=5, now_ms=NOW,
        params=RerankParams(trending_share=0.2),
        fallback_personal=[("top_sellers_region", [Scored("r1", 5.0)])],
        fallback_global=[Scored("g1", 10.0), Scored("g2", 9.0), Scored("g3", 8.0), Scored("g4", 7.0)],
    )
    assert _ids(ranked) == ["r1", "g1", "t1", "g2", "g3"]
    assert ranked[0].source == "top_sellers_region" and ranked[2].source == "trending"


_ids_strategy = st.sampled_from([f"i{n}" for n in range(30)])


@settings(max_examples=200, deadline=None)
@given(
    candidates=st.lists(st.tuples(_ids_strategy, st.floats(-1e6, 1e6, allow_nan=False)), max_size=40),
    trending=st.lists(st.tuples(_ids_strategy, st.floats(0, 100, allow_nan=False)), max_size=20),
    purchased=st.frozensets(_ids_strategy, max_size=8),
    k=st.integers(1, 100),
    share=st.floats(0, 1),
    boost=st.floats(0, 5),
)
def test_rerank_answers_are_short_unique_and_respect_exclusions(
    candidates: list[tuple[str, float]], trending: list[tuple[str, float]],
    purchased: frozenset[str], k: int, share: float, boost: float,
) -> None:
    features = _active_user(recent_purchases=tuple(purchased),
                            last_items_viewed=tuple(i for i, _ in candidates[:3]))
    cats = {f"i{n}": ("hats", "bags", "shoes")[n % 3] for n in range(30)}
    ranked = rerank(
        [Scored(i, s) for i, s in candidates], features=features, item_categories=cats,
        trending=[Scored(i, s) for i, s in trending], k=k, now_ms=NOW,
        params=RerankParams(category_boost=boost, trending_share=share),
    )
    ids = _ids(ranked)
    assert len(ids) <= k
    assert len(set(ids)) == len(ids)
    assert not set(ids) & purchased
    available = {i for i, _ in candidates} | {i for i, _ in trending}
    assert len(ids) == min(k, len(available - purchased))
    model = [item for item in ranked if item.source == "model"]
    if model and len(candidates) > 0:
        assert ranked[0].source == "model"
