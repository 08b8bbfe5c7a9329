"""Keeping CPython's full garbage collections off the tile feed's long-lived state.

The Real-time tile feed keeps the day's decoded tiles in memory (``RunningUsers``,
``RunningItems``, ``SalesTotals``): at 1,000 events/s the driver process tracked
about 1.6 million objects. Each full (generation 2) collection of CPython's cyclic
collector walks every one of them with the GIL held: 0.9-1.6 s, every 5-30 s, and
no tile reached Redis meanwhile (timed with ``gc.callbacks`` in the driver; the
Real-time freshness probes that took 1-2.5 s fell on them).

That state holds no reference cycles (dicts, lists, tuples and plain objects that
point down, never back), so reference counting frees every piece of it the moment
the feed drops it: the cyclic collector has nothing to find there. ``gc.freeze()``
moves every object it tracks into a permanent generation that later collections
skip, so a full collection walks only what was made since. Before each freeze the
young generations are collected, so the cycles that short-lived code makes (an
exception and its traceback, a client's callbacks) are freed, not frozen. A cycle
that becomes garbage after it was frozen stays in memory;
``stream_realtime_gc_freeze_seconds=0`` turns the freezing off. (The frozen count,
``gc.get_freeze_count()``, walks the whole frozen list: 0.35 s a call with the
feed's state, so it is not reported.)

Freezing bounds what a full collection walks; how often the collector runs at all is
the other half. Each tile row the feed decodes makes a dozen container objects, so at
CPython's default threshold (a young collection every 700 net allocations, a full one
after every hundred young ones) the collector ran about 2,900 times while the feed
drained 97,000 tile rows, 13 of them full collections over everything made since the
last freeze (up to 0.42 s each): 3.7 s of a 10 s drain. :class:`YoungThreshold` raises
the young generation's threshold while the feed runs
(``stream_realtime_gc_young_threshold``). At 20,000 the same drain had about 80 young
collections (up to 40 ms), 6-7 of the middle generation (up to 110 ms, the freezer's
own included) and no full one: 0.9-1.0 s in all, and the drain took 6.5-6.8 s. At
50,000 it was no faster, and a middle-generation collection, which then walks ten
times as much, took up to 0.33 s.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["HeapFreezer", "GcPauses", "YoungThreshold"]


class HeapFreezer:
    """Freeze what survived a young collection, at most every ``every_s`` seconds.

    ``step()`` is cheap when it is not due (a clock read); when due it costs a young
    collection (milliseconds) and a list splice.
    """

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._next = clock() + every_s

    def step(self) -> bool:
        """Freeze now when due; True when it did."""
        if self.every_s <= 0:
            return False
        now = self._clock()
        if now < self._next:
            return False
        gc.collect(1)  # young cyclic garbage is freed, not frozen
        gc.freeze()
        self._next = now + self.every_s
        return True


class YoungThreshold:
    """CPython's young-generation collection threshold at ``young`` between ``install()``
    and ``remove()`` (which puts back what was set before; 0 leaves it alone).

    Process-wide, as ``gc.set_threshold`` is: the feed is a thread of the driver, whose
    other threads (py4j, Kafka's and Redis' clients) make little garbage of their own.
    A higher threshold only lets a few more young objects wait for their collection;
    what reference counting frees (nearly everything) is freed as before.
    """

    def __init__(self, young: int) -> None:
        self.young = young
        self._previous: tuple[int, ...] | None = None

    def install(self) -> None:
        if self.young <= 0 or self._previous is not None:
            return
        self._previous = gc.get_threshold()
        gc.set_threshold(self.young, *self._previous[1:])

    def remove(self) -> None:
        if self._previous is not None:
            gc.set_threshold(*self._previous)
            self._previous = None


class GcPauses:
    """The longest cyclic-collector pause (and full collections) since the last ``take()``.

    In ``gc.callbacks`` between ``install()`` and ``remove()``; the feed reports it every few seconds,
    so a pause that holds tiles back shows in ``shopstream status`` by its size.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started = 0.0
        self.max_s = 0.0
        self.full = 0

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        self.max_s = max(self.max_s, self._clock() - self._started)
        if info.get("generation") == 2:
            self.full += 1

    def take(self) -> dict[str, str]:
        """Progress-hash fields (``rt_gc_*``) since the last call; resets the figures."""
        fields = {"rt_gc_pause_max_s": f"{self.max_s:.3f}", "rt_gc_full_collections": str(self.full)}
        self.max_s, self.full = 0.0, 0
        return fields
