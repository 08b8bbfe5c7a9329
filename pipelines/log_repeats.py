"""Collapsing a client library's repeated log lines into one line per kind and period.

While Kafka is away, kafka-python logs every reconnect, metadata retry and expired batch
at WARNING or ERROR: ``generate`` with its broker killed printed 142 lines in two and a
half minutes, each true and all but a handful the same few lines again. The operator
needs the first of each kind and then a count, not the stream of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CollapseRepeats", "REPEAT_PERIOD_S"]

REPEAT_PERIOD_S = 30.0
"""A kind of line held back is shown again, with its count, at most this often."""


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
    message names the error. Records of other loggers always pass, untouched. Held-back records are counted, never dropped
    unseen: a kind's count is reported with its next line, and a line of a kind that stops
    repeating was shown the first time.
    """

    def __init__(self, prefixes: tuple[str, ...] = ("kafka",), period_s: float = REPEAT_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic, *, tracebacks: bool = False) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.period_s = period_s
        self.tracebacks = tracebacks
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
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None:
                self._kinds[key] = _Kind(shown_at=now)
                return True
            if now - kind.shown_at < self.period_s:
                kind.held += 1
                return False
            held, since = kind.held, now - kind.shown_at
            kind.shown_at, kind.held = now, 0
        if held:  # the template keeps its placeholders for record.args; the note has none
            record.msg = f"{record.msg} ({held} more like this in the last {since:.0f} s)"
        return True
