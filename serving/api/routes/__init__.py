"""One ``APIRouter`` per resource; :data:`ROUTERS` is what the app includes, in order."""

from __future__ import annotations

from serving.api.routes import health, items, metrics, top_sellers, trending, users

__all__ = ["ROUTERS"]

ROUTERS = (
    top_sellers.router,
    trending.router,
    users.router,
    items.router,
    health.router,
    metrics.router,
)
