"""A corpus of raw records, good and bad, with the verdict the contract gives each.

Shared by the Python validator's unit tests, the Spark validator's agreement
test and the streaming job's bad-input test, so all three check the same cases.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)

GOOD = {
    "event_id": "e-1",
    "event_type": "purchase",
    "event_time": "2024-06-01T11:59:00Z",
    "user_id": "u1",
    "session_id": "s1",
    "item_id": "i1",
    "category_id": "c1",
    "region": "UK",
    "price": 9.5,
    "quantity": 2,
    "device": "web",
}


def _with(**changes: object) -> bytes:
    doc = dict(GOOD)
    for k, v in changes.items():
        if v is _DROP:
            doc.pop(k, None)
        else:
            doc[k] = v
    return json.dumps(doc).encode()


_DROP = object()

# (name, raw value, expected verdict: None for valid, else "reason" or "reason:field")
CASES: list[tuple[str, bytes | None, str | None]] = [
    ("valid_purchase", _with(), None),
    ("valid_view_no_price", _with(event_type="view", price=_DROP, quantity=_DROP), None),
    ("valid_epoch_millis", _with(event_time=1717243140000), None),
    ("valid_offset_time", _with(event_time="2024-06-01T13:00:00+02:00"), None),
    ("valid_naive_time", _with(event_time="2024-06-01 11:00"), None),
    ("valid_fraction", _with(event_time="2024-06-01T11:00:00.123456Z"), None),
    ("valid_price_zero", _with(price=0), None),
    ("valid_integral_float_quantity", _with(quantity=3.0), None),
    ("valid_unicode", _with(region="Côte d’Ivoire"), None),
    ("valid_extra_field", _with(extra={"a": 1}), None),
    ("valid_null_device", _with(device=None), None),
    ("empty_payload", b"", "empty_payload"),
    ("null_payload", None, "empty_payload"),
    ("non_utf8", b'\xff\xfe{"event_id": 1}', "invalid_encoding"),
    ("invalid_json", b'{"event_id": ', "invalid_json"),
    ("plain_text", b"hello", "invalid_json"),
    ("nan_constant", _with(price=_DROP)[:-1] + b', "price": NaN}', "invalid_json"),
    ("duplicate_key", b'{"event_id": "a", "event_id": "b"}', "invalid_json"),
    ("trailing_garbage", _with() + b" x", "invalid_json"),
    ("trailing_comma", _with() + b",", "invalid_json"),
    ("trailing_whitespace", _with() + b" \n\t", None),
    ("array", b"[1, 2]", "not_an_object"),
    ("string", b'"x"', "not_an_object"),
    ("missing_event_id", _with(event_id=_DROP), "missing_field:event_id"),
    ("null_user", _with(user_id=None), "missing_field:user_id"),
    ("missing_region", _with(region=_DROP), "missing_field:region"),
    ("numeric_user", _with(user_id=123), "wrong_type:user_id"),
    ("object_item", _with(item_id={"a": 1}), "wrong_type:item_id"),
    ("bool_price", _with(price=True), "wrong_type:price"),
    ("string_price", _with(price="9.5"), "wrong_type:price"),
    ("string_quantity", _with(quantity="2"), "wrong_type:quantity"),
    ("list_time", _with(event_time=[1]), "wrong_type:event_time"),
    ("numeric_device", _with(device=5), "wrong_type:device"),
    ("empty_session", _with(session_id=""), "empty_field:session_id"),
    ("blank_category", _with(category_id="  \t"), "empty_field:category_id"),
    ("long_item", _with(item_id="x" * 65), "field_too_long:item_id"),
    ("long_device", _with(device="d" * 65), "field_too_long:device"),
    ("max_len_ok", _with(item_id="x" * 64), None),
    # the limit counts characters, not bytes: 64 two-byte characters are 128 bytes
    ("max_len_multibyte_ok", _with(item_id="\u00e9" * 64), None),
    ("long_multibyte", _with(item_id="\u00e9" * 65), "field_too_long:item_id"),
    ("unknown_type", _with(event_type="click"), "unknown_event_type:event_type"),
    ("bad_time", _with(event_time="yesterday"), "invalid_timestamp:event_time"),
    ("bad_date", _with(event_time="2024-02-30T00:00:00Z"), "invalid_timestamp:event_time"),
    ("fraction_millis", _with(event_time=1717243140000.5), "invalid_timestamp:event_time"),
    ("negative_millis", _with(event_time=-5), "invalid_timestamp:event_time"),
    ("huge_millis", _with(event_time=10**20), "invalid_timestamp:event_time"),
    ("future_time", _with(event_time="2024-06-01T12:06:00Z"), "future_timestamp:event_time"),
    ("near_future_ok", _with(event_time="2024-06-01T12:04:00Z"), None),
    ("inf_price", _with(price=_DROP)[:-1] + b', "price": 1e400}', "numeric_overflow:price"),
    ("huge_price", _with(price=1e12), "numeric_overflow:price"),
    ("negative_price", _with(price=-1), "negative_price:price"),
    ("huge_quantity", _with(quantity=2**40), "numeric_overflow:quantity"),
    ("zero_quantity", _with(quantity=0), "invalid_quantity:quantity"),
    ("negative_quantity", _with(quantity=-3), "invalid_quantity:quantity"),
    ("fractional_quantity", _with(quantity=1.5), "invalid_quantity:quantity"),
    ("purchase_no_price", _with(price=_DROP), "missing_price:price"),
    ("cart_null_price", _with(event_type="add_to_cart", price=None), "missing_price:price"),
    ("first_failure_wins", _with(event_id=_DROP, user_id=None), "missing_field:event_id"),
]
