"""CommandBatch against a real redis-server: replies in order, errors named, a dropped
connection survived."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from pipelines.redis_batch import CommandBatch, as_dict

pytestmark = pytest.mark.integration


def test_replies_come_back_in_order_as_redis_sent_them(redis_client: Any) -> None:
    batch = CommandBatch(redis_client)
    written = batch.add("HSET", "h", "a", "1", "b", b"\x00\xff")
    expire = batch.add("EXPIRE", "h", 300)
    one = batch.add("HGET", "h", "a")
    missing = batch.add("HGET", "h", "nope")
    both = batch.add("HMGET", "h", "b", "nope")
    whole = batch.add("HGETALL", "h")
    assert len(batch) == 6

    replies = batch.execute()

    assert replies[written] == 2 and replies[expire] == 1
    assert replies[one] == b"1" and replies[missing] is None
    assert replies[both] == [b"\x00\xff", None]
    assert as_dict(replies[whole]) == {b"a": b"1", b"b": b"\x00\xff"}
    assert 290 <= redis_client.ttl("h") <= 300
    assert len(batch) == 0 and batch.execute() == []  # emptied: nothing is sent twice


def test_an_error_reply_is_raised_after_every_command_ran(redis_client: Any) -> None:
    redis_client.set("plain", "x")
    batch = CommandBatch(redis_client)
    batch.add("HSET", "h", "a", "1")
    batch.add("HSET", "plain", "f", "v")  # WRONGTYPE
    batch.add("SET", "after", "1")

    with pytest.raises(redis.ResponseError, match=r"command #2 \(HSET\) of a batch of 3.*WRONGTYPE"):
        batch.execute()

    # the commands around the failed one ran, and the connection is still usable
    assert redis_client.hget("h", "a") == b"1" and redis_client.get("after") == b"1"
    again = CommandBatch(redis_client)
    at = again.add("GET", "after")
    assert again.execute()[at] == b"1"


def test_a_connection_dropped_mid_batch_is_sent_again(redis_client: Any) -> None:
    first = CommandBatch(redis_client)
    at = first.add("CLIENT", "ID")
    own_id = first.execute()[at]  # the pooled connection the next batch gets too

    batch = CommandBatch(redis_client)
    batch.add("SET", "k", "v")
    # the server drops this very connection halfway: the replies after it never come
    kill = batch.add("CLIENT", "KILL", "ID", own_id, "SKIPME", "no")
    at = batch.add("GET", "k")
    replies = batch.execute()

    # sent again on a new connection, where the kill finds no such client
    assert replies[kill] == 0 and replies[at] == b"v"


def test_as_dict_takes_both_protocols() -> None:
    assert as_dict([b"a", b"1", b"b", b"2"]) == {b"a": b"1", b"b": b"2"}
    assert as_dict({b"a": b"1"}) == {b"a": b"1"}
    assert as_dict([]) == {}


def test_an_argument_redis_cannot_take_is_a_clear_error(redis_client: Any) -> None:
    batch = CommandBatch(redis_client)
    batch.add("SET", "k", None)
    with pytest.raises(redis.DataError, match="argument"):
        batch.execute()
    assert redis_client.ping()  # nothing half-sent
