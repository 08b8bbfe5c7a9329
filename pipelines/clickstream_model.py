"""A synthetic store clickstream: the pure model behind ``shopstream generate``.

No I/O and no clocks: given a :class:`GeneratorConfig` and a start time, it
yields the same records, byte for byte, every time. The producing side
(:mod:`pipelines.generate`) decides where they go and how fast.

The store
    Items belong to categories and have a fixed price (log-normal around a
    per-category level, charm-priced ``x.99``). Item popularity is Zipf-like
    (weight ``1 / rank**1.1``); a category's share of traffic is the sum of its
    items' weights, so outside personal taste the item distribution is exactly
    that Zipf law. Users live in one of :data:`REGIONS` (skewed weights), have a
    primary device (used for 80 % of their sessions), an activity level
    (``1 / rank**0.7``: a few heavy users) and three favourite categories that
    take 80 % of their views. The store depends only on the sizes (users,
    items, categories), not on the seed, so successive runs describe the same
    store; ``seed`` drives the traffic.

Sessions
    A session is ``~Geometric(mean 5)`` product views; after each view the item
    goes into the cart with probability :data:`CART_RATE` (quantity mostly 1),
    and at checkout, at the end of the session, each cart line is bought with
    probability :data:`PURCHASE_RATE`. So about 9 % of views add to cart, about
    35 % of cart lines are bought, and about 3 % of views end in a purchase.

Time
    Event times form a Poisson process at ``rate`` events per second. About
    ``rate * 20`` sessions are open at once; each event belongs to one of them
    chosen at random, so a user's consecutive actions are ~20 s apart and the
    stream is in event-time order from the first event (no warm-up ramp).

Bad records
    With probability ``bad_fraction`` a record is replaced by a malformed one
    of a kind drawn uniformly from :data:`BAD_KINDS`: each kind breaks one rule
    of the event contract, and its label is exactly what
    :func:`features.events.validate_event` answers for it (``reason`` or
    ``reason:field``). The ``duplicate`` kind re-sends an earlier valid record
    unchanged (same key and bytes), which the stream must count once.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson

from features.events import MAX_ID_LENGTH, Reason

__all__ = [
    "REGIONS",
    "DEVICES",
    "CART_RATE",
    "PURCHASE_RATE",
    "MEAN_VIEWS_PER_SESSION",
    "DEFAULT_NOMINAL_RATE",
    "BAD_KINDS",
    "DUPLICATE",
    "GeneratorConfig",
    "Record",
    "Store",
    "ClickstreamModel",
    "corrupt",
    "format_millis",
]

REGIONS: tuple[tuple[str, float], ...] = (
    ("United Kingdom", 0.30),
    ("Germany", 0.13),
    ("France", 0.11),
    ("Netherlands", 0.07),
    ("Spain", 0.07),
    ("Italy", 0.06),
    ("Poland", 0.05),
    ("Ireland", 0.05),
    ("Belgium", 0.05),
    ("Sweden", 0.04),
    ("Switzerland", 0.04),
    ("Portugal", 0.03),
)
"""Region names and traffic shares (ASCII, so a Latin-1 re-encoding changes only what we inject)."""

DEVICES: tuple[tuple[str, float], ...] = (
    ("mobile-web", 0.38),
    ("desktop", 0.30),
    ("ios-app", 0.16),
    ("android-app", 0.11),
    ("tablet", 0.05),
)

CART_RATE = 0.09
"""Probability that a view is followed by an add-to-cart of the same item."""
PURCHASE_RATE = 0.35
"""Probability that a cart line is bought at checkout."""
MEAN_VIEWS_PER_SESSION = 5.0
ITEM_ZIPF_EXPONENT = 1.1
CATEGORY_ZIPF_EXPONENT = 0.8
USER_ACTIVITY_EXPONENT = 0.7
AFFINITY = 0.8
"""Share of a user's views that fall in one of their favourite categories."""
FAVOURITE_SHARES = (0.5, 0.3, 0.2)
PRIMARY_DEVICE_SHARE = 0.8
QUANTITIES = ((1, 0.80), (2, 0.13), (3, 0.05), (4, 0.015), (6, 0.005))
MEAN_THINK_SECONDS = 20.0
MAX_OPEN_SESSIONS = 50_000
DEFAULT_NOMINAL_RATE = 1000.0
"""Simulated events per second when the generator is not paced by ``--rate``."""
STORE_SEED = 20_101_201
"""Seeds the store (catalog, users), which must not change with ``--seed``."""

