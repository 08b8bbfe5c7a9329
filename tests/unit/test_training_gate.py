"""The promotion gate's rule and the model selection of `shopstream train --model`."""

from __future__ import annotations

import math

import pytest

from training.experiment import resolve_models
from training.registry import gate_decision


def test_first_version_is_promoted_without_a_champion() -> None:
    decision = gate_decision("ndcg@10", 0.05, None, 0.0)
    assert decision.promote and decision.reason == "no champion yet"
    assert decision.tags()["gate.decision"] == "promoted"


@pytest.mark.parametrize(
    ("challenger", "champion", "margin", "promote"),
    [
        (0.21, 0.20, 0.0, True),
        (0.20, 0.20, 0.0, False),     # a tie does not replace the champion
        (0.19, 0.20, 0.0, False),
        (0.205, 0.20, 0.05, False),   # better, but not by 5 %
        (0.211, 0.20, 0.05, True),
    ],
)
def test_challenger_must_beat_champion_by_the_margin(challenger: float, champion: float, margin: float,
                                                     promote: bool) -> None:
    decision = gate_decision("ndcg@10", challenger, champion, margin)
    assert decision.promote is promote
    tags = decision.tags()
    assert tags["gate.champion_value"] == f"{champion:.6f}"
    assert tags["gate.decision"] == ("promoted" if promote else "kept as challenger")


def test_a_challenger_without_a_value_is_never_promoted() -> None:
    assert not gate_decision("ndcg@10", math.nan, None, 0.0).promote


def test_resolve_models_expands_all_and_orders_the_reranker_last() -> None:
    assert resolve_models(["all"])[-1] == "ltr" and resolve_models(["all"])[0] == "popularity"
    assert resolve_models(["ltr,ease", "ease"]) == ["ease", "ltr"]
    with pytest.raises(ValueError, match="unknown model 'svd'"):
        resolve_models(["svd"])
