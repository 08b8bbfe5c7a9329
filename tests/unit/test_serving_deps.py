"""The routes' shared checks, on apps of their own (no Redis needed: nothing reads it)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Query
from fastapi.testclient import TestClient

from serving.api.deps import ROUTE_DEPENDENCIES


def _app(parameter: str) -> FastAPI:
    """One route at the same path in every app, taking one query parameter of the given name."""
    router = APIRouter(dependencies=ROUTE_DEPENDENCIES)

    @router.get("/v1/things")
    async def things(value: int = Query(1, alias=parameter)) -> dict[str, int]:  # noqa: B008
        return {parameter: value}

    app = FastAPI()
    app.state.api_key_digest = None
    app.include_router(router)
    return app


def test_each_route_names_its_own_parameters_whatever_app_came_before() -> None:
    """Names were once cached by ``id(route)``, which a route of a later app may reuse once
    an earlier one is gone: then ``?k=5`` could be refused naming another route's ``limit``."""
    import gc

    for n in range(40):  # one app after another, each gone before the next: ids get reused
        parameter, other = ("k", "limit") if n % 2 else ("limit", "k")
        gc.collect()
        with TestClient(_app(parameter)) as http:
            assert http.get(f"/v1/things?{parameter}=5").json() == {parameter: 5}
            refused = http.get(f"/v1/things?{other}=5")
            assert refused.status_code == 422
            assert f"(it takes: {parameter})" in str(refused.json())
