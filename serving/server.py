"""Run the API under uvicorn with the settings: ``shopstream serve`` calls :func:`run`."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from pipelines.settings import Settings

__all__ = ["run", "uvicorn_options"]

log = logging.getLogger(__name__)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn options from the settings: uvloop and httptools when installed, no access log
    by default (it costs latency), bounded concurrency when configured."""
    options: dict[str, Any] = {
        "host": settings.api_host,
        "port": settings.api_port,
        "access_log": settings.api_access_log,
        "server_header": False,
        "timeout_graceful_shutdown": 10,
        "timeout_keep_alive": settings.api_keep_alive_seconds,
        "log_level": "info",
    }
    if importlib.util.find_spec("uvloop") is not None:
        options["loop"] = "uvloop"
    if importlib.util.find_spec("httptools") is not None:
        options["http"] = "httptools"
    if settings.api_limit_concurrency is not None:
        options["limit_concurrency"] = settings.api_limit_concurrency
    return options


def run(settings: Settings) -> None:
    """Serve until interrupted (SIGINT/SIGTERM stop it gracefully)."""
    import uvicorn

    from pipelines.infra.process import ensure_ports_free

    # uvicorn finds out after the app's start-up, and does not name the setting
    ensure_ports_free("shopstream serve", [(settings.api_host, settings.api_port)],
                      "SHOPSTREAM_API_PORT", whose="")
    options = uvicorn_options(settings)
    log.info(
        "serving on http://%s:%d with %d worker(s); Redis %s; API key %s",
        settings.api_host, settings.api_port, settings.api_workers, settings.redis_url_redacted,
        "required" if settings.api_key is not None else "not required",
    )
    if settings.api_workers == 1:
        from serving.app import create_app

        uvicorn.run(create_app(settings), **options)
    else:
        # Workers are separate processes: each rebuilds the settings from the same
        # environment through the factory. They publish their metrics to one folder
        # (serving.metrics), emptied here so a previous run's numbers are not summed in.
        import shutil

        from serving.metrics import shared_metrics_dir

        share = shared_metrics_dir(settings.run_path, settings.api_port)
        shutil.rmtree(share, ignore_errors=True)
        share.mkdir(parents=True, exist_ok=True)
        uvicorn.run("serving.app:create_app_from_env", factory=True,
                    workers=settings.api_workers, **options)
