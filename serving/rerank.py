"""Request-time re-ranking: candidates + a user's fresh features -> the ranked answer.

Pure functions, no I/O: the client reads everything in one Redis round trip and
hands it here, so the ranking rules are unit-tested without a server
(``tests/unit/test_rerank.py``).

The rules, in order:

1. **Remove** items the user bought recently (when ``exclude_purchased``) and
   duplicates.
2. **Boost** model candidates in categories the user was active in during the
   last hour: ``final = minmax(model score) + category_boost * weight(category)``,
   where the weight (0..1) comes from the user's top category affinity and the
   categories of the items they viewed last (:func:`user_signals`). Min-max
   normalisation makes the boost independent of the model's score scale.
3. **Mix in** items trending in the user's region: ``round(k * trending_share)``
   slots spread evenly through the list (never the first ones), filled with
   trending items not already recommended; if the model has too few candidates
   trending items fill the rest.

A user the model does not know gets :func:`blend_fallback` instead of step 2:
top sellers of their recent categories and region taken in turns, then the
global top sellers; step 3 applies the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from serving.models import RankedItem, Source

__all__ = [
    "Scored",
    "Pair",
    "UserFeatures",
    "UserSignals",
    "RerankParams",
    "ACTIVE_HORIZON_MS",
    "is_active",
    "user_signals",
    "rank_candidates",
    "Sourced",
    "blend_fallback",
    "mix_trending",
    "rerank",
]

ACTIVE_HORIZON_MS = 3_600_000
"""A category counts as active when the user touched it within this horizon (1 hour)."""


class Scored(NamedTuple):
    """An item and the score its source gave it.

    Every function here accepts plain ``(item_id, score)`` tuples too, which is
    what the client passes (building them costs a fraction of building objects).
    """

    item_id: str
    score: float


Pair = tuple[str, float]
_score = itemgetter(1)


@dataclass(frozen=True, slots=True)
class UserFeatures:
    """The subset of the ``user_activity`` feature view that re-ranking uses.

    Every field is optional: a user without features (or with a feature the
    feature view does not carry yet) is simply not personalised by it.
    """

    as_of_ms: int | None = None
    """Feast's event timestamp of the row (when the features were computed)."""
    last_event_time_ms: int | None = None
    events_1h: int | None = None
    """Views + add-to-carts + purchases in the last hour."""
    top_category: str | None = None
    category_affinity: tuple[tuple[str, float], ...] = ()
    """(category, weight) pairs, strongest first (any positive scale)."""
    last_items_viewed: tuple[str, ...] = ()
    """Most recent first."""
    recent_purchases: tuple[str, ...] = ()
    region: str | None = None


@dataclass(frozen=True, slots=True)
class UserSignals:
    """What the ranking rules need, derived from :class:`UserFeatures`."""

    active_categories: Mapping[str, float] = field(default_factory=dict)
    """Category -> weight in (0, 1] for categories active within :data:`ACTIVE_HORIZON_MS`."""
    recent_categories: tuple[str, ...] = ()
    """The user's categories, strongest first (for cold-start top sellers)."""
    purchased: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RerankParams:
    category_boost: float = 0.5
    trending_share: float = 0.2
    max_recent_categories: int = 2


def is_active(features: UserFeatures | None, now_ms: int) -> bool:
    """Whether the user did something within :data:`ACTIVE_HORIZON_MS` of ``now_ms``."""
    if features is None:
        return False
    if features.last_event_time_ms is not None:
        return now_ms - features.last_event_time_ms <= ACTIVE_HORIZON_MS
    return bool(features.events_1h)


