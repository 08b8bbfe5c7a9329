"""Ranking metrics against values computed by hand (see training/metrics.py for the definitions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from training.metrics import (
    average_precision_at_k,
    coverage_at_k,
    hit_rate_at_k,
    hits_matrix,
    ndcg_at_k,
    parse_metric,
    precision_at_k,
    ranking_metrics,
    recall_at_k,
)

LOG2_3 = math.log2(3)
LOG2_5 = math.log2(5)

# one user: ranked list 3, 1, 7, 5, 9 and relevant items {1, 5, 8}: hits at ranks 2 and 4
RECS = [3, 1, 7, 5, 9]
RELEVANT = {1, 5, 8}


def test_precision_recall_at_k_by_hand() -> None:
    assert precision_at_k(RECS, RELEVANT, 5) == pytest.approx(2 / 5)
    assert recall_at_k(RECS, RELEVANT, 5) == pytest.approx(2 / 3)
    assert precision_at_k(RECS, RELEVANT, 2) == pytest.approx(1 / 2)
    assert recall_at_k(RECS, RELEVANT, 2) == pytest.approx(1 / 3)
    assert precision_at_k(RECS, RELEVANT, 1) == 0.0


def test_ndcg_at_k_by_hand() -> None:
    # DCG = 1/log2(3) + 1/log2(5); IDCG (3 relevant, k=5) = 1 + 1/log2(3) + 1/log2(4)
    expected = (1 / LOG2_3 + 1 / LOG2_5) / (1 + 1 / LOG2_3 + 0.5)
    assert ndcg_at_k(RECS, RELEVANT, 5) == pytest.approx(expected)
    assert ndcg_at_k(RECS, RELEVANT, 5) == pytest.approx(0.498190, abs=1e-6)
    # k=2: DCG = 1/log2(3); IDCG = 1 + 1/log2(3)
    assert ndcg_at_k(RECS, RELEVANT, 2) == pytest.approx((1 / LOG2_3) / (1 + 1 / LOG2_3))
    assert ndcg_at_k([1, 5, 8], RELEVANT, 3) == pytest.approx(1.0)


def test_map_at_k_by_hand() -> None:
    # AP@5 = (P@2 + P@4) / min(5, 3) = (1/2 + 2/4) / 3
    assert average_precision_at_k(RECS, RELEVANT, 5) == pytest.approx(1 / 3)
    # AP@2 = P@2 / min(2, 3) = (1/2) / 2
    assert average_precision_at_k(RECS, RELEVANT, 2) == pytest.approx(0.25)


def test_hit_rate_at_k_by_hand() -> None:
    assert hit_rate_at_k(RECS, RELEVANT, 1) == 0.0
    assert hit_rate_at_k(RECS, RELEVANT, 2) == 1.0


def test_ranking_metrics_average_over_users_with_relevant_items() -> None:
    # user A: [0, 1, 2], relevant {2}; user B: [0, 3, 4], relevant {0, 4}; user C: nothing relevant
    recs = np.array([[0, 1, 2], [0, 3, 4], [5, 6, 7]])
    relevant = sp.csr_matrix(np.array([
        [0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 0, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]))
    m = ranking_metrics(recs, relevant, [3])
    assert m["users"] == 2
    assert m["precision_at_3"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert m["recall_at_3"] == pytest.approx(1.0)
    ndcg_a = (1 / 2) / 1  # hit at rank 3: 1/log2(4)
    ndcg_b = (1 + 0.5) / (1 + 1 / LOG2_3)
    assert m["ndcg_at_3"] == pytest.approx((ndcg_a + ndcg_b) / 2)
    ap_a = (1 / 3) / 1
    ap_b = (1 / 1 + 2 / 3) / 2
    assert m["map_at_3"] == pytest.approx((ap_a + ap_b) / 2)
    assert m["hit_rate_at_3"] == 1.0
    # coverage counts the evaluated users' lists only: items {0, 1, 2, 3, 4} of 10
    assert m["coverage_at_3"] == pytest.approx(0.5)


def test_short_lists_are_padded_not_rewarded() -> None:
    # one recommendation (a hit) then empty slots: precision@3 still divides by 3
    recs = np.array([[5, -1, -1]])
    relevant = sp.csr_matrix(([1.0], ([0], [5])), shape=(1, 8))
    m = ranking_metrics(recs, relevant, [1, 3])
    assert m["precision_at_3"] == pytest.approx(1 / 3)
    assert m["precision_at_1"] == 1.0
    assert m["ndcg_at_3"] == pytest.approx(1.0)
    assert m["coverage_at_3"] == pytest.approx(1 / 8)


def test_no_relevant_items_gives_zeros_and_no_users() -> None:
    m = ranking_metrics(np.array([[0, 1]]), sp.csr_matrix((1, 4)), [2])
    assert m["users"] == 0 and m["ndcg_at_2"] == 0.0


def test_hits_matrix_and_coverage() -> None:
    recs = np.array([[2, 0, -1], [1, 1, 3]])
    relevant = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 0, 0, 1]]))
    assert hits_matrix(recs, relevant).tolist() == [[True, True, False], [False, False, True]]
    assert coverage_at_k(recs, 2, 4) == pytest.approx(3 / 4)


def test_too_few_recommendations_for_k_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        ranking_metrics(np.zeros((1, 3), dtype=int), sp.csr_matrix(np.ones((1, 3))), [5])


@pytest.mark.parametrize(("text", "parsed"), [("ndcg@10", ("ndcg", 10)), ("MAP@5", ("map", 5)),
                                              ("recall_at_20", ("recall", 20))])
def test_parse_metric_accepts_both_spellings(text: str, parsed: tuple[str, int]) -> None:
    assert parse_metric(text) == parsed


@pytest.mark.parametrize("text", ["ndcg", "auc@10", "ndcg@ten"])
def test_parse_metric_rejects_unknown(text: str) -> None:
    with pytest.raises(ValueError):
        parse_metric(text)
