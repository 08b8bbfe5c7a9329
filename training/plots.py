"""Comparison plots (matplotlib, Agg backend): metrics per model, and each metric over k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from training.metrics import METRICS, metric_key  # noqa: E402

__all__ = ["metrics_per_model", "metrics_per_k"]


def metrics_per_model(table: pd.DataFrame, k: int) -> Any:
    """Grouped bars: every metric at ``k`` for every model (rows of ``table``)."""
    cols = [metric_key(m, k) for m in METRICS if metric_key(m, k) in table.columns]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(cols) + 2), 4.5))
    table[cols].rename(columns=lambda c: c.replace(f"_at_{k}", f"@{k}")).T.plot.bar(ax=ax, rot=0)
    ax.set_title(f"Test metrics at k={k} per model")
    ax.set_ylabel("value")
    ax.legend(title="model", fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def metrics_per_k(table: pd.DataFrame, ks: Sequence[int]) -> Any:
    """One panel per metric, a line per model over k."""
    ks = sorted(ks)
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
    for ax, name in zip(axes.ravel(), METRICS, strict=True):
        for model, row in table.iterrows():
            ax.plot(ks, [row.get(metric_key(name, k), float("nan")) for k in ks], marker="o", label=str(model))
        ax.set_title(name)
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize="small")
    for ax in axes[1]:
        ax.set_xlabel("k")
    fig.suptitle("Test metrics over k")
    fig.tight_layout()
    return fig
