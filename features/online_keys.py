"""Every Redis key shopstream writes or reads, built in one place from named parts.

The layout (``ss`` namespace, layout version ``v1``)::

    ss:v1:top:{window}:{scope}              ZSET  item -> units sold in the window
    ss:v1:trend:{window}:{scope}            ZSET  item -> trending score
    ss:v1:top:meta                          HASH  "{kind}:{window}:{scope}" -> as-of epoch ms
    ss:v1:item:{item_id}                    HASH  category_id, last region, price
    ss:v1:rec:{model_version}:user:{user}   ZSET  item -> model score (per-user candidates)
    ss:v1:sim:{model_version}:item:{item}   ZSET  item -> similarity
    ss:v1:model:live                        STRING  the live model version
    ss:v1:model:previous                    STRING  the version before it (rollback target)
    ss:v1:model:versions                    ZSET  version -> switch time (history)
    ss:v1:stream:progress                   HASH  latest streaming metrics

Scopes: ``global``, ``cat={category}``, ``reg={region}``, ``catreg={category}|{region}``.
Windows: ``1h``, ``24h``.

Entity features (``user_activity``, ``item_stats``) are not here: they live in
Feast's own Redis layout so that ``FeatureStore.get_online_features`` reads them.

TTLs (seconds), documented beside the keys they bound:

* top sellers / trending: :data:`TOP_TTL` (refreshed on every rewrite);
* item metadata: ``online_ttl_seconds`` setting (refreshed on every event);
* recommendations / similar items: :data:`REC_TTL` per version, refreshed by each
  scoring run; a replaced version is left to expire, so rollback is instant
  while its keys live;
* the model pointers and progress hash have an owner (training / the stream)
  that rewrites them, so no TTL.

Identifiers are percent-encoded before they enter a key, so no id can reach
outside its namespace (``a:b`` cannot impersonate a nested key, ``*`` cannot
widen a SCAN pattern).
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import quote, unquote

__all__ = [
    "NAMESPACE",
    "LAYOUT_VERSION",
    "WINDOWS",
    "TOP_TTL",
    "REC_TTL",
    "Scope",
    "encode_part",
    "key",
    "scope_global",
    "scope_category",
    "scope_region",
    "scope_category_region",
    "scope_for",
    "parse_scope",
    "top_sellers_key",
    "trending_key",
    "top_meta_key",
    "top_meta_field",
    "item_meta_key",
    "user_recs_key",
    "similar_items_key",
    "live_model_key",
    "previous_model_key",
    "model_versions_key",
    "stream_progress_key",
]

NAMESPACE = "ss"
LAYOUT_VERSION = "v1"
WINDOWS: tuple[str, ...] = ("1h", "24h")
TOP_TTL = 3 * 24 * 3600
REC_TTL = 7 * 24 * 3600

Scope = str
Window = Literal["1h", "24h"]
_SAFE = "-_.~@+"
"""Characters kept as-is; everything else (``:`` ``*`` ``?`` ``[`` ``=`` ``|`` ``%`` space, ...) is encoded."""


_UNCHANGED = re.compile(r"[A-Za-z0-9" + re.escape(_SAFE) + r"]*").fullmatch
"""Whether ``quote`` would return an identifier as it is (ASCII letters, digits, ``_SAFE``)."""


def encode_part(part: str) -> str:
    """Percent-encode one identifier so it cannot contain ``:`` or glob characters.

    Most identifiers need nothing encoded; they are returned as they are without
    ``quote``'s round trip through bytes (the stream names two keys per touched
    entity and batch).
    """
    text = str(part)
    return text if _UNCHANGED(text) else quote(text, safe=_SAFE)


def key(*parts: str) -> str:
    """Join already-safe parts under the namespace and layout version."""
    return ":".join((NAMESPACE, LAYOUT_VERSION, *parts))


def scope_global() -> Scope:
    return "global"


def scope_category(category_id: str) -> Scope:
    return f"cat={encode_part(category_id)}"


def scope_region(region: str) -> Scope:
    return f"reg={encode_part(region)}"


def scope_category_region(category_id: str, region: str) -> Scope:
    return f"catreg={encode_part(category_id)}|{encode_part(region)}"


def scope_for(category_id: str | None = None, region: str | None = None) -> Scope:
    """The scope a top-sellers query names (global when neither is given)."""
    if category_id and region:
        return scope_category_region(category_id, region)
    if category_id:
        return scope_category(category_id)
    if region:
        return scope_region(region)
    return scope_global()


def parse_scope(scope: Scope) -> tuple[str | None, str | None]:
    """``(category_id, region)`` of a scope: the inverse of :func:`scope_for`."""
    if scope == scope_global():
        return None, None
    kind, _, rest = scope.partition("=")
    if kind == "cat" and rest:
        return unquote(rest), None
    if kind == "reg" and rest:
        return None, unquote(rest)
    category, sep, region = rest.partition("|")
    if kind == "catreg" and sep and category and region:
        return unquote(category), unquote(region)
    raise ValueError(f"not a scope: {scope!r}")


def _check_window(window: str) -> str:
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
    return window


def top_sellers_key(window: str, scope: Scope) -> str:
    return key("top", _check_window(window), scope)


def trending_key(window: str, scope: Scope) -> str:
    return key("trend", _check_window(window), scope)


def top_meta_key() -> str:
    return key("top", "meta")


def top_meta_field(kind: Literal["top", "trend"], window: str, scope: Scope) -> str:
    return f"{kind}:{_check_window(window)}:{scope}"


def item_meta_key(item_id: str) -> str:
    return key("item", encode_part(item_id))


def user_recs_key(model_version: str, user_id: str) -> str:
    return key("rec", encode_part(model_version), "user", encode_part(user_id))


def similar_items_key(model_version: str, item_id: str) -> str:
    return key("sim", encode_part(model_version), "item", encode_part(item_id))


def live_model_key() -> str:
    return key("model", "live")


def previous_model_key() -> str:
    return key("model", "previous")


def model_versions_key() -> str:
    return key("model", "versions")


def stream_progress_key() -> str:
    return key("stream", "progress")
