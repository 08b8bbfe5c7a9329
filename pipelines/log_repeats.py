"""Collapsing a client library's repeated log lines into one line per kind and period.

While Kafka is away, kafka-python logs every reconnect, metadata retry and expired batch
at WARNING or ERROR: ``generate`` with its broker killed printed 142 lines in two and a
half minutes, each true and all but a handful the same few lines again. The operator
needs the first of each kind and then a count, not the stream of them.

An outage itself still began with nine lines of the kinds above, at ERROR, each in
kafka-python's words about its transports, connections, metadata, fetches and group
coordinator (measured with a consumer and a producer on a stopped broker); so the lines
that say a connection to Kafka failed are one kind of their own, told in one line that
says what it means and what happens next, with kafka-python's first line quoted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CollapseRepeats", "REPEAT_PERIOD_S", "UNREACHABLE_MARKERS"]

REPEAT_PERIOD_S = 30.0
"""A kind of line held back is shown again, with its count, at most this often."""

UNREACHABLE_MARKERS = ("KafkaConnectionError", "NodeNotReadyError", "ECONNREFUSED",
                       "No node available")
"""Text by which a kafka-python line says a connection to the broker failed (refused, lost,
none to ask): all such lines are one kind (a broker that closed an idle connection gives
one such line too, which is why the line says "failed", not "unreachable"). Others (a
failed SASL login, a TLS error, an unknown topic) keep kinds of their own, in
kafka-python's words."""

_UNREACHABLE = ("kafka", logging.ERROR, "unreachable")


@dataclass
class _Kind:
    shown_at: float
    held: int = 0


class CollapseRepeats(logging.Filter):
    """A handler filter: of the records from loggers under ``prefixes``, the first of each
    kind (logger, level and message template: the arguments, such as a connection's
    state, vary) passes; the same kind again within ``period_s`` is held back and counted,
    and the next one after the period passes with "(N more like this in the last T s)".

    Their tracebacks are dropped unless ``tracebacks`` (the CLI's ``--verbose``): the
    message names the error. With ``one_outage_kind`` (the default; the CLI's ``--verbose``
    turns it off), the lines that say a connection to the broker failed
    (:data:`UNREACHABLE_MARKERS`) are one kind, whatever their logger, and its line says so
    in shopstream's words, quoting kafka-python's. Records of other loggers always pass, untouched. Held-back records are counted, never dropped
    unseen: a kind's count is reported with its next line, and a line of a kind that stops
    repeating was shown the first time.
    """

    def __init__(self, prefixes: tuple[str, ...] = ("kafka",), period_s: float = REPEAT_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic, *, tracebacks: bool = False,
                 one_outage_kind: bool = True) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.period_s = period_s
        self.tracebacks = tracebacks
        self.one_outage_kind = one_outage_kind
        self._clock = clock
        self._kinds: dict[tuple[str, int, str], _Kind] = {}
        self._lock = threading.Lock()  # kafka-python logs from its sender and consumer threads

    def _covers(self, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._covers(record.name):
            return True
        if record.exc_info and not self.tracebacks:
            # kafka-python attaches the socket's traceback to "Error receiving network data";
            # its next line names the error ("Abort (KafkaConnectionError: [Errno 104] ...)")
            record.exc_info, record.exc_text = None, None
        text = _message(record) if self.one_outage_kind else ""
        unreachable = any(marker in text for marker in UNREACHABLE_MARKERS)
        key = _UNREACHABLE if unreachable else (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None:
                self._kinds[key] = kind = _Kind(shown_at=now - self.period_s)
            if now - kind.shown_at < self.period_s:
                kind.held += 1
                return False
            held, since = kind.held, now - kind.shown_at
            kind.shown_at, kind.held = now, 0
        if unreachable:
            record.msg, record.args = _unreachable_line(text, held, since, self.period_s), None
        elif held:  # the template keeps its placeholders for record.args; the note has none
            record.msg = f"{record.msg} ({held} more like this in the last {since:.0f} s)"
        return True


def _message(record: logging.LogRecord) -> str:
    """The record's text; its template if its arguments do not fit it (a filter that raised
    would raise in kafka-python's thread)."""
    try:
        return record.getMessage()
    except (TypeError, ValueError):
        return str(record.msg)


def _unreachable_line(text: str, held: int, since: float, period_s: float) -> str:
    """The outage kind's line: the first of an outage, or a repeat with its count."""
    if not held:
        return (f"Kafka connection failed (kafka-python: {text}); kafka-python reconnects on its "
                f"own, and its lines about it are counted here, one line every {period_s:.0f} s at most")
    return (f"Kafka connection still failing: {held} more kafka-python lines like this in the last "
            f"{since:.0f} s (the last: {text})")
