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


def test_a_transaction_applies_every_command_and_returns_their_replies(redis_client: Any) -> None:
    batch = CommandBatch(redis_client)
    batch.add("HSET", "t", "a", "1", "b", "2")
    batch.add("HDEL", "t", "b")
    batch.add("EXPIRE", "t", 300)
    batch.add("SADD", "s", "x", "y")

    assert batch.execute_transaction() == [2, 1, 1, 2]
    assert redis_client.hgetall("t") == {b"a": b"1"} and redis_client.scard("s") == 2
    assert len(batch) == 0 and batch.execute_transaction() == []


def test_a_command_failing_inside_a_transaction_is_raised_by_name(redis_client: Any) -> None:
    redis_client.set("plain", "x")
    batch = CommandBatch(redis_client)
    batch.add("HSET", "t", "a", "1")
    batch.add("SADD", "plain", "m")  # WRONGTYPE, found only when EXEC runs it
    with pytest.raises(redis.ResponseError,
                       match=r"command #2 \(SADD\) of a transaction of 2 failed.*WRONGTYPE"):
        batch.execute_transaction()
    # Redis runs the rest of a transaction whose command fails at run time
    assert redis_client.hget("t", "a") == b"1"

    batch.add("HSET", "t", "b", "2")
    batch.add("HSET", "t")  # wrong arity: Redis refuses it when queued and discards it all
    with pytest.raises(redis.ResponseError, match=r"command #2 \(HSET\) of a transaction of 2 "
                       r"was refused, so none ran: .*wrong number of arguments"):
        batch.execute_transaction()
    assert redis_client.hget("t", "b") is None
    at = batch.add("PING")  # the connection went back to the pool usable (not in MULTI)
    assert batch.execute()[at] in (b"PONG", True)


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


@pytest.mark.parametrize("protocol", [2, 3])
def test_replies_spanning_many_socket_reads_come_back_whole(settings: Any, redis_server: Any,
                                                            protocol: int) -> None:
    """Replies far larger than one socket read (65 KB) reach their commands in order, in
    RESP2 (read from hiredis directly) and RESP3 (through redis-py)."""
    from pipelines.connections import redis_kwargs

    client = redis.Redis(**redis_kwargs(settings), protocol=protocol)
    try:
        client.flushdb()
        batch = CommandBatch(client)
        for i in range(3000):
            batch.add("SET", f"k{i}", f"{i}:" + "x" * 200)
        assert batch.execute() == [b"OK"] * 3000
        reads = [batch.add("GET", f"k{i}") for i in range(3000)]
        missing = batch.add("GET", "nope")
        replies = batch.execute()
        assert [replies[at] for at in reads] == [f"{i}:".encode() + b"x" * 200
                                                 for i in range(3000)]
        assert replies[missing] is None
    finally:
        client.close()


def test_a_timeout_mid_read_leaves_no_half_read_connection(settings: Any,
                                                           redis_server: Any) -> None:
    """A reply that does not come in time raises redis' TimeoutError, and the connection
    is not handed out again with that reply still on its way."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from pipelines.connections import redis_kwargs

    client = redis.Redis(**redis_kwargs(settings, timeout_ms=300), retry=Retry(NoBackoff(), 0))
    try:
        batch = CommandBatch(client)
        batch.add("SET", "k", "v")
        batch.add("BLPOP", "queue", 2)  # blocks 2 s: longer than the socket timeout
        with pytest.raises(redis.TimeoutError):
            batch.execute()
        client.rpush("queue", "first")  # a reused half-read connection would answer BLPOP's
        again = CommandBatch(client)
        at = again.add("GET", "k")
        assert again.execute()[at] == b"v"
        assert client.lrange("queue", 0, -1) == [b"first"]
    finally:
        client.close()
