"""One training run end to end: read, split, tune, fit, evaluate, log, register, gate, publish.

The pure stages (:func:`load_interactions` aside, which reads files) live in
:mod:`training.data`, :mod:`training.models` and :mod:`training.evaluate`; this
module wires them to MLflow, the registry and Redis. :func:`run_training` logs into
the *active* MLflow run, which the caller (``shopstream train`` or the notebook)
opens::

    configure_tracking(settings)
    with mlflow.start_run():
        report = run_training(settings, TrainOptions(models=["popularity", "ease"]))

:func:`publish_version`, :func:`promote_version` and :func:`rollback_champion` move
a registry version into Redis and the aliases and live pointer with it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from pipelines.settings import Settings
from training.data import (
    Interactions,
    Split,
    make_split,
    read_interactions_file,
    read_offline_events,
    validation_split,
)
from training.evaluate import ModelResult, comparison_table, evaluate_external, select_and_fit
from training.metrics import metric_key, parse_metric
from training.models import BASELINE, MODELS, LearningToRank, Recommender
from training.models.ltr import FeatureProvider
from training.registry import (
    CHALLENGER,
    CHAMPION,
    GateDecision,
    alias_version,
    gate_decision,
    promote,
    register_version,
    rollback,
)
from training.scoring import (
    ScoringStats,
    has_version,
    rollback_live,
    switch_live,
    write_recommendations,
)

__all__ = [
    "TrainOptions",
    "TrainReport",
    "resolve_models",
    "load_interactions",
    "prepare_splits",
    "fit_models",
    "run_training",
    "load_version",
    "publish_version",
    "promote_version",
    "rollback_champion",
]

_log = logging.getLogger(__name__)

Step = Callable[[str], None]
"""Progress callback: called with a description when a stage starts."""


@dataclass
class TrainOptions:
    """What ``shopstream train`` was asked to do."""

    models: list[str] = field(default_factory=lambda: ["all"])
    since: str | None = None
    until: str | None = None
    events: Path | None = None
    register: bool = True
    publish: bool = True
    """Batch-score a newly promoted champion into Redis and switch the live pointer."""


@dataclass
class TrainReport:
    """What a run produced (the CLI prints it; the notebook inspects it)."""

    run_id: str
    table: pd.DataFrame
    results: list[ModelResult]
    best: str
    split: Split
    interactions: Interactions
    model_uris: dict[str, str]
    version: str | None = None
    decision: GateDecision | None = None
    scoring: ScoringStats | None = None

    def result(self, kind: str) -> ModelResult:
        return next(r for r in self.results if r.kind == kind)


def resolve_models(names: Sequence[str]) -> list[str]:
    """``all`` or model kinds (comma lists allowed) -> kinds in training order, baseline first."""
    kinds: list[str] = []
    for name in names:
        for part in str(name).split(","):
            part = part.strip()
            if not part:
                continue
            if part == "all":
                kinds.extend(MODELS)
            elif part in MODELS:
                kinds.append(part)
            else:
                raise ValueError(f"unknown model {part!r}; expected 'all' or one of {', '.join(MODELS)}")
    order = list(MODELS)
    unique = sorted(set(kinds), key=order.index)
    if not unique:
        raise ValueError("no model selected")
    return unique


def load_interactions(settings: Settings, options: TrainOptions) -> Interactions:
    """Read the run's interactions: ``--events`` file, else the offline store's events."""
    weights = settings.train_event_weights
    if options.events is not None:
        return read_interactions_file(options.events, weights=weights, since=options.since, until=options.until)
    from pipelines.offline_store import events_path

    path = events_path(settings)
    if settings.is_local_data_dir and not Path(path).exists():
        raise FileNotFoundError(
            f"no events in the offline store at {path}; run the stream or a replay first, "
            "or pass --events PATH"
        )
    return read_offline_events(path, options.since, options.until, weights=weights)


def prepare_splits(settings: Settings, interactions: Interactions) -> tuple[Split, Split]:
    """The test split (settings) and a validation split carved from its training part."""
    if interactions.rows == 0:
        raise ValueError(f"no usable interactions in {interactions.source.uri} for the requested range")
    split = make_split(interactions.frame, settings.train_split, test_fraction=settings.train_test_fraction,
                       test_days=settings.train_test_days, seed=settings.train_seed)
    validation = validation_split(split, test_fraction=settings.train_test_fraction,
                                  test_days=settings.train_test_days, seed=settings.train_seed)
    return split, validation


def fit_models(
    kinds: Sequence[str],
    split: Split,
    validation: Split | None,
    settings: Settings,
    *,
    feature_provider: FeatureProvider | None = None,
    step: Step | None = None,
) -> list[ModelResult]:
    """Tune on validation, fit on train, evaluate on test, for each kind (pure: no tracking).

    The re-ranker (``ltr``) comes last and uses the tuned parameters of the
    component models trained in the same call.
    """
    results: list[ModelResult] = []
    tuned: dict[str, dict[str, Any]] = {}
    # the gate's k is always measured, even when it is not one of the reported cut-offs
    ks = sorted(set(settings.train_eval_ks) | {parse_metric(settings.train_gate_metric)[1]})

    def configure(model: Recommender) -> Recommender:
        if isinstance(model, LearningToRank):
            model.with_features(feature_provider)
        return model

    for kind in kinds:
        if step:
            step(f"tuning and fitting {kind}")
        fixed: dict[str, Any] | None = None
        if kind == "ltr":
            components = {c: tuned.get(c, {}) for c in LearningToRank.default_params["components"]}
            fixed = {"components": components, "seed": settings.train_seed,
                     "feature_service": settings.train_feature_service if feature_provider else None}
        elif "seed" in MODELS[kind].default_params:
            fixed = {"seed": settings.train_seed}
        try:
            result = select_and_fit(kind, split, validation, ks=ks, metric=settings.train_gate_metric,
                                    fixed=fixed, configure=configure)
        except ValueError as exc:
            if kind == BASELINE:
                raise
            # e.g. a re-ranker whose label period has no positives on a tiny range
            _log.warning("%s skipped: %s", kind, exc)
            continue
        tuned[kind] = {k: v for k, v in result.params.items() if k != "seed"}
        _log.info("%s: test %s = %.4f (fit %.1fs)", kind, settings.train_gate_metric,
                  result.metric(settings.train_gate_metric), result.fit_seconds)
        results.append(result)
    return results


def _best(results: Sequence[ModelResult], requested: Sequence[str], metric: str) -> ModelResult:
    """The requested model with the best *validation* score: the test split never picks."""
    pool = [r for r in results if r.kind in requested] or list(results)

    def score(r: ModelResult) -> float:
        v = r.metric(metric, on="validation")
        return v if not math.isnan(v) else -1.0

    return max(pool, key=score)


def run_training(
    settings: Settings,
    options: TrainOptions,
    *,
    feature_provider: FeatureProvider | None = None,
    interactions: Interactions | None = None,
    step: Step | None = None,
) -> TrainReport:
    """Run a whole training inside the active MLflow run (see the module docstring)."""
    from mlflow import MlflowClient

    from training.tracking import log_comparison, log_datasets, log_model_result, make_datasets

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("run_training logs into an active MLflow run: open one with mlflow.start_run()")
    requested = resolve_models(options.models)
    kinds = requested if BASELINE in requested else [BASELINE, *requested]
    parse_metric(settings.train_gate_metric)

    if step:
        step("reading interactions")
    interactions = interactions or load_interactions(settings, options)
    split, validation = prepare_splits(settings, interactions)
    _log.info("split: %s", split.stats())
    datasets = make_datasets(interactions.source, split, validation)
    log_datasets(datasets, interactions.source, split, validation)
    mlflow.log_params({
        "models": ",".join(kinds),
        "event_weights": ",".join(f"{k}={v}" for k, v in settings.train_event_weights.items()),
        "eval_ks": ",".join(map(str, settings.train_eval_ks)),
        "gate_metric": settings.train_gate_metric,
        "promotion_margin": settings.train_promotion_margin,
        "seed": settings.train_seed,
    })
    if feature_provider is not None and "ltr" in kinds:
        mlflow.set_tag("feast.feature_service", settings.train_feature_service)

    results = fit_models(kinds, split, validation, settings, feature_provider=feature_provider, step=step)

    if step:
        step("logging models to MLflow")
    uris: dict[str, str] = {}
    for result in results:
        info = log_model_result(result, datasets,
                                feature_service=settings.train_feature_service if result.kind == "ltr" and feature_provider else None)
        uris[result.kind] = info.model_uri
    table = comparison_table(results, settings.train_eval_ks)
    log_comparison(table, settings.train_eval_ks, settings.train_gate_metric)
    best = _best(results, requested, settings.train_gate_metric)
    gate_key = metric_key(*parse_metric(settings.train_gate_metric))
    baseline = next(r for r in results if r.kind == BASELINE)
    mlflow.set_tags({"best_model": best.kind, "baseline": BASELINE})
    mlflow.log_metrics({
        f"best/{gate_key}": best.test_metrics[gate_key],
        f"best/lift_over_{BASELINE}": (best.test_metrics[gate_key] / baseline.test_metrics[gate_key] - 1.0)
        if baseline.test_metrics[gate_key] > 0 else 0.0,
    })
    report = TrainReport(run.info.run_id, table, results, best.kind, split, interactions, uris)
    if not options.register:
        return report

    if step:
        step(f"registering {best.kind} and gating against the champion")
    client = MlflowClient()
    version = register_version(
        client, settings.model_name, uris[best.kind], run_id=run.info.run_id,
        tags={"model_kind": best.kind, "data.digest": interactions.source.digest,
              f"test.{gate_key}": f"{best.test_metrics[gate_key]:.6f}",
              "fitted_until": best.model.fitted_at},
        description=f"{best.kind} from run {run.info.run_id}",
    )
    report.version = str(version.version)
    champion = alias_version(client, settings.model_name, CHAMPION)
    champion_value: float | None = None
    if champion is not None and str(champion.version) != report.version:
        champion_model = load_version(settings, str(champion.version))
        champion_value = evaluate_external(champion_model, split, [parse_metric(settings.train_gate_metric)[1]])[gate_key]
        mlflow.log_metric(f"champion/{gate_key}", champion_value)
        fitted = pd.Timestamp(champion_model.fitted_at) if champion_model.fitted_at else None
        if fitted is not None and split.cutoff is not None and fitted >= split.cutoff:
            _log.warning("champion %s saw data up to %s, past this test split's start %s: its score is optimistic",
                         champion.version, fitted, split.cutoff)
    decision = gate_decision(settings.train_gate_metric, best.test_metrics[gate_key], champion_value,
                             settings.train_promotion_margin)
    report.decision = decision
    for key, value in decision.tags().items():
        client.set_model_version_tag(settings.model_name, report.version, key, value)
    mlflow.set_tags({"registered_version": report.version, "gate.decision": decision.tags()["gate.decision"]})
    _log.info("version %s: %s (%s)", report.version, decision.tags()["gate.decision"], decision.reason)
    if decision.promote:
        promote(client, settings.model_name, report.version)
        if options.publish:
            if step:
                step(f"batch scoring version {report.version} into Redis")
            report.scoring = publish_version(settings, report.version, model=best.model)
    return report


# --------------------------------------------------------------------------- registry <-> Redis
def load_version(settings: Settings, version: str) -> Recommender:
    """The fitted recommender of a registry version (through its pyfunc)."""
    pyfunc = mlflow.pyfunc.load_model(f"models:/{settings.model_name}/{version}")
    model = pyfunc.unwrap_python_model().recommender
    if model is None:
        raise RuntimeError(f"{settings.model_name} version {version} did not load its recommender")
    return model


def publish_version(settings: Settings, version: str, *, model: Recommender | None = None,
                    progress: Callable[[str, int, int], None] | None = None) -> ScoringStats:
    """Batch-score ``version`` into Redis, then switch the live pointer to it in one step."""
    from mlflow import MlflowClient

    from pipelines.connections import redis_client

    model = model or load_version(settings, version)
    client = redis_client(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 10_000))
    try:
        stats = write_recommendations(client, model, version, top_n=settings.train_score_top_n,
                                      chunk=settings.train_score_chunk, progress=progress)
        switch_live(client, version)
    finally:
        client.close()
    registry = MlflowClient()
    registry.set_model_version_tag(settings.model_name, version, "redis.probe_user", stats.probe_user or "")
    registry.set_model_version_tag(settings.model_name, version, "redis.scored_at", pd.Timestamp.now("UTC").isoformat())
    return stats


def promote_version(settings: Settings, version: str | None = None, *, publish: bool = True) -> tuple[str | None, str]:
    """Manually make ``version`` (default: the challenger) the champion and publish it.

    Returns ``(old_champion, new_champion)``.
    """
    from mlflow import MlflowClient

    client = MlflowClient()
    if version is None:
        challenger = alias_version(client, settings.model_name, CHALLENGER)
        if challenger is None:
            raise LookupError(f"{settings.model_name} has no '{CHALLENGER}' version to promote")
        version = str(challenger.version)
    old = promote(client, settings.model_name, str(version))
    client.set_model_version_tag(settings.model_name, str(version), "gate.decision", "promoted manually")
    if publish:
        publish_version(settings, str(version))
    return old, str(version)


def rollback_champion(settings: Settings, *, publish: bool = True) -> tuple[str, str]:
    """Champion back to the previous version; the live pointer in Redis follows.

    When the previous version's lists have expired from Redis it is re-scored first
    (slower, still correct). Returns ``(from_version, to_version)``.
    """
    from mlflow import MlflowClient

    from pipelines.connections import redis_client

    client = MlflowClient()
    old, new = rollback(client, settings.model_name)
    if publish:
        target = client.get_model_version(settings.model_name, new)
        probe = (target.tags or {}).get("redis.probe_user")
        redis = redis_client(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 2_000))
        try:
            present = has_version(redis, new, probe)
        finally:
            redis.close()
        if present:
            redis = redis_client(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 2_000))
            try:
                rollback_live(redis, to_version=new)
            finally:
                redis.close()
        else:
            _log.info("version %s is no longer in Redis: re-scoring it before switching", new)
            publish_version(settings, new)
    return old, new
