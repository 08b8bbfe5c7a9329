"""The Redis key layout: one namespace, ids that cannot escape it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from features import online_keys as k


def test_top_sellers_key_layout() -> None:
    assert k.top_sellers_key("1h", k.scope_global()) == "ss:v1:top:1h:global"
    assert k.top_sellers_key("24h", k.scope_for("c1", "UK")) == "ss:v1:top:24h:catreg=c1|UK"


def test_top_sellers_key_rejects_unknown_window() -> None:
    with pytest.raises(ValueError):
        k.top_sellers_key("2h", k.scope_global())


@given(st.text(min_size=1, max_size=64))
def test_encode_part_never_contains_separators(part: str) -> None:
    encoded = k.encode_part(part)
    assert not set(encoded) & set(":*?[]=| ")


@given(st.one_of(st.text(max_size=24),
                 st.text(alphabet="abcXYZ019-_.~@+:%| \n\u00e9", max_size=24)))
def test_encode_part_is_quote_of_the_safe_characters(part: str) -> None:
    # the fast path for identifiers that need nothing encoded must not change a key
    from urllib.parse import quote

    assert k.encode_part(part) == quote(part, safe="-_.~@+")


@pytest.mark.parametrize(("part", "encoded"), [
    ("u_0042", "u_0042"), ("i-9.x~@+", "i-9.x~@+"), ("", ""), ("a b", "a%20b"),
    ("a:b", "a%3Ab"), ("caf\u00e9", "caf%C3%A9"), ("a\n", "a%0A"), ("50%", "50%25"),
])
def test_encode_part_examples(part: str, encoded: str) -> None:
    assert k.encode_part(part) == encoded


@given(st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=64))
def test_user_recs_key_distinct_ids_distinct_keys(a: str, b: str) -> None:
    if a != b:
        assert k.user_recs_key("1", a) != k.user_recs_key("1", b)
    assert k.user_recs_key("1", a).count(":") == 5


@given(st.one_of(st.none(), st.text(min_size=1, max_size=32)),
       st.one_of(st.none(), st.text(min_size=1, max_size=32)))
def test_parse_scope_inverts_scope_for(category: str | None, region: str | None) -> None:
    """The stream's snapshot turns each stored top list back into its category and region."""
    assert k.parse_scope(k.scope_for(category, region)) == (category, region)


@pytest.mark.parametrize("scope", ["", "cat=", "catreg=c1", "catreg=|UK", "world"])
def test_parse_scope_rejects_what_is_not_a_scope(scope: str) -> None:
    with pytest.raises(ValueError, match="not a scope"):
        k.parse_scope(scope)
