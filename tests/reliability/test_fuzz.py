"""Fuzzing: schemathesis against the running API's OpenAPI schema, hypothesis against the
event validator. (The key layout's property tests are in tests/unit/test_online_keys.py.)

* schemathesis loads ``/openapi.json`` from a real ``shopstream serve`` (API key on,
  seeded store) and sends generated requests, valid and invalid, to every operation:
  no answer may be a 5xx.
* the Python validator never raises, whatever the bytes, and always returns an event or
  a rejection with one of the contract's reason codes and fields;
* any valid event serialized with ``event_to_json`` validates back to the same event.

Default (CI): 30 schemathesis examples per operation, 300 hypothesis examples. Full:
300 and 3,000.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.events import (
    EVENT_TYPES,
    FIELDS,
    MAX_ID_LENGTH,
    PRICE_MAX,
    QUANTITY_MAX,
    WHITESPACE,
    Event,
    Reason,
    Rejection,
    event_to_json,
    validate_event,
)
from pipelines.connections import redis_client
from pipelines.settings import Settings
from tests.conftest import free_port
from tests.integration.test_serving_data import seed_store
from tests.reliability.helpers import CliProcess, size, tail, wait_for

pytestmark = [pytest.mark.reliability]

API_EXAMPLES = size(40, 400)
"""Per operation, valid (positive) and invalid (negative) requests mixed."""
VALIDATOR_EXAMPLES = size(300, 3000)
API_KEY = "fuzz-key-3b9c"
STARTUP_BOUND_S = 120.0


# ------------------------------------------------------------------ schemathesis
@pytest.fixture(scope="module")
def api_schema(make_settings: Callable[..., Settings], redis_server: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("fuzz")
    settings = make_settings(api_port=free_port(), data_dir=str(folder / "data"),
                             run_dir=str(folder / "run"), api_key=API_KEY,
                             redis_socket_timeout_ms=1000, serving_deadline_ms=3000)
    client = redis_client(settings, timeout_ms=2000)
    client.flushdb()
    seed_store(client, settings)
    client.close()
    log = folder / "serve.log"
    server = CliProcess(settings, ["serve"], log, cwd=folder)
    base = f"http://127.0.0.1:{settings.api_port}"
    try:
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200,
                 timeout=STARTUP_BOUND_S, what="serve healthy", alive=server.alive, log=log)
        yield schemathesis.openapi.from_url(f"{base}/openapi.json"), base, settings
        assert server.alive(), tail(log)
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert API_KEY not in text
    assert "unhandled error" not in text, tail(log)


def _fuzz(operation: Any, statuses: Counter[int]) -> None:
    strategy = st.one_of(operation.as_strategy(schemathesis.GenerationMode.POSITIVE),
                         operation.as_strategy(schemathesis.GenerationMode.NEGATIVE))

    @given(case=strategy)
    @settings(max_examples=API_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    def run(case: Any) -> None:
        response = case.call(headers={"X-API-Key": API_KEY}, timeout=10)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.as_curl_command(), response.text[:300])

    run()


def test_api_answers_no_5xx(api_schema: tuple[Any, str, Settings]) -> None:
    """Every operation of the schema, generated requests (schemathesis' own strategies, run
    by hypothesis directly: its pytest plugin does not load under this pytest)."""
    operations = [result.ok() for result in api_schema[0].get_all_operations()]
    assert len(operations) >= 6, [op.label for op in operations]
    tried: dict[str, Counter[int]] = {}
    for operation in operations:
        _fuzz(operation, tried.setdefault(operation.label, Counter()))
    print("schemathesis: " + "; ".join(f"{k} {dict(v)}" for k, v in tried.items()))


OUTSIDE_IDS = ["*", "u1*", "{u1}", "u1\n", "u1\r\nFLUSHALL", "../u1", "u1/x", "u1?", "[a]",
               "u1 x" * 20, "x" * 65, "\x00", "ü*", " u1"]
"""Ids that must not reach Redis: refused with 422 (404 where ``/`` splits the path first)."""
ENCODED_IDS = ["u1:features", "cu1:x", "item:1"]
"""Accepted (``:`` is in real ids' alphabet: "guest-536365", "A:B") but percent-encoded
before they enter a key, so they stay inside their namespace."""


def test_ids_cannot_reach_outside_their_key_namespace(api_schema: tuple[Any, str, Settings]) -> None:
    from urllib.parse import quote

    from features.online_keys import item_meta_key, scope_category, user_recs_key

    _, base, settings = api_schema
    client = redis_client(settings, timeout_ms=2000)
    keys_before = client.dbsize()
    headers = {"X-API-Key": API_KEY}
    with httpx.Client(base_url=base, timeout=10.0, headers=headers) as http:
        assert httpx.get(f"{base}/v1/top-sellers").status_code == 401  # no key
        assert httpx.get(f"{base}/v1/top-sellers", headers={"X-API-Key": API_KEY + "x"}).status_code == 401
        answers = {}
        for bad in OUTSIDE_IDS:
            q = quote(bad, safe="")
            for path in (f"/v1/users/{q}/recommendations", f"/v1/items/{q}/similar",
                         f"/v1/top-sellers?category={q}", f"/v1/top-sellers?region={q}",
                         f"/v1/users/u1/recommendations?region={q}"):
                answers[path] = http.get(path).status_code
        wrong = {p: s for p, s in answers.items()
                 if s != 422 and not (s == 404 and "%2F" in p.split("?")[0])}
        assert not wrong, wrong
        for odd in ENCODED_IDS:
            response = http.get(f"/v1/users/{quote(odd, safe='')}/recommendations")
            assert response.status_code == 200 and response.json()["known_user"] is False
            assert user_recs_key("1", odd).endswith(":user:" + odd.replace(":", "%3A"))
            assert item_meta_key(odd).endswith(":item:" + odd.replace(":", "%3A"))
            assert scope_category(odd) == "cat=" + odd.replace(":", "%3A")
    assert client.dbsize() == keys_before  # nothing written by any of it
    client.close()
    print(f"ids: {len(answers)} requests with {len(OUTSIDE_IDS)} hostile ids refused; "
          f"{len(ENCODED_IDS)} ids with ':' encoded")


# ------------------------------------------------------------------ validator
FIELD_NAMES = {f.name for f in FIELDS}
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=80),
)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
field_values = st.one_of(
    json_values,
    st.sampled_from(["2024-06-01T11:00:00Z", "2024-06-01 11:00", "2999-01-01T00:00:00Z", "",
                     " ", "view", "purchase", "add_to_cart", "x" * 65, "nan"]),
    st.integers(min_value=-5, max_value=2**64),
)
documents = st.dictionaries(st.sampled_from(sorted(FIELD_NAMES) + ["extra"]), field_values,
                            max_size=len(FIELD_NAMES) + 1)


def _check_verdict(verdict: Any) -> None:
    assert isinstance(verdict, Event | Rejection), verdict
    if isinstance(verdict, Rejection):
        assert isinstance(verdict.reason, Reason) and verdict.reason != Reason.LATE_EVENT
        assert verdict.field is None or verdict.field in FIELD_NAMES


@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=300), st.none()))
@settings(max_examples=VALIDATOR_EXAMPLES, deadline=None)
def test_validator_never_raises_on_any_bytes(raw: bytes | str | None) -> None:
    _check_verdict(validate_event(raw, now=NOW))


@given(doc=documents, key=st.one_of(st.none(), st.binary(max_size=10)), check_key=st.booleans())
@settings(max_examples=VALIDATOR_EXAMPLES, deadline=None)
def test_validator_never_raises_on_any_document(doc: dict[str, Any], key: bytes | None,
                                                check_key: bool) -> None:
    import json

    raw = json.dumps(doc).encode()
    verdict = validate_event(raw, now=NOW, key=key, check_key=check_key)
    _check_verdict(verdict)
    if check_key and isinstance(verdict, Event):
        assert key is not None and key.decode("utf-8", "replace") == verdict.user_id


ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
              max_size=MAX_ID_LENGTH).filter(lambda s: bool(s.strip(WHITESPACE)))
times = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9000, 1, 1),
                     timezones=st.just(UTC)).map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))


@st.composite
def valid_events(draw: Any) -> dict[str, Any]:
    event_type = draw(st.sampled_from(EVENT_TYPES))
    priced = event_type != "view"
    price = draw(st.floats(min_value=0, max_value=PRICE_MAX) if priced
                 else st.one_of(st.none(), st.floats(min_value=0, max_value=PRICE_MAX)))
    doc: dict[str, Any] = {
        "event_id": draw(ids), "event_type": event_type, "event_time": draw(times),
        "user_id": draw(ids), "session_id": draw(ids), "item_id": draw(ids),
        "category_id": draw(ids), "region": draw(ids), "price": price,
        "quantity": draw(st.integers(min_value=1, max_value=QUANTITY_MAX)),
        "device": draw(st.one_of(st.none(), ids)),
    }
    return doc


@given(doc=valid_events(), epoch=st.booleans())
@settings(max_examples=VALIDATOR_EXAMPLES, deadline=None)
def test_a_valid_event_round_trips(doc: dict[str, Any], epoch: bool) -> None:
    if epoch:
        doc = dict(doc, event_time=int(doc["event_time"].timestamp() * 1000))
    verdict = validate_event(event_to_json(doc), now=datetime(9000, 1, 1, tzinfo=UTC) + timedelta(days=1))
    assert isinstance(verdict, Event), (verdict, doc)
    expected_time = doc["event_time"] if not epoch else \
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=doc["event_time"])
    assert verdict.event_time == expected_time
    for name in ("event_id", "event_type", "user_id", "session_id", "item_id", "category_id",
                 "region", "quantity", "device"):
        assert getattr(verdict, name) == doc[name], name
    assert (verdict.price is None and doc["price"] is None) or math.isclose(
        verdict.price or 0.0, doc["price"] or 0.0, rel_tol=0, abs_tol=0)
    # and the stored form validates to the same event again
    again = validate_event(event_to_json(verdict.as_dict()), now=datetime(9000, 1, 2, tzinfo=UTC))
    assert again == verdict
