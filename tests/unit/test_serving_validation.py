"""What the API and the in-process client accept as ids, k and windows."""

from __future__ import annotations

import re

import pytest

from serving.errors import InvalidParameter
from serving.validation import (
    ID_PATTERN,
    OPTIONAL_ID_PATTERN,
    check_id,
    check_k,
    check_optional_id,
    check_window,
    message_for,
)

REAL_IDS = ["85123A", "United Kingdom", "guest-536365", "u123", "gift_0001_40", "Hong Kong",
            "EIRE", "17850", "DCGS0003", "a", "x" * 64, "user@example.com", "o'brien"]
BAD_IDS = ["", " ", " u1", "u1 ", "x" * 65, "a/b", "a%2Fb", "*", "u?", "a\nb", "a\tb", "\x00",
           "café", "u1;DROP", "{u}", "a\\b"]


@pytest.mark.parametrize("value", REAL_IDS)
def test_check_id_accepts_real_ids(value: str) -> None:
    assert check_id("user_id", value) == value
    # The pattern FastAPI enforces agrees with the Python check.
    assert re.fullmatch(ID_PATTERN, value)


@pytest.mark.parametrize("value", BAD_IDS)
def test_check_id_rejects_bad_ids_with_a_stable_message(value: str) -> None:
    with pytest.raises(InvalidParameter) as info:
        check_id("user_id", value)
    assert info.value.param == "user_id"
    assert info.value.message == message_for("user_id")
    assert "1-64 characters" in info.value.message
    assert not re.fullmatch(ID_PATTERN, value)


def test_check_optional_id_treats_empty_as_absent() -> None:
    assert check_optional_id("region", None) is None
    assert check_optional_id("region", "") is None
    assert check_optional_id("region", "United Kingdom") == "United Kingdom"
    assert re.fullmatch(OPTIONAL_ID_PATTERN, "")


@pytest.mark.parametrize("k", [1, 10, 100])
def test_check_k_accepts_1_to_100(k: int) -> None:
    assert check_k(k) == k


@pytest.mark.parametrize("k", [0, -1, 101, 10**9, True, 2.0, "5", None])
def test_check_k_rejects_out_of_range_and_non_ints(k: object) -> None:
    with pytest.raises(InvalidParameter, match="k must be an integer from 1 to 100"):
        check_k(k)


def test_check_window_accepts_only_known_windows() -> None:
    assert check_window("1h") == "1h"
    assert check_window("24h") == "24h"
    with pytest.raises(InvalidParameter, match="window must be one of 1h, 24h"):
        check_window("7d")


def test_check_window_for_trending_accepts_only_the_hour() -> None:
    assert check_window("1h", trending=True) == "1h"
    with pytest.raises(InvalidParameter, match="trending is computed for window 1h only"):
        check_window("24h", trending=True)
