"""The Real-time feed's half of the ``roles`` shape: role rows folded into full tiles.

With ``stream_realtime_shape=roles`` the Real-time query sends each valid, deduplicated
event once per role (:func:`pipelines.streaming.realtime.realtime_roles`), without the
aggregation that was three quarters of its CPU (docs/streaming-performance.md, "The
Real-time query without its aggregation"). The feed folds them, one at a time
(:func:`pipelines.streaming.pyfeatures.fold_role`), into the same rows
:func:`features.tiles.keyed_tiles` gives and hands those full rows to
:class:`pipelines.streaming.realtime.RealtimeWriter`, which writes them as it writes the
tiles shape's.

Why it stays exact:

* A role row is an increment, not a full value, so it must be applied once. Each carries
  its event's source partition and offset; within a tile partition, rows of one source
  partition and one kind come in source-offset order (the query reads a source partition
  in order, its one shuffle partition keeps that order, and a key's rows go to one tile
  partition). A row at or below the highest offset applied for its (tile partition,
  source partition, kind) is one applied before: sent again by a query restarted from its
  last checkpoint (under new tile-topic offsets), or read again by a feed restarted from
  its last commit. The kind is in the mark because an event's user and item rows may
  share a tile partition with the same offset.
* The folded rows and the marks are written in one Redis transaction (:meth:`RoleFolder.persist`)
  after the writer's own writes (full values: idempotent) and before the consumer commits.
  A crash before the transaction folds the same rows again onto the stored rows; after
  it, they are skipped.
* The marks are one topic's offsets, and a topic deleted and created again under its name
  counts from 0 again: the marks hold the topic's Kafka id (``topic_id``), and marks of
  another id are dropped (with a WARNING) in the transaction that writes the new topic's
  first ones.
* The folded rows are kept in memory while their tile can still change (until the
  allowed lateness has passed it), and read back from Redis on a miss (a restart, an
  outage, an evicted tile), so a fold always starts from what was applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from pipelines.redis_batch import CommandBatch, as_dict
from pipelines.settings import Settings
from pipelines.streaming.pyfeatures import fold_role, role_row

__all__ = ["RoleFolder", "folded_key", "marks_key", "Folded", "TOPIC_ID_FIELD"]

log = logging.getLogger(__name__)

TOPIC_ID_FIELD = "topic_id"
"""The field of the marks' hash that holds the events topic's Kafka id."""


@lru_cache(maxsize=1 << 16)
def folded_key(kind: str, key: str) -> str:
    """The folded rows of one key (hash: tile start -> the full ``keyed_tiles`` row as JSON).

    Kept apart from the writer's tiles (:func:`pipelines.streaming.realtime.rt_tiles_key`),
    whose item tiles drop the fields only a fold needs (region, price and its time). Cached
    as that one is: a poll names each folded key twice (its read on a miss, its write)."""
    from features import online_keys

    return online_keys.key("tiles", "rtk", kind, online_keys.encode_part(key))


def marks_key(events_topic: str) -> str:
    """The highest offset of ``events_topic`` applied per (tile partition, source partition,
    kind), and the topic's Kafka id (:data:`TOPIC_ID_FIELD`). Named by the topic: a job moved
    to another events topic (a new checkpoint, the same online store) starts its offsets anew
    instead of skipping those the old one reached; a topic created again under its name is
    told by its id (:meth:`RoleFolder.fold`)."""
    from features import online_keys

    return online_keys.key("stream", "rt", "marks", online_keys.encode_part(events_topic))


def _mark_field(partition: int, source_partition: int, kind: str) -> str:
    return f"{partition}|{source_partition}|{kind}"


@dataclass
class Folded:
    """A tile this fold changed: its full row, and when the query sent its newest role row
    (epoch seconds, the Kafka timestamp) for the freshness figures."""

    row: dict[str, Any]
    sent_s: float


class RoleFolder:
    """Role rows of a feed's partitions -> full tile rows, applied once each.

    :meth:`fold` takes one poll's records, :meth:`persist` writes what it folded with the
    marks; between the two the caller writes the rows (the writer's flush). After an
    outage (the feed seeks back to its last commit) :meth:`reset` forgets what is not
    known to be stored.

    ``topic_id`` returns the events topic's Kafka id
    (:func:`pipelines.connections.kafka_topic_id`), asked each time the marks are read from
    Redis; ``None`` (or a ``None`` answer: a broker older than 2.8) leaves the id unchecked.
    """

    def __init__(self, settings: Settings, *,
                 topic_id: Callable[[], str | None] | None = None) -> None:
        self.last_items_n = settings.feature_last_items_n
        self.ttl = settings.online_ttl_seconds
        # a tile takes rows until the watermark passes it: kept this long after it starts
        self.keep_s = settings.feature_slide_seconds + settings.feature_allowed_lateness_seconds
        self.marks_name = marks_key(settings.kafka_topic_events)
        self.events_topic = settings.kafka_topic_events
        self._topic_id = topic_id
        self._new_id: str | None = None  # to store with the next marks
        # the stored marks are another topic's: dropped by the next persist
        self._marks_anew = False
        self._rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._marks: dict[str, int] | None = None
        self._dirty_rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._dirty_marks: dict[str, int] = {}
        self._newest = self._horizon = 0
        self.skipped = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._rows)

    def reset(self) -> None:
        """Forget the cache and the marks (reloaded from Redis by the next fold): what was
        folded since the last :meth:`persist` may not be stored."""
        self._rows.clear()
        self._marks = None
        self._new_id, self._marks_anew = None, False
        self._dirty_rows.clear()
        self._dirty_marks.clear()

    def fold(self, client: Any, records: Iterable[tuple[int, bytes, float]]) -> list[Folded]:
        """Fold ``records`` ((tile partition, message value, sent at)) in order; the tiles they
        changed, each once with its full row. One Redis round trip for the marks (first
        fold only) and one for the rows not in memory."""
        if self._marks is None:
            self._marks = self._load_marks(client)
        marks = self._marks
        fresh: list[tuple[dict[str, Any], float]] = []
        for partition, value, sent_s in records:
            event = orjson.loads(value)
            mark = _mark_field(partition, int(event["source_partition"]), event["kind"])
            offset = int(event["source_offset"])
            if offset <= marks.get(mark, -1):
                self.skipped += 1
                continue
            marks[mark] = self._dirty_marks[mark] = offset
            fresh.append((event, sent_s))
        self._load_missing(client, {(e["kind"], e["key"], int(e["tile_start"]))
                                    for e, _ in fresh})
        changed: dict[tuple[str, str, int], Folded] = {}
        rows, n = self._rows, self.last_items_n
        for event, sent_s in fresh:
            at = (event["kind"], event["key"], int(event["tile_start"]))
            one = role_row(at[0], at[1], at[2], event, last_items_n=n)
            held = rows.get(at)
            row = one if held is None else fold_role(held, one, last_items_n=n)
            rows[at] = self._dirty_rows[at] = row
            if at in changed:
                changed[at].row, changed[at].sent_s = row, max(changed[at].sent_s, sent_s)
            else:
                changed[at] = Folded(row, sent_s)
            self._newest = max(self._newest, at[2])
        return list(changed.values())

    def _load_marks(self, client: Any) -> dict[str, int]:
        """The stored marks, or none when they were written for another topic of this name
        (deleted and created again: its offsets start at 0 again, and the old marks would
        skip them). A Kafka error asking the id is the caller's outage (nothing changed)."""
        stored = {(k.decode() if isinstance(k, bytes) else k): v
                  for k, v in as_dict(client.hgetall(self.marks_name)).items()}
        raw_id = stored.pop(TOPIC_ID_FIELD, None)
        stored_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
        current = self._topic_id() if self._topic_id is not None else None
        self._new_id, self._marks_anew = None, False
        if current is not None and current != stored_id:
            self._new_id = current  # marks written before ids were kept are this topic's
            if stored_id is not None:
                log.warning("the events topic %s was created again (id %s; the fold's marks "
                            "are of id %s): its offsets count from 0 again, so the %d marks "
                            "of the old topic are dropped", self.events_topic, current,
                            stored_id, len(stored))
                self._marks_anew = True
                return {}
        return {field: int(v) for field, v in stored.items()}

    def _load_missing(self, client: Any, wanted: set[tuple[str, str, int]]) -> None:
        """Read the stored rows of the tiles ``wanted`` that are not in memory."""
        missing = [at for at in wanted if at not in self._rows]
        if not missing:
            return
        self.misses += len(missing)
        batch = CommandBatch(client)
        for kind, key, tile in missing:
            batch.add("HGET", folded_key(kind, key), str(tile))
        for at, stored in zip(missing, batch.execute(), strict=True):
            if stored is not None:
                self._rows[at] = orjson.loads(stored)

    def persist(self, client: Any) -> None:
        """Write the rows folded and the marks moved since the last call, in one transaction;
        then drop from memory the tiles the allowed lateness has passed."""
        if not self._dirty_marks and not self._dirty_rows and self._new_id is None:
            return
        batch = CommandBatch(client)
        if self._marks_anew:
            batch.add("DEL", self.marks_name)
        if self._new_id is not None:
            batch.add("HSET", self.marks_name, TOPIC_ID_FIELD, self._new_id)
        names: set[str] = set()
        for (kind, key, tile), row in self._dirty_rows.items():
            name = folded_key(kind, key)
            batch.add("HSET", name, str(tile), orjson.dumps(row))
            names.add(name)
        for name in names:
            batch.add("EXPIRE", name, self.ttl)
        if self._dirty_marks:
            batch.add("HSET", self.marks_name,
                      *[x for mark, offset in self._dirty_marks.items() for x in (mark, offset)])
        batch.execute_transaction()
        self._new_id, self._marks_anew = None, False
        self._dirty_rows.clear()
        self._dirty_marks.clear()
        self._evict()

    def _evict(self) -> None:
        horizon = self._newest - self.keep_s
        if horizon <= self._horizon:  # only when the newest tile moved on: a walk of them all
            return
        self._horizon = horizon
        old = [at for at in self._rows if at[2] < horizon]
        for at in old:
            del self._rows[at]