def user_signals(
    features: UserFeatures | None,
    item_categories: Mapping[str, str | None],
    now_ms: int,
    *,
    max_recent_categories: int = 2,
) -> UserSignals:
    """Derive the ranking signals from a user's features.

    Parameters
    ----------
    features
        The user's ``user_activity`` row, or ``None`` when they have none.
    item_categories
        Category of each item in ``features.last_items_viewed`` (missing or
        ``None`` when unknown).
    now_ms
        Serving time, epoch milliseconds.

    Notes
    -----
    The user is *active* when their last event is within the hour (or, if the
    time is unknown, when they have events in the last hour). Then each
    category of their affinity weighs its weight relative to the strongest
    (the top category weighs 1) and the category of the i-th most recently
    viewed item weighs ``1 / (i + 1)``; a category keeps its largest weight.
    The affinity and the last-N list span 24 hours, so when the user is active
    now their strongest and latest interests stand in for "the last hour": a
    deliberate approximation that favours what the user touched last.
    """
    if features is None:
        return UserSignals()
    ordered: dict[str, float] = {}
    strongest = max((w for _, w in features.category_affinity if w > 0), default=0.0)
    for category, weight in features.category_affinity:
        if category and weight > 0:
            relative = weight / strongest
            if relative > ordered.get(category, 0.0):
                ordered[category] = relative
    if features.top_category and features.top_category not in ordered:
        ordered[features.top_category] = 1.0
    for i, item in enumerate(features.last_items_viewed):
        viewed_category = item_categories.get(item)
        if viewed_category:
            weight = 1.0 / (i + 1)
            if weight > ordered.get(viewed_category, 0.0):
                ordered[viewed_category] = weight
    active = is_active(features, now_ms)
    active_categories = {c: w for c, w in ordered.items() if w > 0} if active else {}
    recent = tuple(sorted(ordered, key=lambda c: -ordered[c])[:max_recent_categories])
    return UserSignals(
        active_categories=active_categories,
        recent_categories=recent,
        purchased=frozenset(features.recent_purchases),
    )


def rank_candidates(
    candidates: Sequence[Pair],
    item_categories: Mapping[str, str | None],
    signals: UserSignals,
    *,
    category_boost: float,
    exclude: Collection[str] = (),
) -> list[Pair]:
    """Model candidates, minus ``exclude``, ordered by boosted score.

    Without a boost the order is the model's (ties in input order); with one,
    ties of the boosted score fall back to the model score, then the item id.
    """
    seen: set[str] = set()
    kept: list[Pair] = []
    for pair in candidates:
        item_id = pair[0]
        if item_id in seen or item_id in exclude:
            continue
        seen.add(item_id)
        kept.append(pair)
    if not kept:
        return []
    active = signals.active_categories
    if not active or category_boost <= 0:
        # Model order; equal scores keep their input order (the store's), and input that
        # arrives sorted, as ZREVRANGE returns it, costs a single linear pass.
        kept.sort(key=_score, reverse=True)
        return kept
    lo = min(p[1] for p in kept)
    span = max(p[1] for p in kept) - lo
    inv = 1.0 / span if span > 0 else 0.0
    base = 0.0 if span > 0 else 1.0
    category_of = item_categories.get
    weight_of = active.get
    decorated = [
        (-(base + (score - lo) * inv + category_boost * weight_of(category_of(item_id) or "", 0.0)),
         -score, item_id, score)
        for item_id, score in kept
    ]
    decorated.sort()
    return [(item_id, score) for _, _, item_id, score in decorated]


Sourced = tuple[str, float, Source]
"""``(item_id, score, source)``: what the rules pass around; :class:`RankedItem` at the end."""


def _ranked_items(items: Sequence[Sourced]) -> list[RankedItem]:
    return [RankedItem(item_id=i, score=v, source=src) for i, v, src in items]


def _blend(
    personal: Sequence[tuple[Source, Sequence[Pair]]],
    global_items: Sequence[Pair],
    k: int,
    exclude: Collection[str],
) -> list[Sourced]:
    out: list[Sourced] = []
    seen: set[str] = set(exclude)
    queues = [(source, list(items)) for source, items in personal if items]
    positions = [0] * len(queues)
    while len(out) < k and queues:
        progressed = False
        for qi, (source, items) in enumerate(queues):
            while positions[qi] < len(items):
                item_id, score = items[positions[qi]]
                positions[qi] += 1
                if item_id not in seen:
                    seen.add(item_id)
                    out.append((item_id, score, source))
                    progressed = True
                    break
            if len(out) >= k:
                break
        if not progressed:
            break
    for item_id, score in global_items:
        if len(out) >= k:
            break
        if item_id not in seen:
            seen.add(item_id)
            out.append((item_id, score, "top_sellers_global"))
    return out


