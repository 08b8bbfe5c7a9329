"""The tile feed's garbage-collection policy (pipelines.streaming.heap) on this interpreter's collector."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator

import pytest

from pipelines.streaming.heap import GcPauses, HeapFreezer, YoungThreshold


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def quiet_gc() -> Iterator[None]:
    """No automatic collection during the test (it would decide for us); nothing stays frozen after."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_due_step_frees_young_cycles_then_freezes_the_survivors(quiet_gc: None) -> None:
    clock = _Clock()
    freezer = HeapFreezer(10.0, clock=clock)
    kept = [_Node() for _ in range(100)]  # state the feed holds on to
    garbage = _Node()
    dead = weakref.ref(garbage)
    del garbage
    held = _Node()  # alive at the freeze, dropped after it
    frozen_cycle = weakref.ref(held)

    clock.now += 10.0
    assert freezer.step()

    assert dead() is None, "a cycle that was already garbage must be freed, not frozen"
    assert gc.get_freeze_count() >= len(kept)
    # what is frozen is out of the collector's reach: a full collection no longer walks it
    # (so a cycle frozen while alive stays in memory: the documented cost)
    del held
    gc.collect()
    assert frozen_cycle() is not None
    gc.unfreeze()
    gc.collect()
    assert frozen_cycle() is None


def _frozen_by(step: Callable[[], bool]) -> tuple[bool, bool]:
    """(what ``step`` returned, whether a cycle alive during it was frozen).

    Tested by what a freeze does (a cycle frozen while alive survives a full collection), not
    by ``gc.get_freeze_count()``, which any frozen object freed by reference counting lowers.
    """
    alive = _Node()
    ref = weakref.ref(alive)
    did = step()
    del alive
    gc.collect()
    return did, ref() is not None


def test_steps_before_the_interval_do_nothing(quiet_gc: None) -> None:
    clock = _Clock()
    freezer = HeapFreezer(10.0, clock=clock)
    clock.now += 9.9
    assert _frozen_by(freezer.step) == (False, False)
    clock.now += 0.1
    assert _frozen_by(freezer.step) == (True, True)
    clock.now += 5.0  # the next one is due 10 s after the last, not after the start
    assert _frozen_by(freezer.step) == (False, False)
    clock.now += 5.0
    assert _frozen_by(freezer.step) == (True, True)


def test_zero_seconds_never_freezes(quiet_gc: None) -> None:
    clock = _Clock()
    freezer = HeapFreezer(0.0, clock=clock)
    for _ in range(3):
        clock.now += 1_000.0
        assert _frozen_by(freezer.step) == (False, False)


def test_pauses_report_full_collections_and_reset(quiet_gc: None) -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        gc.collect()
        gc.collect(0)
        assert pauses.max_s > 0
        fields = pauses.take()
        assert fields["rt_gc_full_collections"] == "1"
        again = pauses.take()
        assert again["rt_gc_full_collections"] == "0"
        assert again["rt_gc_pause_max_s"] == "0.000"
    finally:
        pauses.remove()
    gc.collect()
    assert pauses.take()["rt_gc_full_collections"] == "0", "removed: no longer counting"


@pytest.fixture
def saved_threshold() -> Iterator[tuple[int, ...]]:
    before = gc.get_threshold()
    try:
        yield before
    finally:
        gc.set_threshold(*before)


def test_the_young_threshold_is_raised_while_installed_then_put_back(
        saved_threshold: tuple[int, ...]) -> None:
    gc.set_threshold(700, 10, 10)
    young = YoungThreshold(50_000)
    young.install()
    assert gc.get_threshold() == (50_000, 10, 10), "only the young generation's threshold moves"
    young.install()  # a second install must not take the raised value for the one to restore
    young.remove()
    assert gc.get_threshold() == (700, 10, 10)
    young.remove()  # nothing left to restore: harmless
    assert gc.get_threshold() == (700, 10, 10)


def test_a_young_threshold_of_zero_leaves_the_collector_alone(
        saved_threshold: tuple[int, ...]) -> None:
    gc.set_threshold(1_234, 5, 6)
    young = YoungThreshold(0)
    young.install()
    assert gc.get_threshold() == (1_234, 5, 6)
    young.remove()
    assert gc.get_threshold() == (1_234, 5, 6)
