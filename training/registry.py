"""The gated model registry: every new version is ``challenger``; only a better one is ``champion``.

Aliases on the registered model (``shopstream-recommender`` by default):

* ``challenger`` -- the latest registered version;
* ``champion``   -- the version serving traffic (``models:/<name>@champion``);
* ``previous``   -- the champion before the last switch: the rollback target.

A challenger is promoted when its gate metric (``ndcg@10`` by default) beats the
champion's *measured on the same test split* by more than the configured relative
margin: the champion is re-evaluated on the run's split rather than trusting a
number from another period. With no champion the first version is promoted.
Promotion and rollback are the only writers of ``champion`` and ``previous``;
the live pointer in Redis follows them (:mod:`training.scoring`).

Every decision is also written to the version's tags (``gate.*``), so the
registry shows why a version is or is not serving.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

__all__ = [
    "CHAMPION",
    "CHALLENGER",
    "PREVIOUS",
    "GateDecision",
    "register_version",
    "alias_version",
    "gate_decision",
    "promote",
    "rollback",
    "champion_uri",
]

_log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
PREVIOUS = "previous"


@dataclass(frozen=True)
class GateDecision:
    """The outcome of comparing a challenger with the champion."""

    promote: bool
    metric: str
    challenger_value: float
    champion_value: float | None
    margin: float
    reason: str

    def tags(self) -> dict[str, str]:
        return {
            "gate.metric": self.metric,
            "gate.challenger_value": f"{self.challenger_value:.6f}",
            "gate.champion_value": "" if self.champion_value is None else f"{self.champion_value:.6f}",
            "gate.margin": str(self.margin),
            "gate.decision": "promoted" if self.promote else "kept as challenger",
            "gate.reason": self.reason,
        }


def champion_uri(name: str) -> str:
    """``models:/<name>@champion``."""
    return f"models:/{name}@{CHAMPION}"


def alias_version(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    """The version an alias points to, or ``None`` (no model, or no such alias)."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


_LOGGED_MODEL = re.compile(r"^models:/(m-[0-9a-f]+)$")
"""The URI of a logged model (MLflow 3), by its id."""


def register_version(
    client: MlflowClient, name: str, model_uri: str, *, run_id: str | None = None,
    tags: dict[str, str] | None = None, description: str | None = None,
) -> ModelVersion:
    """Register ``model_uri`` as a new version of ``name`` and point ``challenger`` at it."""
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name, description="shopstream recommendations; aliases champion / challenger / previous."
        )
    # a logged model (``models:/m-…``) names itself too: a tracking server refuses the
    # version without it ("The model_id request parameter must identify the resource that
    # contains the source"); the SQLite store did not check
    logged = _LOGGED_MODEL.match(model_uri)
    version = client.create_model_version(
        name, source=model_uri, run_id=run_id, tags=tags or {}, description=description,
        model_id=logged.group(1) if logged else None,
    )
    client.set_registered_model_alias(name, CHALLENGER, str(version.version))
    _log.info("registered %s version %s as %s", name, version.version, CHALLENGER)
    return version


def gate_decision(
    metric: str, challenger_value: float, champion_value: float | None, margin: float
) -> GateDecision:
    """Pure gate: promote iff there is no champion or ``challenger > champion * (1 + margin)``."""
    if math.isnan(challenger_value):
        return GateDecision(False, metric, challenger_value, champion_value, margin,
                            "the challenger has no value for the gate metric")
    if champion_value is None or math.isnan(champion_value):
        return GateDecision(True, metric, challenger_value, champion_value, margin, "no champion yet")
    threshold = champion_value * (1.0 + margin)
    if challenger_value > threshold:
        return GateDecision(True, metric, challenger_value, champion_value, margin,
                            f"{challenger_value:.4f} > {threshold:.4f} (champion {champion_value:.4f} + {margin:.1%})")
    return GateDecision(False, metric, challenger_value, champion_value, margin,
                        f"{challenger_value:.4f} <= {threshold:.4f} (champion {champion_value:.4f} + {margin:.1%})")


def promote(client: MlflowClient, name: str, version: str | int) -> str | None:
    """Make ``version`` the champion; the old champion becomes ``previous``. Returns the old one."""
    version = str(version)
    client.get_model_version(name, version)  # raises if it does not exist
    current = alias_version(client, name, CHAMPION)
    old = str(current.version) if current is not None else None
    if old == version:
        return old
    if old is not None:
        client.set_registered_model_alias(name, PREVIOUS, old)
    client.set_registered_model_alias(name, CHAMPION, version)
    client.set_model_version_tag(name, version, "promoted_from", old or "")
    _log.info("%s: champion %s -> %s", name, old, version)
    return old


def rollback(client: MlflowClient, name: str) -> tuple[str, str]:
    """Swap ``champion`` and ``previous``; returns ``(from_version, to_version)``.

    Swapping (rather than forgetting) keeps the rolled-back version as the next
    rollback target, so an accidental rollback is undone the same way.
    """
    champion = alias_version(client, name, CHAMPION)
    previous = alias_version(client, name, PREVIOUS)
    if previous is None or champion is None:
        raise LookupError(f"{name}: nothing to roll back to (no '{PREVIOUS}' alias)")
    old, new = str(champion.version), str(previous.version)
    client.set_registered_model_alias(name, CHAMPION, new)
    client.set_registered_model_alias(name, PREVIOUS, old)
    client.set_model_version_tag(name, new, "rolled_back_from", old)
    _log.info("%s: rolled back champion %s -> %s", name, old, new)
    return old, new

