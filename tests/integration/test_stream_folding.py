"""The roles shape's fold (pipelines.streaming.folding) against a real redis-server: each
event applied once, whatever is read again (a feed restarted from its last commit, a query
restarted from its last checkpoint, a crash between the writer's writes and the fold's)."""

from __future__ import annotations

import random
import time
import uuid
import zlib
from typing import Any

import orjson

from pipelines.connections import kafka_admin, kafka_topic_id
from pipelines.settings import Settings
from pipelines.streaming.folding import TOPIC_ID_FIELD, RoleFolder, folded_key, marks_key
from pipelines.streaming.pyfeatures import merge_keyed, role_row
from tests.integration.test_stream_state import _canonical_row

TILE_PARTITIONS = 3
SLIDE = 300
T0 = 1_780_000_000 // SLIDE * SLIDE


def _messages(n: int, seed: int) -> list[tuple[int, bytes, float]]:
    """``n`` events' role rows as the query sends them: (tile partition, value, sent at), in
    the order a feed reads them; two source partitions, offsets rising in each; events
    within three tiles in any order, sent after the last of them."""
    rnd = random.Random(seed)
    offsets = [0, 0]
    out = []
    for i in range(n):
        source = rnd.randrange(2)
        offsets[source] += rnd.randint(1, 3)  # a compacted or deduplicated gap now and then
        event_type = rnd.choice(["view", "view", "add_to_cart", "purchase"])
        us = (T0 + rnd.randrange(3 * SLIDE)) * 1_000_000 + i
        event = {"event_type": event_type, "event_us": us, "item_id": f"i{rnd.randrange(6)}",
                 "category_id": f"c{rnd.randrange(3)}", "region": rnd.choice(["FR", "UK"]),
                 "price": rnd.choice([None, 3.25, 9.5]) if event_type != "purchase" else 9.5,
                 "quantity": rnd.randint(1, 3), "source_partition": source,
                 "source_offset": offsets[source]}
        roles = [("user", f"u{rnd.randrange(5)}"), ("item", event["item_id"])]
        if event_type == "purchase":
            roles.append(("sales", f"{event['item_id']}|{event['category_id']}|"
                                   f"{event['region']}"))
        for kind, key in roles:
            partition = (0 if kind == "sales" else
                         zlib.crc32(f"{kind}|{key}".encode()) % TILE_PARTITIONS)
            row = {**event, "kind": kind, "key": key,
                   "tile_start": us // 1_000_000 // SLIDE * SLIDE}
            out.append((partition, orjson.dumps(row), T0 + 3 * SLIDE + i / 100))
    return out


def _once(messages: list[tuple[int, bytes, float]], n: int) -> dict[tuple[str, str, int], Any]:
    """Every role row folded exactly once: what the fold must reach."""
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for _, value, _ in messages:
        e = orjson.loads(value)
        at = (e["kind"], e["key"], e["tile_start"])
        one = role_row(*at, e, last_items_n=n)
        rows[at] = merge_keyed(rows[at], one, last_items_n=n) if at in rows else one
    return {at: _canonical_row(row) for at, row in rows.items()}


def _stored(client: Any, wanted: dict[tuple[str, str, int], Any]) -> dict[tuple[str, str, int], Any]:
    out = {}
    for kind, key, tile in wanted:
        value = client.hget(folded_key(kind, key), str(tile))
        if value is not None:
            out[(kind, key, tile)] = _canonical_row(orjson.loads(value))
    return out


def test_each_role_row_is_applied_once_across_restarts_replays_and_a_crash(
    settings: Settings, redis_client: Any,
) -> None:
    n = settings.feature_last_items_n
    messages = _messages(600, 7)
    expected = _once(messages, n)
    assert len({m[0] for m in messages}) == TILE_PARTITIONS
    third = len(messages) // 3

    # a feed folds the first third in two polls and writes it
    folder = RoleFolder(settings)
    changed = folder.fold(redis_client, messages[:100])
    changed += folder.fold(redis_client, messages[100:third])
    folder.persist(redis_client)
    # one row per tile changed in a poll, with the newest send time of its rows
    assert all(t.sent_s >= t.row["max_us"] / 1e6 for t in changed)

    # the feed dies after folding (and the writer writing) the second third, before its
    # transaction: nothing of it is in the fold's store, so a new feed folds it again
    lost = RoleFolder(settings)
    lost.fold(redis_client, messages[third:2 * third])
    # a restarted feed reads again from its last commit (the first poll's end): the rows of
    # the second poll are skipped by the marks, the rest folded onto the stored rows
    again = RoleFolder(settings)
    again.fold(redis_client, messages[100:2 * third])
    assert again.skipped == third - 100
    again.persist(redis_client)
    # a restarted query sends everything since its last checkpoint again, under new
    # tile-topic offsets, then what follows
    query_again = RoleFolder(settings)
    query_again.fold(redis_client, messages[50:])
    query_again.persist(redis_client)
    assert query_again.skipped == 2 * third - 50
    assert query_again.misses > 0  # what it folded onto came from Redis, not its memory

    assert _stored(redis_client, expected) == expected
    # an event's user and item rows in one tile partition, one offset: both applied
    by_mark: dict[tuple[int, int, int], set[str]] = {}
    for partition, value, _ in messages:
        e = orjson.loads(value)
        by_mark.setdefault((partition, e["source_partition"], e["source_offset"]),
                           set()).add(e["kind"])
    assert any(len(kinds) > 1 for kinds in by_mark.values())
    stored = redis_client.hgetall(marks_key(settings.kafka_topic_events))
    marks = {k.decode(): int(v) for k, v in stored.items()}
    assert marks and all(field.count("|") == 2 for field in marks)


def test_a_job_moved_to_another_events_topic_skips_none_of_its_offsets(
    settings: Settings, redis_client: Any,
) -> None:
    """The marks are the old topic's offsets: a job moved to a new topic (a new checkpoint,
    the same online store) reads that topic's offsets from 0 again, and must apply them."""
    n = settings.feature_last_items_n
    old, new = _messages(200, 13), _messages(200, 17)
    folder = RoleFolder(settings)
    folder.fold(redis_client, old)
    folder.persist(redis_client)
    moved = RoleFolder(settings.model_copy(update={"kafka_topic_events": "other.events"}))
    moved.fold(redis_client, new)
    moved.persist(redis_client)
    assert moved.skipped == 0
    expected = _once(old + new, n)
    assert _stored(redis_client, expected) == expected


def _create_topic(settings: Settings, name: str, *, again: bool = False) -> None:
    """Create ``name`` (deleted first when ``again``: the broker deletes in the background,
    so the create is tried until the old topic is gone)."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = kafka_admin(settings)
    try:
        if again:
            admin.delete_topics([name])
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.create_topics([NewTopic(name, 2, 1)])
                return
            except TopicAlreadyExistsError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()


def test_an_events_topic_created_again_under_its_name_skips_none_of_its_offsets(
    settings: Settings, redis_client: Any, kafka_broker: Any,
) -> None:
    """A topic deleted and created again counts its offsets from 0 again under the same name
    (so the same marks' key): its Kafka id tells it apart, on a real broker. The same topic's
    rows read again stay skipped, also with marks written before ids were kept."""
    n = settings.feature_last_items_n
    name = f"test.{uuid.uuid4().hex[:12]}"
    events = settings.model_copy(update={"kafka_topic_events": name})
    _create_topic(settings, name)
    first_id = kafka_topic_id(settings, name)
    assert first_id is not None
    assert kafka_topic_id(settings, f"{name}.missing", wait_s=0.5) is None

    def lookup() -> str | None:
        return kafka_topic_id(settings, name)

    old = _messages(200, 13)
    before_ids = RoleFolder(events)  # a feed from before the marks kept the topic's id
    before_ids.fold(redis_client, old)
    before_ids.persist(redis_client)
    replayed = RoleFolder(events, topic_id=lookup)  # the same topic read again: all skipped
    assert replayed.fold(redis_client, old) == []
    assert replayed.skipped == len(old)
    replayed.persist(redis_client)  # adopts the marks: they are this topic's
    stored_id = redis_client.hget(marks_key(name), TOPIC_ID_FIELD)
    assert stored_id is not None and stored_id.decode() == first_id

    _create_topic(settings, name, again=True)
    deadline = time.monotonic() + 10  # the broker's metadata may still name the old topic
    while (new_id := kafka_topic_id(settings, name)) in (None, first_id):
        assert time.monotonic() < deadline, f"the broker still names topic id {new_id}"
        time.sleep(0.2)
    # the new topic's rows so far are on two tile partitions of three
    new = [m for m in _messages(200, 17) if m[0] != 1]
    recreated = RoleFolder(events, topic_id=lookup)
    recreated.fold(redis_client, new)
    recreated.persist(redis_client)
    assert recreated.skipped == 0
    expected = _once(old + new, n)
    assert _stored(redis_client, expected) == expected
    # the marks are the new topic's only (none left of the old one's third partition)...
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall(marks_key(name)).items()}
    assert stored.pop(TOPIC_ID_FIELD) == new_id
    assert {field: int(v) for field, v in stored.items()} == _marks(new)
    # ...so its rows read again are skipped
    again = RoleFolder(events, topic_id=lookup)
    assert again.fold(redis_client, new) == [] and again.skipped == len(new)


def _marks(messages: list[tuple[int, bytes, float]]) -> dict[str, int]:
    """The highest source offset per (tile partition, source partition, kind)."""
    out: dict[str, int] = {}
    for partition, value, _ in messages:
        e = orjson.loads(value)
        field = f"{partition}|{e['source_partition']}|{e['kind']}"
        out[field] = max(out.get(field, -1), e["source_offset"])
    return out


def test_an_outage_reset_folds_again_from_what_is_stored(
    settings: Settings, redis_client: Any,
) -> None:
    """After an outage the feed seeks back to its last commit; what it folded since its last
    transaction may not be stored, so the fold forgets it and starts from Redis."""
    n = settings.feature_last_items_n
    messages = _messages(300, 11)
    expected = _once(messages, n)
    folder = RoleFolder(settings)
    folder.fold(redis_client, messages[:200])
    folder.persist(redis_client)
    folder.fold(redis_client, messages[200:])  # the transaction never ran (Redis went away)
    folder.reset()
    folder.fold(redis_client, messages[200:])
    folder.persist(redis_client)
    assert folder.skipped == 0
    assert _stored(redis_client, expected) == expected


def test_tiles_the_allowed_lateness_has_passed_leave_memory_not_the_store(
    make_settings: Any, redis_client: Any,
) -> None:
    settings = make_settings(feature_slide_seconds=SLIDE, feature_allowed_lateness_seconds=0)
    messages = _messages(200, 3)
    folder = RoleFolder(settings)
    folder.fold(redis_client, messages)
    folder.persist(redis_client)
    newest = max(orjson.loads(v)["tile_start"] for _, v, _ in messages)
    assert len(folder) == sum(1 for at in _once(messages, 4) if at[2] >= newest - SLIDE)
    assert len(folder) < len(_once(messages, 4))  # some were dropped...
    stored = _stored(redis_client, _once(messages, settings.feature_last_items_n))
    assert stored == _once(messages, settings.feature_last_items_n)  # ...from memory only
