"""MLflow logging for a training run: the experiment, datasets, models, comparison, plots.

These helpers log into the *active* run; the run itself is opened at the edge
(``shopstream train`` or the notebook) with one ``with mlflow.start_run():``.
The local default is a SQLite tracking store and an artifact folder under the
data dir (:attr:`Settings.tracking_uri`, :attr:`Settings.mlflow_artifact_root`);
with a tracking server URI the same calls go to the server.

Layout of a run: the interactions it read as MLflow datasets (``training``,
``validation``, ``testing`` contexts, source = the offline store folder or the
file, digest = a content hash); per model a logged pyfunc model (named after
the kind) with its hyperparameters and its test metrics linked to the model and
the test dataset, and the same metrics on the run as ``<kind>/<metric>``;
the comparison table (``comparison.csv``/``.md`` and an MLflow table), the plots,
and the Feast feature service used (tag ``feast.feature_service``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import mlflow
import pandas as pd
from mlflow.data.meta_dataset import MetaDataset

from pipelines.connections import Unreachable, mlflow_unreachable
from pipelines.settings import Settings
from training.data import DataSource, Split
from training.evaluate import ModelResult
from training.pyfunc import MODEL_CODE, SIGNATURE, input_example, pip_requirements, save_artifact

__all__ = [
    "configure_tracking",
    "RunDatasets",
    "make_datasets",
    "log_datasets",
    "log_model_result",
    "log_comparison",
    "run_url",
]

_log = logging.getLogger(__name__)
_DATASET_COLUMNS = ["user_id", "item_id", "event_time", "event_type", "weight", "region"]


def configure_tracking(settings: Settings) -> str:
    """Point MLflow at the settings' tracking store and experiment; returns the experiment id.

    A tracking server that does not accept a connection raises
    :class:`~pipelines.connections.Unreachable` at once (MLflow's client retries for minutes).

    For the local SQLite default the folder is created and the experiment's
    artifacts go to :attr:`Settings.mlflow_artifact_root`; a tracking server keeps
    its own artifact location.
    """
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    # MLflow draws a tqdm bar for every model it copies while validating an input
    # example; in a CLI with its own progress display (and in logs) that is noise.
    os.environ.setdefault(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, "false")
    if (problem := mlflow_unreachable(settings)) is not None:
        raise Unreachable(problem)
    uri = settings.tracking_uri
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(settings.mlflow_experiment)
    if experiment is None:
        artifact_location = None
        if _is_local_store(uri):
            root = Path(settings.mlflow_artifact_root)
            root.mkdir(parents=True, exist_ok=True)
            artifact_location = root.as_uri()
        experiment_id = client.create_experiment(settings.mlflow_experiment, artifact_location=artifact_location)
    else:
        experiment_id = experiment.experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def _is_local_store(uri: str) -> bool:
    return urlsplit(uri).scheme in ("sqlite", "file", "")


def run_url(run: Any) -> str:
    """A link to the run: the server's UI page, or the local store and run id."""
    uri = mlflow.get_tracking_uri()
    exp, rid = run.info.experiment_id, run.info.run_id
    if urlsplit(uri).scheme in ("http", "https"):
        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{rid}"
    return f"{uri} (experiment {exp}, run {rid}; browse with `mlflow ui --backend-store-uri {uri}`)"


# --------------------------------------------------------------------------- datasets
@dataclass(frozen=True)
class RunDatasets:
    """The MLflow datasets of a run (what each model's metrics are linked to), with row counts."""

    training: MetaDataset
    validation: MetaDataset | None
    testing: MetaDataset
    rows: dict[str, int]


def _dataset_source(uri: str) -> Any:
    """The MLflow dataset source for a path or URI (first registered source that takes it).

    Resolving explicitly avoids MLflow's "interpreted in multiple ways" warning for
    local paths (two local sources are registered); a scheme MLflow does not know
    (``s3a://``) is recorded as a plain URI.
    """
    from mlflow.data.dataset_source_registry import get_registered_sources

    for source_class in get_registered_sources():
        if source_class._can_resolve(uri):
            return source_class._resolve(uri)
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    return HTTPDatasetSource(uri)


def _dataset(frame: pd.DataFrame, source: DataSource, part: str, digest: str) -> MetaDataset:
    """Metadata only: source, content digest and schema; the rows stay in the offline store.

    (A ``PandasDataset`` would infer its schema from every row, seconds per column per
    million rows; the schema of a sample is the same and the row count goes into the
    input's tags.)
    """
    from mlflow.models import infer_signature

    cols = [c for c in _DATASET_COLUMNS if c in frame.columns]
    name = f"interactions-{part}"
    if source.since or source.until:
        name += f"[{source.since or '…'},{source.until or '…'})"
    schema = infer_signature(frame[cols].head(1000)).inputs if len(frame) else None
    return MetaDataset(_dataset_source(source.uri), name=name, digest=digest, schema=schema)


def make_datasets(source: DataSource, split: Split, validation: Split | None) -> RunDatasets:
    """Datasets for the training, validation and test parts of the split.

    Digests hash each part's content, so two runs that read the same events name the
    same datasets and a changed event shows up as a new digest.
    """
    from training.data import content_digest

    train_frame = split.train.frame
    test_frame = split.test_frame
    val = None
    rows = {"training": len(train_frame), "testing": len(test_frame)}
    if validation is not None:
        val = _dataset(validation.test_frame, source, "validation", content_digest(validation.test_frame))
        rows["validation"] = len(validation.test_frame)
    return RunDatasets(
        training=_dataset(train_frame, source, "train", content_digest(train_frame)),
        validation=val,
        testing=_dataset(test_frame, source, "test", content_digest(test_frame)),
        rows=rows,
    )


def log_datasets(datasets: RunDatasets, source: DataSource, split: Split, validation: Split | None) -> None:
    """Log the datasets as run inputs, plus the source description and split statistics."""
    tags = {k: str(v) for k, v in source.describe().items()}
    mlflow.log_input(datasets.training, context="training", tags={**tags, "rows": str(datasets.rows["training"])})
    if datasets.validation is not None:
        mlflow.log_input(datasets.validation, context="validation",
                         tags={**tags, "rows": str(datasets.rows["validation"])})
    mlflow.log_input(datasets.testing, context="testing", tags={**tags, "rows": str(datasets.rows["testing"])})
    params = {f"data.{k}": v for k, v in source.describe().items()}
    params.update({f"split.{k}": v for k, v in split.stats().items()})
    if validation is not None:
        params.update({f"validation.{k}": v for k, v in validation.stats().items()
                       if k in ("cutoff", "train_rows", "eval_users")})
    mlflow.log_params(params)
    mlflow.log_dict({"source": {**source.describe(), "files": list(source.files),
                                "rows_dropped": dict(source.rows_dropped)},
                     "split": split.stats(),
                     "validation": validation.stats() if validation is not None else None},
                    "dataset.json")


# --------------------------------------------------------------------------- models
def _flat_params(params: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            for sub, sub_value in _flat_params(value).items():
                out[f"{key}.{sub}"] = sub_value
        else:
            out[key] = json.dumps(value) if not isinstance(value, str) else value
    return out


def log_model_result(result: ModelResult, datasets: RunDatasets, *, feature_service: str | None = None) -> Any:
    """Log one model: pyfunc with signature and input example, params, linked metrics.

    Returns the :class:`mlflow.models.model.ModelInfo` (``model_uri`` to register).
    """
    params = _flat_params(result.params)
    with tempfile.TemporaryDirectory(prefix=f"shopstream-{result.kind}-") as tmp:
        folder = save_artifact(result.model, tmp)
        info = mlflow.pyfunc.log_model(
            name=result.kind,
            python_model=str(MODEL_CODE),
            artifacts={"recommender": str(folder)},
            signature=SIGNATURE,
            input_example=(input_example(result.model), {"k": 10}),
            pip_requirements=pip_requirements(),
            params=params,
            tags={"model_kind": result.kind, **({"feast.feature_service": feature_service} if feature_service else {})},
            metadata={"model_kind": result.kind, "fitted_until": result.model.fitted_at,
                      "requires": "the shopstream package (training.models)"},
        )
    metrics = {f"{result.kind}/{k}": v for k, v in result.test_metrics.items() if k != "users"}
    metrics[f"{result.kind}/fit_seconds"] = result.fit_seconds
    mlflow.log_metrics(metrics, model_id=info.model_id, dataset=datasets.testing)
    val = {f"{result.kind}/validation_{k}": v for k, v in result.validation_metrics.items() if k != "users"}
    if val:
        mlflow.log_metrics(val, model_id=info.model_id, dataset=datasets.validation)
    mlflow.log_params({f"{result.kind}.{k}": v for k, v in params.items()})
    if result.tuning:
        mlflow.log_table(pd.DataFrame(result.tuning).astype({"seconds": float}), f"tuning/{result.kind}.json")
    return info


def log_comparison(table: pd.DataFrame, ks: Sequence[int], gate_metric: str) -> None:
    """The comparison table (CSV, Markdown, MLflow table) and the plots as artifacts."""
    from training.plots import metrics_per_k, metrics_per_model

    mlflow.log_text(table.to_csv(float_format="%.6f"), "comparison/comparison.csv")
    mlflow.log_text(table.to_markdown(floatfmt=".4f") if _has_tabulate() else table.to_string(), "comparison/comparison.md")
    mlflow.log_table(table.reset_index(), "comparison/comparison.json")
    import matplotlib.pyplot as plt

    for k in sorted(ks):
        fig = metrics_per_model(table, k)
        mlflow.log_figure(fig, f"plots/metrics_per_model_at_{k}.png")
        plt.close(fig)
    fig = metrics_per_k(table, ks)
    mlflow.log_figure(fig, "plots/metrics_per_k.png")
    plt.close(fig)
    mlflow.set_tag("gate_metric", gate_metric)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
