"""Many idempotent Redis commands in one round trip, with less client work than a pipeline.

Why not ``client.pipeline()``: for each command redis-py's pipeline builds its
call through the command mixins, queues it with an options dict and, on the way
back, looks up a response callback. Measured on this project's writes (HSET +
EXPIRE, 200,000 commands, hiredis installed) that bookkeeping was about 6 of the
11 µs of client CPU per command, and the Real-time tile feed sends six or seven
commands per tile row. :class:`CommandBatch` keeps the parts of redis-py that do
the real work (a pooled connection, hiredis packing and parsing, the client's
retry policy) and leaves out the rest: replies come back as Redis sent them
(``HGETALL`` a flat list in RESP2, see :func:`as_dict`).

Only for commands that may run twice: like redis-py's own non-transactional
pipeline, a batch whose connection fails is sent again in full.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # redis-py's hiredis parser, whose reader the fast path reads (see _read_replies)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _HiredisParser
except ImportError:  # pragma: no cover - another redis-py layout: every reply through it
    _NOT_ENOUGH_DATA, _HiredisParser = None, type(None)

try:  # a dependency of this project; redis-py packs without it too, more slowly
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover
    _hiredis_pack = None

if TYPE_CHECKING:
    import redis

__all__ = ["CommandBatch", "as_dict"]


class CommandBatch:
    """Commands queued with :meth:`add`, sent by :meth:`execute` in one round trip.

    >>> batch = CommandBatch(client)            # doctest: +SKIP
    >>> at = batch.add("HGET", "k", "f")        # doctest: +SKIP
    >>> batch.execute()[at]                     # doctest: +SKIP
    """

    __slots__ = ("client", "commands")

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.commands: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.commands)

    def add(self, *args: Any) -> int:
        """Queue one command (name and arguments, as ``execute_command`` takes them);
        returns the index of its reply."""
        self.commands.append(args)
        return len(self.commands) - 1

    def execute(self) -> list[Any]:
        """Send every queued command and read every reply (then the batch is empty).

        A Redis error reply (``WRONGTYPE`` ...) is raised after all replies are read,
        naming the command, as redis-py's pipeline does; a connection error is retried
        by the client's retry policy (the whole batch), then raised.
        """
        commands, self.commands = self.commands, []
        if not commands:
            return []
        return self._send(commands)

    def execute_transaction(self) -> list[Any]:
        """Send every queued command inside one ``MULTI``/``EXEC`` (all of them applied or
        none), in one round trip; returns their replies.

        A command Redis fails inside the transaction (``WRONGTYPE`` ...) is raised after
        the whole reply is read, as redis-py's transactional pipeline does. As
        :meth:`execute`, a batch whose connection fails is sent again in full: only for
        transactions that may run twice (full values, deletes, expiries).
        """
        commands, self.commands = self.commands, []
        if not commands:
            return []
        replies = self._send([("MULTI",), *commands, ("EXEC",)], transaction=True)
        results = replies[-1]
        if results is None:  # only a WATCH aborts a transaction, and a batch has none
            raise ResponseError("the transaction was aborted")
        error = next(((i, r) for i, r in enumerate(results) if isinstance(r, ResponseError)), None)
        if error is not None:
            i, exc = error
            raise ResponseError(f"command #{i + 1} ({commands[i][0]}) of a transaction of "
                                f"{len(commands)} failed: {exc}") from exc
        return list(results)

    def _send(self, commands: list[tuple[Any, ...]], *, transaction: bool = False) -> list[Any]:
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            return conn.retry.call_with_retry(lambda: _round_trip(conn, commands, transaction),
                                              lambda _error: conn.disconnect())
        finally:
            pool.release(conn)


def _packed(conn: Any, commands: list[tuple[Any, ...]]) -> Any:
    """The commands in RESP, one buffer: hiredis packs each command in C (redis-py's own
    ``pack_commands`` calls it too, through two Python layers per command)."""
    if _hiredis_pack is None:  # pragma: no cover
        return conn.pack_commands(commands)
    try:
        return [b"".join(map(_hiredis_pack, commands))]
    except TypeError as exc:  # what redis-py raises for an argument it cannot send
        raise DataError(f"a command of the batch has an argument Redis cannot take: {exc}") from exc


def _round_trip(conn: Any, commands: list[tuple[Any, ...]], transaction: bool = False
                ) -> list[Any]:
    conn.send_packed_command(_packed(conn, commands))
    replies = _read_replies(conn, len(commands))
    error = next(((i, r) for i, r in enumerate(replies) if isinstance(r, ResponseError)), None)
    if error is not None:
        i, exc = error
        name = commands[i][0]
        if transaction:  # numbered without the MULTI; Redis then refused the EXEC
            raise ResponseError(f"command #{i} ({name}) of a transaction of {len(commands) - 2} "
                                f"was refused, so none ran: {exc}") from exc
        raise ResponseError(f"command #{i + 1} ({name}) of a batch of {len(commands)} "
                            f"failed: {exc}") from exc
    return replies


def _read_replies(conn: Any, count: int) -> list[Any]:
    """``count`` replies, error replies as ``ResponseError`` values (not raised).

    With hiredis and RESP2 (this project's setup) the replies are taken from the
    connection's hiredis reader directly: redis-py's per-reply path (two layers, a host
    string and push-notification checks per reply) was about a third of the client's
    CPU for a batch of HSET/EXPIRE replies. Anything else goes through redis-py.
    """
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if (_NOT_ENOUGH_DATA is None or not isinstance(parser, _HiredisParser) or reader is None
            or getattr(parser, "_next_response", None) is not _NOT_ENOUGH_DATA
            or str(getattr(conn, "protocol", 2)) == "3"):
        return [_read_one(conn) for _ in range(count)]
    replies: list[Any] = []
    gets = reader.gets
    try:
        while len(replies) < count:
            reply = gets()
            if reply is _NOT_ENOUGH_DATA:
                parser.read_from_socket()
            elif isinstance(reply, RedisConnectionError):
                raise reply
            else:
                replies.append(reply)
    except (RedisConnectionError, RedisTimeoutError):
        conn.disconnect()
        raise
    except TimeoutError as exc:  # the socket's (read_from_socket lets it through)
        conn.disconnect()
        raise RedisTimeoutError(f"Timeout reading from {_host(conn)}") from exc
    except OSError as exc:
        conn.disconnect()
        raise RedisConnectionError(f"Error while reading from {_host(conn)}: {exc.args}") from exc
    except BaseException:
        conn.disconnect()  # a half-read connection must not go back to the pool
        raise
    if getattr(conn, "health_check_interval", 0):  # as redis-py after a reply
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    return replies


def _read_one(conn: Any) -> Any:
    try:
        return conn.read_response()
    except ResponseError as exc:
        return exc


def _host(conn: Any) -> str:
    return f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"


def as_dict(reply: Any) -> dict[Any, Any]:
    """An ``HGETALL`` reply as a dict: RESP3 sends one, RESP2 a flat field, value list."""
    if isinstance(reply, dict):
        return reply
    it = iter(reply)
    return dict(zip(it, it, strict=True))
