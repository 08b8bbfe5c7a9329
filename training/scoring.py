"""Batch scoring into Redis under a model version, and the atomic live-version switch.

For a model version (the champion), every known user's top-N unseen items and every
item's top-N similar items are written as sorted sets (item -> score) under keys that
carry the version (:func:`features.online_keys.user_recs_key`,
:func:`~features.online_keys.similar_items_key`), chunked and pipelined
(``transaction=False``: one round trip per chunk), each with TTL ``REC_TTL``. Each key
is deleted and rewritten in the same pipeline, so re-scoring a version replaces its
lists instead of merging into them.

Only when all of that is written does one ``MULTI``/``EXEC`` (under ``WATCH`` of the
pointer) set ``previous = old live``, ``live = new`` and record the switch time, so a
reader sees either the old version's lists or the new one's, never a mix. The old
version's keys are not deleted: they expire with their TTL, which is what makes a
rollback an instant pointer swap (:func:`rollback_live`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import redis

from features.online_keys import (
    REC_TTL,
    live_model_key,
    model_versions_key,
    previous_model_key,
    similar_items_key,
    user_recs_key,
)
from training.models import Recommender

__all__ = [
    "ScoringStats",
    "write_recommendations",
    "switch_live",
    "rollback_live",
    "live_version",
    "previous_version",
    "has_version",
]

_log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
"""``(what, done, total)`` callback for progress bars."""


@dataclass(frozen=True)
class ScoringStats:
    version: str
    users: int
    items: int
    keys: int
    seconds: float
    probe_user: str | None


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def write_recommendations(
    client: redis.Redis,
    model: Recommender,
    version: str,
    *,
    top_n: int = 100,
    chunk: int = 1000,
    ttl: int = REC_TTL,
    similar: bool = True,
    progress: Progress | None = None,
) -> ScoringStats:
    """Write per-user recommendations and per-item similar items for ``version``.

    Parameters
    ----------
    client:
        Redis client (from :func:`pipelines.connections.redis_client`).
    model:
        The fitted recommender of that version.
    version:
        Registry version (becomes part of every key).
    top_n, chunk, ttl:
        List length, users/items per pipelined round trip, seconds to live.
    similar:
        Also write similar items per item.
    """
    started = time.perf_counter()
    keys = 0
    users = np.arange(model.n_users)
    probe: str | None = None
    for start in range(0, len(users), chunk):
        batch = users[start : start + chunk]
        idx, val = model.recommend(batch, top_n, exclude_seen=True)
        pipe = client.pipeline(transaction=False)
        for u, row_i, row_v in zip(batch, idx, val, strict=True):
            ok = row_i >= 0
            if not ok.any():
                continue
            key = user_recs_key(version, str(model.user_ids[u]))
            pipe.delete(key)
            pipe.zadd(key, dict(zip(model.item_ids[row_i[ok]].tolist(), row_v[ok].astype(float).tolist(), strict=True)))
            pipe.expire(key, ttl)
            keys += 1
            probe = probe or str(model.user_ids[u])
        pipe.execute()
        if progress:
            progress("users", min(start + chunk, len(users)), len(users))
    if similar:
        items = np.arange(model.n_items)
        for start in range(0, len(items), chunk):
            batch = items[start : start + chunk]
            idx, val = model.similar_items(batch, top_n)
            pipe = client.pipeline(transaction=False)
            for i, row_i, row_v in zip(batch, idx, val, strict=True):
                ok = row_i >= 0
                if not ok.any():
                    continue
                key = similar_items_key(version, str(model.item_ids[i]))
                pipe.delete(key)
                pipe.zadd(key, dict(zip(model.item_ids[row_i[ok]].tolist(), row_v[ok].astype(float).tolist(), strict=True)))
                pipe.expire(key, ttl)
                keys += 1
            pipe.execute()
            if progress:
                progress("items", min(start + chunk, len(items)), len(items))
    seconds = time.perf_counter() - started
    _log.info("scored version %s: %d keys in %.1fs", version, keys, seconds)
    return ScoringStats(version, model.n_users, model.n_items if similar else 0, keys, seconds, probe)


def live_version(client: redis.Redis) -> str | None:
    return _text(client.get(live_model_key()))


def previous_version(client: redis.Redis) -> str | None:
    return _text(client.get(previous_model_key()))


def has_version(client: redis.Redis, version: str, probe_user: str | None) -> bool:
    """Whether ``version``'s lists are still in Redis (checked on one known user's key)."""
    return bool(probe_user) and bool(client.exists(user_recs_key(version, probe_user)))


def switch_live(client: redis.Redis, version: str) -> str | None:
    """Atomically make ``version`` live; the old live version becomes ``previous``.

    ``WATCH`` on the pointer makes a concurrent switch retry instead of losing an
    update. Switching to the version that is already live changes nothing.
    Returns the version that was live before.
    """
    live, prev = live_model_key(), previous_model_key()
    old: list[str | None] = [None]

    def txn(pipe: redis.client.Pipeline) -> None:
        current = _text(pipe.get(live))
        old[0] = current
        pipe.multi()
        if current == version:
            return
        if current is not None:
            pipe.set(prev, current)
        pipe.set(live, version)
        pipe.zadd(model_versions_key(), {version: time.time()})

    client.transaction(txn, live)
    _log.info("live model version %s -> %s", old[0], version)
    return old[0]


def rollback_live(client: redis.Redis, to_version: str | None = None) -> tuple[str | None, str]:
    """Swap the live and previous pointers in one transaction; returns ``(from, to)``.

    ``to_version`` (e.g. the registry's rollback target) overrides the stored
    ``previous`` pointer.
    """
    live, prev = live_model_key(), previous_model_key()
    result: list[str | None] = [None, None]

    def txn(pipe: redis.client.Pipeline) -> None:
        current = _text(pipe.get(live))
        target = to_version or _text(pipe.get(prev))
        if target is None:
            raise LookupError("no previous model version to roll back to")
        result[0], result[1] = current, target
        pipe.multi()
        pipe.set(live, target)
        if current is not None and current != target:
            pipe.set(prev, current)
        pipe.zadd(model_versions_key(), {target: time.time()})

    client.transaction(txn, live, prev)
    _log.info("rolled back live model version %s -> %s", result[0], result[1])
    return result[0], str(result[1])
