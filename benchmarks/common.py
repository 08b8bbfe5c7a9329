"""Shared pieces of the benchmarks: latency summaries, open-loop pacing, result files, plots.

Every benchmark measures shopstream and its peer in the same run (the machines
are shared and noisy, so only same-run ratios mean anything) and writes
``benchmarks/results/<name>.json``, ``<name>.md`` and PNG plots beside them.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RESULTS_DIR",
    "LatencySummary",
    "summarize",
    "open_loop",
    "BenchResult",
    "write_result",
    "read_result",
    "describe_meta",
    "plot_latency_histograms",
    "plot_series",
    "plot_bars",
    "bench_settings",
    "machine_meta",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class LatencySummary:
    """Latency percentiles in milliseconds, plus throughput and errors."""

    count: int
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    throughput_per_s: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


def summarize(latencies_s: Iterable[float], *, elapsed_s: float, errors: int = 0) -> LatencySummary:
    values = np.asarray(list(latencies_s), dtype=float) * 1000.0
    if values.size == 0:
        return LatencySummary(0, errors, *(float("nan"),) * 5, 0.0)
    return LatencySummary(
        count=int(values.size),
        errors=errors,
        p50_ms=float(np.percentile(values, 50)),
        p90_ms=float(np.percentile(values, 90)),
        p99_ms=float(np.percentile(values, 99)),
        max_ms=float(values.max()),
        mean_ms=float(values.mean()),
        throughput_per_s=float(values.size / elapsed_s) if elapsed_s > 0 else 0.0,
    )


def open_loop(
    call: Callable[[int], None],
    *,
    rate: float,
    count: int,
    max_seconds: float,
) -> tuple[list[float], int, float]:
    """Call ``call(i)`` at a fixed rate (open loop), bounded in count and time.

    Latency is measured from each request's *scheduled* start, so a stall shows
    up as latency for every request queued behind it (no coordinated omission).

    Returns
    -------
    (latencies in seconds, error count, elapsed seconds)
    """
    interval = 1.0 / rate
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    deadline = start + max_seconds
    for i in range(count):
        scheduled = start + i * interval
        now = time.perf_counter()
        if now > deadline:
            break
        if scheduled > now:
            time.sleep(scheduled - now)
        try:
            call(i)
        except Exception:  # noqa: BLE001 - a failed request is counted, not fatal
            errors += 1
            continue
        latencies.append(time.perf_counter() - scheduled)
    return latencies, errors, time.perf_counter() - start


@dataclass
class BenchResult:
    """One benchmark's results: rows per system, ratios against the peer, notes."""

    name: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    def markdown(self, *, plots: bool = True) -> str:
        """The table, ratios, targets and notes (and the plots' image links unless ``plots=False``)."""
        lines = [f"### {self.title}", ""]
        if self.rows:
            columns = list(dict.fromkeys(c for row in self.rows for c in row))  # every row's columns, in order
            lines.append("| " + " | ".join(columns) + " |")
            lines.append("|" + "---|" * len(columns))
            for row in self.rows:
                lines.append("| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |")
            lines.append("")
        for key, value in self.ratios.items():
            lines.append(f"- **{key}**: {value:.2f}×")
        for key, value in self.targets.items():
            lines.append(f"- target {key}: {value}")
        lines.extend(f"- {note}" for note in self.notes)
        if plots:
            lines.extend(f"\n![{Path(p).stem}]({Path(p).name})" for p in self.plots)
        return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def read_result(path: Path) -> tuple[BenchResult, dict[str, Any]]:
    """A result written by :func:`write_result`: the :class:`BenchResult` and its meta."""
    payload = json.loads(Path(path).read_text())
    meta = payload.pop("meta", {})
    known = {f for f in BenchResult.__dataclass_fields__}
    return BenchResult(**{k: v for k, v in payload.items() if k in known}), meta


def write_result(result: BenchResult, out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``<name>.json`` and ``<name>.md`` (with time, machine, load and commit); return the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = machine_meta()
    payload = {"meta": meta, **asdict(result)}
    path = out_dir / f"{result.name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    (out_dir / f"{result.name}.md").write_text(result.markdown() + f"\n_{describe_meta(meta)}_\n")
    return path


def machine_meta() -> dict[str, Any]:
    """When, on what machine (cores, load average now) and at which commit a figure was taken."""
    import os

    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {_cpu_count()} cores, Python {platform.python_version()}",
        "cores": _cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "commit": git_commit(),
    }


