"""Validation of what callers send: identifiers, ``k`` and windows.

One definition serves both the HTTP API (as FastAPI ``Path``/``Query``
constraints, so bad input is a 422 before a handler runs) and the in-process
client (as :func:`check_id` and friends), so both accept exactly the same
inputs.

Identifiers follow the event contract (at most
:data:`features.events.MAX_ID_LENGTH` characters) and a conservative alphabet
that real ids fit: ``85123A``, ``guest-536365``, ``u123``, ``United Kingdom``,
``gift_0001_40``, ``Hong Kong``, ``o'brien``. Control characters, ``/``, ``%``,
``*`` and other punctuation are refused; ids are percent-encoded again by
:mod:`features.online_keys` before they reach a key, so even an accepted
``:`` cannot escape its namespace.
"""

from __future__ import annotations

import re

from features.events import MAX_ID_LENGTH
from features.online_keys import WINDOWS
from serving.errors import InvalidParameter

__all__ = [
    "MAX_ID_LENGTH",
    "ID_PATTERN",
    "OPTIONAL_ID_PATTERN",
    "ID_PARAMS",
    "ID_RULE",
    "K_MIN",
    "K_MAX",
    "K_DEFAULT",
    "WINDOWS",
    "WINDOW_PATTERN",
    "TRENDING_WINDOWS",
    "check_id",
    "check_optional_id",
    "check_k",
    "check_window",
    "message_for",
]

_ID_CHAR = r"[A-Za-z0-9_.@+:&'()#,-]"
_ID_BODY = rf"{_ID_CHAR}(?:(?:{_ID_CHAR}| ){{0,{MAX_ID_LENGTH - 2}}}{_ID_CHAR})?"
ID_PATTERN = rf"^{_ID_BODY}$"
"""1..64 characters: letters, digits, ``_ . @ + : & ' ( ) # , -`` and spaces inside."""
OPTIONAL_ID_PATTERN = rf"^(?:{_ID_BODY})?$"
"""An id or the empty string (an empty query parameter means "not given")."""
ID_PARAMS = frozenset({"user_id", "item_id", "category", "region"})
ID_RULE = (
    f"1-{MAX_ID_LENGTH} characters: letters, digits, spaces inside, and _ . @ + : & ' ( ) # , -"
)
WINDOW_PATTERN = "^(" + "|".join(re.escape(w) for w in WINDOWS) + ")$"
TRENDING_WINDOWS: tuple[str, ...] = ("1h",)
"""Windows trending lists exist for: the pipeline scores the last hour against the 24h pace
(``features.windows.trending_score``), so there is no separate 24h trending list."""
K_MIN = 1
K_MAX = 100
K_DEFAULT = 10

_ID_RE = re.compile(ID_PATTERN)

_MESSAGES = {
    "k": f"k must be an integer from {K_MIN} to {K_MAX}",
    "window": f"window must be one of {', '.join(WINDOWS)}",
    "exclude_purchased": "exclude_purchased must be true or false",
}


def message_for(param: str) -> str | None:
    """The stable message for a bad value of ``param`` (ids share one rule); None if unknown."""
    if param in ID_PARAMS:
        return f"{param} must be {ID_RULE}"
    return _MESSAGES.get(param)


def check_id(param: str, value: object) -> str:
    """Return ``value`` if it is an acceptable identifier, else raise :class:`InvalidParameter`."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidParameter(param, message_for(param) or f"{param} must be {ID_RULE}")
    return value


def check_optional_id(param: str, value: object) -> str | None:
    """Like :func:`check_id`, but ``None`` and ``""`` mean "not given"."""
    if value is None or value == "":
        return None
    return check_id(param, value)


def check_k(k: object) -> int:
    """``k`` as an int in ``K_MIN..K_MAX`` (bools and floats are refused)."""
    if isinstance(k, bool) or not isinstance(k, int) or not K_MIN <= k <= K_MAX:
        raise InvalidParameter("k", _MESSAGES["k"])
    return k


def check_window(window: object, *, trending: bool = False) -> str:
    if window not in WINDOWS:
        raise InvalidParameter("window", _MESSAGES["window"])
    if trending and window not in TRENDING_WINDOWS:
        raise InvalidParameter(
            "window",
            f"trending is computed for window {', '.join(TRENDING_WINDOWS)} only "
            "(the last hour's sales against the 24h pace)",
        )
    return str(window)