DUPLICATE = "duplicate"
BAD_KINDS: tuple[str, ...] = (
    Reason.EMPTY_PAYLOAD.value,
    Reason.INVALID_ENCODING.value,
    Reason.INVALID_JSON.value,
    Reason.NOT_AN_OBJECT.value,
    Reason.MISSING_FIELD.value,
    Reason.WRONG_TYPE.value,
    Reason.EMPTY_FIELD.value,
    Reason.FIELD_TOO_LONG.value,
    Reason.UNKNOWN_EVENT_TYPE.value,
    Reason.INVALID_TIMESTAMP.value,
    Reason.FUTURE_TIMESTAMP.value,
    Reason.NUMERIC_OVERFLOW.value,
    Reason.NEGATIVE_PRICE.value,
    Reason.MISSING_PRICE.value,
    Reason.INVALID_QUANTITY.value,
    DUPLICATE,
)
"""Every kind of bad record the generator mixes in (named after the contract's reason codes)."""

_VIEW, _CART, _PURCHASE = 0, 1, 2
_EVENT_TYPE_NAMES = ("view", "add_to_cart", "purchase")
_BLOCK = 8192
_DUP_RING = 1024
_MILLIS_PER_100_YEARS = 36_525 * 86_400_000


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    """What the generated store and traffic look like.

    Parameters
    ----------
    seed
        Drives the traffic: the same seed and options give byte-identical records.
    users, items, categories
        Size of the store.
    bad_fraction
        Share of records replaced by malformed ones (0..1).
    nominal_rate
        Simulated events per second when not paced by a real rate.
    random_ids
        Event ids as random UUIDv4 text (drawn from the seed and the run, so a re-run
        re-sends the same ids) instead of the run's tag and a sequence number. Real
        clients often send UUIDs; they do not sort in arrival order, which a state keyed
        by the id feels. The events are otherwise the same.
    """

    seed: int = 42
    users: int = 10_000
    items: int = 2_000
    categories: int = 40
    bad_fraction: float = 0.0
    nominal_rate: float = DEFAULT_NOMINAL_RATE
    random_ids: bool = False

    def __post_init__(self) -> None:
        for name in ("users", "items", "categories"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0.0 <= self.bad_fraction <= 1.0:
            raise ValueError("bad_fraction must be between 0 and 1")
        if not self.nominal_rate > 0:
            raise ValueError("nominal_rate must be positive")


class Record(NamedTuple):
    """One raw Kafka record and what the contract will say about it."""

    key: bytes | None
    value: bytes
    label: str | None
    """``None`` for a valid event, ``"duplicate"``, or the intended rejection (``reason[:field]``)."""
    time_ms: int
    """When the record is due (simulated event time, epoch millis)."""


def _zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Weights ``1/rank**exponent`` over a random assignment of ranks (normalized)."""
    ranks = rng.permutation(n)
    weights = 1.0 / (ranks + 1.0) ** exponent
    return weights / weights.sum()


def _cumulative(weights: np.ndarray) -> np.ndarray:
    cum = np.cumsum(weights)
    cum /= cum[-1]
    return cum


def _draw(cum: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling: index ``i`` with probability ``cum[i] - cum[i-1]``."""
    return np.minimum(np.searchsorted(cum, uniforms, side="right"), len(cum) - 1)


def _id_width(n: int) -> int:
    return max(4, len(str(n - 1)))


def _charm_price(raw: np.ndarray) -> np.ndarray:
    """Shop prices: ``x.99`` from 0.99 up, at most 4999.99."""
    return np.clip(np.floor(raw), 0, 4999) + 0.99


class Store:
    """Catalog and customers: ids, categories, prices, regions, tastes.

    Built from the sizes only (see :data:`STORE_SEED`), so two runs with
    different seeds sell the same items at the same prices to the same users.
    """

    def __init__(self, users: int, items: int, categories: int) -> None:
        rng = np.random.default_rng([STORE_SEED, users, items, categories])
        self.n_users, self.n_items, self.n_categories = users, items, categories

        # Items: popularity, category (every category gets an item when there are enough), price.
        item_weight = _zipf_weights(items, ITEM_ZIPF_EXPONENT, rng)
        category_size = _zipf_weights(categories, CATEGORY_ZIPF_EXPONENT, rng)
        item_category = rng.choice(categories, size=items, p=category_size)
        covered = min(items, categories)
        item_category[:covered] = rng.permutation(categories)[:covered]
        category_level = rng.lognormal(mean=np.log(25.0), sigma=0.8, size=categories)
        self.item_price = _charm_price(
            category_level[item_category] * rng.lognormal(mean=0.0, sigma=0.5, size=items)
        )
        self.item_category = item_category

        # Items sorted by category, so one searchsorted draws "an item of category c by popularity":
        # category c's segment of ``segment_cum`` runs from c to c + 1.
        order = np.argsort(item_category, kind="stable")
        self._items_by_category = order
        sorted_category = item_category[order]
        sorted_weight = item_weight[order]
        self.category_mass = np.bincount(item_category, weights=item_weight, minlength=categories)
        within = np.cumsum(sorted_weight)
        seg_start = np.searchsorted(sorted_category, np.arange(categories), side="left")
        seg_end = np.searchsorted(sorted_category, np.arange(categories), side="right")
        base = np.where(seg_start > 0, within[np.maximum(seg_start - 1, 0)], 0.0)
        self._segment_cum = sorted_category + (within - base[sorted_category]) / np.maximum(
            self.category_mass[sorted_category], 1e-300
        )
        self._segment_cum[seg_end[sorted_category] - 1] = sorted_category + 1.0
        self._seg_start, self._seg_end = seg_start, seg_end
        self._category_cum = _cumulative(self.category_mass)
        self.item_weight = item_weight

        # Users: region, primary device, activity, favourite categories.
        region_p = np.array([w for _, w in REGIONS])
        device_p = np.array([w for _, w in DEVICES])
        self.user_region = rng.choice(len(REGIONS), size=users, p=region_p / region_p.sum())
        self.user_device = rng.choice(len(DEVICES), size=users, p=device_p / device_p.sum())
        self._user_cum = _cumulative(_zipf_weights(users, USER_ACTIVITY_EXPONENT, rng))
        self.user_favourites = _draw(
            self._category_cum, rng.random((users, len(FAVOURITE_SHARES)))
        )
        self._device_cum = _cumulative(device_p)

        # Wire strings, computed once.
        uw, iw, cw = _id_width(users), _id_width(items), _id_width(categories)
        self.user_ids = [f"u{i:0{uw}d}" for i in range(users)]
        self.user_keys = [u.encode() for u in self.user_ids]
        self.item_ids = [f"i{i:0{iw}d}" for i in range(items)]
        self.category_ids = [f"c{i:0{cw}d}" for i in range(categories)]
        self.region_names = [name for name, _ in REGIONS]
        self.device_names = [name for name, _ in DEVICES]

    def draw_users(self, uniforms: np.ndarray) -> np.ndarray:
        return _draw(self._user_cum, uniforms)

    def draw_categories(self, uniforms: np.ndarray) -> np.ndarray:
        return _draw(self._category_cum, uniforms)

    def draw_devices(self, uniforms: np.ndarray) -> np.ndarray:
        return _draw(self._device_cum, uniforms)

    def draw_items(self, categories: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        """An item of each given category, by popularity within the category."""
        pos = np.searchsorted(self._segment_cum, categories + np.minimum(uniforms, 1 - 1e-9), side="right")
        pos = np.clip(pos, self._seg_start[categories], self._seg_end[categories] - 1)
        return self._items_by_category[pos]


class ClickstreamModel:
    """The record stream of one run: ``model.records(start_ms)`` yields :class:`Record` forever.

    Building the model draws the store and the sessions already under way
    (the costly part); :meth:`records` then fixes the start time and the ids.

    Parameters
    ----------
    config
        Store size, seed, bad fraction.
    rate
        Simulated events per second (default ``config.nominal_rate``).
    """

    def __init__(self, config: GeneratorConfig, rate: float | None = None) -> None:
        self.config = config
        self.rate = float(rate or config.nominal_rate)
        self.store = Store(config.users, config.items, config.categories)
        self.open_sessions = int(min(MAX_OPEN_SESSIONS, max(1, round(self.rate * MEAN_THINK_SECONDS))))
        self._session_rng = np.random.default_rng([config.seed, 1])
        self._stream_rng = np.random.default_rng([config.seed, 2])
        self._mutation_rng = random.Random(config.seed * 1_000_003 + 3)
        self._session_seq = 0
        self._quantities = np.array([q for q, _ in QUANTITIES])
        self._quantity_cum = _cumulative(np.array([w for _, w in QUANTITIES]))
        self._user_region = [self.store.region_names[r] for r in self.store.user_region.tolist()]
        self.run_tag = ""
        # Drawn now, so that a paced run's clock starts after this (it takes a moment).
        self._warm = self._sessions_in_progress(self.open_sessions)
        self._started = False

    # ----------------------------------------------------------- sessions
    def _draw_sessions(self, n: int) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        """``n`` sessions as ``(user, device, events)``, events ``(type, item, quantity)`` in order."""
        store, rng = self.store, self._session_rng
        users = store.draw_users(rng.random(n))
        devices = np.where(
            rng.random(n) < PRIMARY_DEVICE_SHARE, store.user_device[users], store.draw_devices(rng.random(n))
        )
        n_views = np.minimum(rng.geometric(1.0 / MEAN_VIEWS_PER_SESSION, size=n), 60)
        view_session = np.repeat(np.arange(n), n_views)
        v = len(view_session)
        view_user = users[view_session]
        shares = np.cumsum(FAVOURITE_SHARES)
        which = np.searchsorted(shares / shares[-1], rng.random(v), side="right")
        favourite = store.user_favourites[view_user, np.minimum(which, len(FAVOURITE_SHARES) - 1)]
        category = np.where(rng.random(v) < AFFINITY, favourite, store.draw_categories(rng.random(v)))
        items = store.draw_items(category, rng.random(v))
        carted = rng.random(v) < CART_RATE
        quantity = self._quantities[_draw(self._quantity_cum, rng.random(v))]
        bought = carted & (rng.random(v) < PURCHASE_RATE)

        items_l, carted_l, qty_l, bought_l = items.tolist(), carted.tolist(), quantity.tolist(), bought.tolist()
        sessions = []
        pos = 0
        for user, device, nv in zip(users.tolist(), devices.tolist(), n_views.tolist(), strict=True):
            events: list[tuple[int, int, int]] = []
            checkout: list[tuple[int, int, int]] = []
            for j in range(pos, pos + nv):
                item = items_l[j]
                events.append((_VIEW, item, 1))
                if carted_l[j]:
                    events.append((_CART, item, qty_l[j]))
                    if bought_l[j]:
                        checkout.append((_PURCHASE, item, qty_l[j]))
            pos += nv
            events.extend(checkout)
            sessions.append((user, device, events))
        return sessions

    def _open(
        self, drawn: list[tuple[int, int, list[tuple[int, int, int]]]]
    ) -> list[tuple[str, int, list[tuple[int, int, int]]]]:
        """Number the sessions and turn them into ``(json_fragment, user, reversed events)``.

        The fragment holds the session's constant fields (user, session, region,
        device) as JSON, so a record costs one string format.
        """
        user_ids, regions, device_names = self.store.user_ids, self._user_region, self.store.device_names
        opened = []
        for user, device, events in drawn:
            self._session_seq += 1
            fragment = (
                f'"user_id":"{user_ids[user]}","session_id":"{self.run_tag}-s{self._session_seq:09d}",'
                f'"region":"{regions[user]}","device":"{device_names[device]}"'
            )
            opened.append((fragment, user, events[::-1]))
        return opened

    def _new_sessions(self, n: int) -> list[tuple[str, int, list[tuple[int, int, int]]]]:
        return self._open(self._draw_sessions(n))

    def _sessions_in_progress(self, k: int) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        """The ``k`` sessions open when the stream starts, as in the steady state.

        A slot holds a session for as many events as it has, so open sessions
        are drawn in proportion to their length, and each has already been
        under way for a uniform number of its events (those came before the
        start and are not sent). Without this the stream would begin with
        ``k`` fresh sessions and no checkouts for minutes. These are sessions
        ``1..k`` of the run (see :attr:`sessions_in_progress`).
        """
        rng = self._session_rng
        candidates = self._draw_sessions(2 * k)
        lengths = np.array([len(events) for _, _, events in candidates], dtype=float)
        # Weighted sampling without replacement (Efraimidis-Spirakis): the k largest log(u)/w.
        keys = np.log(rng.random(len(candidates))) / lengths
        chosen = np.sort(np.argpartition(-keys, k - 1)[:k])
        skips = (rng.random(k) * lengths[chosen]).astype(int).tolist()
        drawn = []
        for idx, skip in zip(chosen.tolist(), skips, strict=True):
            user, device, events = candidates[idx]
            drawn.append((user, device, events[skip:]))
        return drawn

    @property
    def sessions_in_progress(self) -> int:
        """Sessions numbered up to this started before the first event (their early events are missing)."""
        return self.open_sessions

    # ------------------------------------------------------------- stream
    def records(self, start_ms: int) -> Iterator[Record]:
        """The run's records from ``start_ms`` (epoch millis, UTC), forever; a model runs once."""
        if self._started:
            raise RuntimeError("a ClickstreamModel yields one run; make a new one")
        self._started = True
        tag = f"{self.config.seed}:{int(start_ms)}:{self.config.users}:{self.config.items}:{self.config.categories}"
        # Ids are unique per (seed, start, store): re-running the same command re-sends the
        # same ids (idempotent), a run starting at another time gets new ones.
        self.run_tag = hashlib.blake2b(tag.encode(), digest_size=6).hexdigest()
        return self._records(int(start_ms))

    def _records(self, start_ms: int) -> Iterator[Record]:
        rng, mrng = self._stream_rng, self._mutation_rng
        k = self.open_sessions
        slots = self._open(self._warm)
        self._warm = []
        queue: list[tuple[str, int, list[tuple[int, int, int]]]] = []
        user_keys = self.store.user_keys
        item_fragments = [
            f'"item_id":"{item_id}","category_id":"{self.store.category_ids[c]}",'
            f'"price":{orjson.dumps(price).decode()}'
            for item_id, c, price in zip(
                self.store.item_ids, self.store.item_category.tolist(), self.store.item_price.tolist(), strict=True
            )
        ]
        quantity_fragments = {q: f',"quantity":{q}' for q in self._quantities.tolist()}
        type_names = _EVENT_TYPE_NAMES
        bad_fraction = self.config.bad_fraction
        n_kinds = len(BAD_KINDS)
        ring: list[tuple[bytes, bytes]] = []
        id_prefix = f"{self.run_tag}-"
        # the ids' own generator, so the traffic is the same with either kind of id
        id_rng = random.Random(f"{self.run_tag}/ids") if self.config.random_ids else None
        seq = 0
        clock = 0.0
        mean_gap = 1000.0 / self.rate
        last_sec = -1
        sec_text = ""
        while True:
            gaps = rng.exponential(mean_gap, _BLOCK)
            # Each event waits its gap after the previous one; the first is at the start.
            times = (start_ms + np.floor(clock + np.cumsum(gaps) - gaps)).astype(np.int64).tolist()
            clock += float(gaps.sum())
            picks = rng.integers(0, k, _BLOCK).tolist()
            bad = (rng.random(_BLOCK) < bad_fraction).tolist() if bad_fraction > 0 else None
            kinds = rng.integers(0, n_kinds, _BLOCK).tolist()
            for i in range(_BLOCK):
                t_ms = times[i]
                kind = BAD_KINDS[kinds[i]] if bad is not None and bad[i] else None
                if kind == DUPLICATE:
                    if ring:
                        key, value = ring[mrng.randrange(len(ring))]
                        yield Record(key, value, DUPLICATE, t_ms)
                        continue
                    kind = Reason.INVALID_JSON.value  # nothing sent yet to duplicate
                slot = picks[i]
                fragment, user, events = slots[slot]
                etype, item, qty = events.pop()
                if not events:
                    if not queue:
                        queue = self._new_sessions(4096)
                        queue.reverse()
                    slots[slot] = queue.pop()
                sec = t_ms // 1000
                if sec != last_sec:
                    last_sec = sec
                    sec_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
                seq += 1
                event_id = (f"{id_prefix}{seq:010d}" if id_rng is None
                            else str(uuid.UUID(int=id_rng.getrandbits(128), version=4)))
                value = (
                    f'{{"event_id":"{event_id}","event_type":"{type_names[etype]}",'
                    f'"event_time":"{sec_text}.{t_ms % 1000:03d}Z",{fragment},{item_fragments[item]}'
                    f'{quantity_fragments[qty] if etype else ""}}}'
                ).encode()
                key = user_keys[user]
                if kind is None:
                    if len(ring) < _DUP_RING:
                        ring.append((key, value))
                    else:
                        ring[seq % _DUP_RING] = (key, value)
                    yield Record(key, value, None, t_ms)
                else:
                    yield Record(*corrupt(kind, orjson.loads(value), key, t_ms, mrng), t_ms)


def format_millis(t_ms: int) -> str:
    """Epoch millis as the wire's ISO-8601 UTC form, e.g. ``2024-06-01T12:00:00.000Z``."""
    sec, ms = divmod(int(t_ms), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{ms:03d}Z"


def corrupt(
    kind: str, event: dict[str, Any], key: bytes, t_ms: int, rnd: random.Random
) -> tuple[bytes | None, bytes, str]:
    """Break one contract rule in a copy of ``event`` the way real producers do.

    Parameters
    ----------
    kind
        One of :data:`BAD_KINDS` except ``duplicate``.
    event
        A valid event (not modified).
    key
        Its Kafka key (the user id), kept on the bad record: the intended user.
    t_ms
        The event's time, for timestamp faults.
    rnd
        Seeded source for the details (which field, which wrong value).

    Returns
    -------
    tuple
        ``(key, value, label)`` where ``label`` is what
        :func:`features.events.validate_event` answers (``reason`` or ``reason:field``).
    """
    ev = dict(event)
    if kind == Reason.EMPTY_PAYLOAD:
        return None, b"", kind  # a keyless, empty record: nothing to attribute it to
    if kind == Reason.INVALID_ENCODING:
        # A producer that writes Latin-1: 'é' becomes the lone byte 0xE9.
        ev["device"] = "téléphone"
        return key, orjson.dumps(ev).decode().encode("latin-1"), kind
    raw = orjson.dumps(ev)
    if kind == Reason.INVALID_JSON:
        return key, raw[: rnd.randint(1, len(raw) - 2)], kind  # truncated in transit
    if kind == Reason.NOT_AN_OBJECT:
        return key, b"[" + raw + b"]", kind  # a batch sent as one record
    if kind == Reason.MISSING_FIELD:
        name = rnd.choice(("event_id", "event_type", "event_time", "user_id", "session_id",
                           "item_id", "category_id", "region"))
        del ev[name]
    elif kind == Reason.WRONG_TYPE:
        name = rnd.choice(("user_id", "item_id", "price", "quantity"))
        if name in ("user_id", "item_id"):
            ev[name] = int(ev[name][1:])
        elif name == "price":
            ev[name] = f"{ev['price']:.2f}"
        else:
            ev[name] = str(ev.get("quantity", 1))
    elif kind == Reason.EMPTY_FIELD:
        name = rnd.choice(("session_id", "item_id", "category_id", "region"))
        ev[name] = rnd.choice(("", " ", "\t"))
    elif kind == Reason.FIELD_TOO_LONG:
        name = rnd.choice(("session_id", "item_id"))
        ev[name] = (ev[name] + "/") * (MAX_ID_LENGTH // len(ev[name]) + 1)
    elif kind == Reason.UNKNOWN_EVENT_TYPE:
        name = "event_type"
        ev[name] = rnd.choice(("click", "wishlist", "remove_from_cart", "VIEW"))
    elif kind == Reason.INVALID_TIMESTAMP:
        name = "event_time"
        sec = time.gmtime(t_ms // 1000)
        ev[name] = rnd.choice((
            time.strftime("%m/%d/%Y %H:%M:%S", sec),  # US-style local format
            time.strftime("%Y-13-%dT%H:%M:%SZ", sec),  # month 13
            t_ms // 1000 + 0.5,  # epoch seconds with a fraction, not millis
        ))
    elif kind == Reason.FUTURE_TIMESTAMP:
        name = "event_time"
        ev[name] = format_millis(t_ms + _MILLIS_PER_100_YEARS)  # a century-off clock
    elif kind == Reason.NUMERIC_OVERFLOW:
        name = rnd.choice(("price", "quantity"))
        ev[name] = 1e12 if name == "price" else 2**40
    elif kind == Reason.NEGATIVE_PRICE:
        name = "price"
        ev[name] = -ev["price"]  # a refund sent as a purchase
    elif kind == Reason.MISSING_PRICE:
        name = "price"
        if ev["event_type"] == "view":
            ev["event_type"] = "purchase"
        del ev[name]
    elif kind == Reason.INVALID_QUANTITY:
        name = "quantity"
        ev[name] = rnd.choice((0, -1, 1.5))
    else:
        raise ValueError(f"unknown bad record kind {kind!r}")
    return key, orjson.dumps(ev), f"{kind}:{name}"
