"""Errors the serving layer raises, each with a stable, user-facing message.

The in-process client raises them; the HTTP API turns them into status codes
(:class:`InvalidParameter` -> 422, :class:`UnknownItem` -> 404,
:class:`ServiceUnavailable` -> 503). Messages never carry secrets or raw Redis
keys, so they are safe to return to callers and to log.
"""

from __future__ import annotations

__all__ = ["ServingError", "InvalidParameter", "UnknownItem", "ServiceUnavailable"]


class ServingError(Exception):
    """Base class of the errors a caller of :mod:`serving` can handle."""

    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidParameter(ServingError, ValueError):
    """A parameter is outside what the API accepts (bad id, k out of range, unknown window)."""

    status_code = 422

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class UnknownItem(ServingError, LookupError):
    """The item has neither similar items nor metadata in the online store."""

    status_code = 404


class ServiceUnavailable(ServingError):
    """Redis is unreachable or slow and nothing suitable is remembered in memory."""

    status_code = 503
