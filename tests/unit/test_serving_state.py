"""The serving client's in-process state: circuit breaker, remembered lists, category cache."""

from __future__ import annotations

import time

from serving.client import _Breaker, _Memory, _TTLCache


def test_breaker_opens_after_consecutive_failures_and_closes_on_success() -> None:
    breaker = _Breaker(cooldown_ms=10_000, threshold=3)
    assert breaker.allow()
    assert breaker.failure() is False and breaker.failure() is False
    assert breaker.allow()  # two slow replies do not stop serving from Redis
    assert breaker.failure() is True  # the third in a row opens it
    assert not breaker.allow()
    assert breaker.failure() is False  # already open: not "opened" again
    assert breaker.success() is True and breaker.allow()


def test_breaker_success_resets_the_count() -> None:
    breaker = _Breaker(cooldown_ms=10_000, threshold=2)
    breaker.failure()
    breaker.success()
    assert breaker.failure() is False and breaker.allow()


def test_breaker_lets_a_probe_through_after_the_cooldown() -> None:
    breaker = _Breaker(cooldown_ms=20, threshold=1)
    assert breaker.failure() is True and not breaker.allow()
    time.sleep(0.03)
    assert breaker.allow()  # half-open: the next request probes Redis
    assert breaker.failure() is False and not breaker.allow()  # a failed probe re-opens


def test_memory_keeps_the_longer_fresh_list() -> None:
    memory = _Memory(max_lists=2)
    memory.remember("top_sellers", "1h", "global", [("a", 3.0), ("b", 2.0), ("c", 1.0)], 100, now_ms=1_000)
    memory.remember("top_sellers", "1h", "global", [("a", 4.0)], 200, now_ms=2_000)
    kept = memory.recall("top_sellers", "1h", "global")
    assert kept is not None and [i for i, _ in kept.items] == ["a", "b", "c"]
    # ...unless the longer one is stale.
    memory.remember("top_sellers", "1h", "global", [("z", 9.0)], 300, now_ms=100_000)
    kept = memory.recall("top_sellers", "1h", "global")
    assert kept is not None and kept.items == (("z", 9.0),) and kept.as_of_ms == 300


def test_memory_is_bounded_least_recently_used_first() -> None:
    memory = _Memory(max_lists=2)
    for scope in ("global", "reg=DE", "reg=FR"):
        memory.remember("top_sellers", "1h", scope, [("a", 1.0)], None, now_ms=0)
    assert memory.recall("top_sellers", "1h", "global") is None
    assert memory.recall("top_sellers", "1h", "reg=FR") is not None


def test_category_cache_expires_and_is_bounded() -> None:
    cache = _TTLCache(max_size=2, ttl_s=10)
    cache.put("a", "hats", now=0)
    cache.put("b", None, now=0)
    found, missing = cache.get_many(["a", "b", "c", "c"], now=5)
    assert found == {"a": "hats", "b": None, "c": None} and missing == ["c"]
    assert cache.get_many(["a"], now=11) == ({"a": None}, ["a"])
    cache.put("c", "bags", now=0)  # full: the oldest entry goes
    assert len(cache._data) == 2