def blend_fallback(
    personal: Sequence[tuple[Source, Sequence[Pair]]],
    global_items: Sequence[Pair],
    *,
    k: int,
    exclude: Collection[str] = (),
) -> list[RankedItem]:
    """Top sellers for a user the model does not know.

    The personal lists (recent categories, region) are taken in turns, so each
    interest is represented, then the global list fills what is left. Items in
    ``exclude`` and repeats are skipped.
    """
    return _ranked_items(_blend(personal, global_items, k, exclude))


def _mix(
    ranked: Sequence[Sourced], trending: Sequence[Pair], k: int, share: float,
    exclude: Collection[str],
) -> list[Sourced]:
    top = list(ranked[:k])
    n_want = int(k * share + 0.5) if share > 0 else 0
    listed = {r[0] for r in top}
    pool: list[Pair] = []
    for pair in trending:
        if pair[0] not in listed and pair[0] not in exclude:
            listed.add(pair[0])
            pool.append(pair)
    n_trend = min(n_want, len(pool))
    base = top[: k - n_trend]
    if len(base) < k - n_trend:
        # Not enough ranked items: trending fills the tail after them.
        n_trend = min(k - len(base), len(pool))
        slots = set(range(len(base), len(base) + n_trend))
    else:
        total = len(base) + n_trend
        slots = {int((j + 1) * total / (n_trend + 1)) for j in range(n_trend)}
    if n_trend == 0:
        return base
    out: list[Sourced] = []
    bi = ti = 0
    for pos in range(len(base) + n_trend):
        if (pos in slots or bi >= len(base)) and ti < n_trend:
            item_id, score = pool[ti]
            ti += 1
            out.append((item_id, score, "trending"))
        else:
            out.append(base[bi])
            bi += 1
    return out


def mix_trending(
    ranked: Sequence[RankedItem],
    trending: Sequence[Pair],
    *,
    k: int,
    share: float,
    exclude: Collection[str] = (),
) -> list[RankedItem]:
    """Place ``round(k * share)`` trending items at evenly spaced slots of the top ``k``.

    Trending items already in the top ``k`` of ``ranked`` or in ``exclude`` are
    skipped; when there are fewer trending items than slots, ``ranked`` keeps
    the spare slots, and when ``ranked`` is short, trending items fill the rest.
    The first slot always stays with ``ranked`` (when it has anything).
    """
    mixed = _mix([(r.item_id, r.score, r.source) for r in ranked], trending, k, share, exclude)
    return _ranked_items(mixed)


def rerank(
    candidates: Sequence[Pair],
    *,
    features: UserFeatures | None,
    item_categories: Mapping[str, str | None],
    trending: Sequence[Pair],
    k: int,
    now_ms: int,
    params: RerankParams = RerankParams(),
    exclude_purchased: bool = True,
    fallback_personal: Sequence[tuple[Source, Sequence[Pair]]] = (),
    fallback_global: Sequence[Pair] = (),
) -> list[RankedItem]:
    """The whole re-ranking: model candidates (or cold-start fallbacks) -> top ``k``.

    Parameters
    ----------
    candidates
        The live model's candidates for the user, any order; empty for a user
        the model does not know, who then gets ``fallback_personal`` (top
        sellers of their categories / region) and ``fallback_global``.
    features
        The user's features (``None``: no personalisation beyond the model).
    item_categories
        Category per item, for candidates and the user's last viewed items.
    trending
        Items trending in the user's region (or globally), best first.
    k
        Answer length.
    now_ms
        Serving time, epoch milliseconds (decides what "last hour" means).

    Returns
    -------
    list[RankedItem]
        At most ``k`` items, best first, each naming its source.
    """
    signals = user_signals(
        features, item_categories, now_ms, max_recent_categories=params.max_recent_categories
    )
    exclude = signals.purchased if exclude_purchased else frozenset()
    if candidates:
        ranked = rank_candidates(
            candidates, item_categories, signals,
            category_boost=params.category_boost, exclude=exclude,
        )
        base: list[Sourced] = [(item_id, score, "model") for item_id, score in ranked[:k]]
    else:
        base = _blend(fallback_personal, fallback_global, k, exclude)
    return _ranked_items(_mix(base, trending, k, params.trending_share, exclude))