def describe_meta(meta: dict[str, Any]) -> str:
    """One line: ``<when> on <machine>, load average <1m, 5m, 15m>, commit <sha>``."""
    text = f"{meta.get('when', '?')} on {meta.get('machine', '?')}"
    load = meta.get("load_average")
    if load:
        text += f", load average {', '.join(f'{x:.2f}' for x in load)}"
    if meta.get("commit"):
        text += f", commit {meta['commit']}"
    return text


def git_commit() -> str:
    """The repository's short commit, ``+dirty`` when tracked files changed; ``""`` outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return sha + ("+dirty" if dirty else "")


def process_tree_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process and its live descendants, from ``/proc``
    (Linux): what a server spent, its worker processes included. Unlike its latency, a
    server's CPU per request hardly depends on what else the shared machine runs, and it
    says how many requests a second one worker can answer at most."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            total += process_cpu_s(current)
            todo.extend(child_pids(current))
    return total


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of one process (all its threads, not its children) from
    ``/proc``; 0.0 once it is gone."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def reaped_children_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process's children that have exited and been
    waited for (``cutime``, ``cstime`` in ``/proc``): what :func:`process_tree_cpu_s` no
    longer sees once a child is gone; 0.0 once the process itself is gone."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime


def child_pids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The direct children of a process (every thread's, from ``proc``); none once it is gone.

    A thread that ends while its siblings are read is skipped, not the end of the reading:
    a JVM starts and ends threads all the time, and a child is listed under the thread that
    forked it (or, once that thread is gone, under another), so stopping at the first
    vanished thread lost the children listed after it (a drain's Python workers, once,
    counted as 0.0 s)."""
    try:
        tasks = sorted((proc / str(pid) / "task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return []
    children: list[int] = []
    for task in tasks:
        try:
            children.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return children


def process_command(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


def plot_latency_histograms(
    series: dict[str, list[float]], path: Path, *, title: str
) -> Path:
    """Overlaid latency histograms (ms, log-spaced bins) with p50/p99 markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    all_ms = np.concatenate([np.asarray(v) * 1000 for v in series.values() if len(v)])
    lo, hi = max(all_ms.min(), 1e-3), all_ms.max()
    bins = np.logspace(np.log10(lo), np.log10(hi * 1.01), 60)
    for label, values in series.items():
        ms = np.asarray(values) * 1000
        if not ms.size:
            continue
        p50, p99 = np.percentile(ms, [50, 99])
        ax.hist(ms, bins=bins, alpha=0.5, label=f"{label} (p50 {p50:.2f} ms, p99 {p99:.2f} ms)")
        ax.axvline(p99, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("requests")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_series(
    series: dict[str, tuple[list[float], list[float]]], path: Path, *, title: str, ylabel: str
) -> Path:
    """Lines over time (x seconds, y values), e.g. throughput or freshness per batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker=".", label=label)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bench_settings(name: str, **overrides: Any) -> Any:
    """Settings for a benchmark run: its own data dir and free loopback ports.

    Built at the edge (benchmarks are entry points), from the environment like
    every other command, so ``SHOPSTREAM_*`` variables still apply.
    """
    from pipelines.infra.process import free_port
    from pipelines.settings import Settings

    base = Path(".shopstream-bench") / name
    values: dict[str, Any] = {
        "data_dir": str(base / "data"),
        "kafka_bootstrap_servers": f"127.0.0.1:{free_port()}",
        "kafka_controller_port": free_port(),
        "redis_url": f"redis://127.0.0.1:{free_port()}/0",
        "api_port": free_port(),
        "spark_log_level": "ERROR",
    }
    values.update(overrides)
    return Settings(**values)


def plot_bars(
    groups: list[str],
    panels: dict[str, dict[str, list[float | None]]],
    path: Path,
    *,
    title: str,
) -> Path:
    """Grouped bar charts side by side: one panel per measure (e.g. seconds, MB).

    ``panels`` maps a panel's y label to ``{series label: one value per group}``;
    ``None`` leaves a gap (e.g. a model without a reference).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    x = np.arange(len(groups))
    for ax, (ylabel, series) in zip(axes[0], panels.items(), strict=True):
        width = 0.8 / max(len(series), 1)
        for n, (label, values) in enumerate(series.items()):
            heights = [np.nan if v is None else v for v in values]
            bars = ax.bar(x + (n - (len(series) - 1) / 2) * width, heights, width, label=label)
            ax.bar_label(bars, fmt="%.3g", fontsize=7)
        ax.set_xticks(x, groups, rotation=20)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
