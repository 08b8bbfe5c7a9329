"""notebooks/train_recommender.ipynb runs top to bottom against the test infrastructure.

Small offline store (sample events), Feast snapshots from the project's backfill on the
session's Spark, a SQLite MLflow store; the notebook gets its parameters only through
``SHOPSTREAM_*`` environment variables, which it reads with ``Settings()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines.offline_store import events_path
from pipelines.settings import Settings
from training.sample import sample_events, write_offline_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "train_recommender.ipynb"


def test_notebook_runs_top_to_bottom_and_logs_both_models(
    make_settings: Callable[..., Settings], tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    import nbformat
    from nbclient import NotebookClient

    from pipelines.backfill import run_backfill

    settings = make_settings(data_dir=str(tmp_path / "data"), mlflow_experiment="notebook-test")
    events = sample_events(users=80, items=40, categories=4, events=3000, days=4.0, seed=9,
                           start="2026-10-01T00:00:00Z")
    write_offline_events(events, events_path(settings))
    run_backfill(settings, step_seconds=24 * 3600, materialize=False, spark=spark)

    env = {
        "SHOPSTREAM_DATA_DIR": settings.data_dir,
        "SHOPSTREAM_RUN_DIR": str(settings.run_path),
        "SHOPSTREAM_REDIS_URL": settings.redis_url,
        "SHOPSTREAM_MLFLOW_TRACKING_URI": settings.tracking_uri,
        "SHOPSTREAM_MLFLOW_EXPERIMENT": settings.mlflow_experiment,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parents[1])}}).execute()

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "MLflow run:" in text and "items in the test period" in text

    client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
    experiment = client.get_experiment_by_name("notebook-test")
    runs = client.search_runs([experiment.experiment_id], filter_string="attributes.run_name = 'notebook'")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["feast.feature_service"] == "ranking_v1"
    assert run.data.metrics["ltr/ndcg_at_10"] > run.data.metrics["popularity/ndcg_at_10"]
    assert {i.dataset.name.split("[")[0] for i in run.inputs.dataset_inputs} == {
        "interactions-train", "interactions-validation", "interactions-test"}
