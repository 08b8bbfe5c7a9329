"""Training: time and peak memory of fitting each model on 1 million interactions.

The input is what ``shopstream train --events FILE`` reads for a generated file: the
generator's records (``pipelines.generate.run_generate`` with a fixed seed and start
time, so the same bytes every run) written as JSON lines, then read through the event
contract by ``training.data.read_interactions_file`` (weights per event type from
settings) and indexed by ``training.data.make_training_data``. The cleaned frame is
cached as Parquet under ``.shopstream-bench/training/`` (keyed by size and seed), so
a second run skips the generation.

Each fit runs in a fresh child process (``python -m benchmarks.training --fit ...``):
the child loads the frame and builds the user x item matrix *outside* the clock,
resets its RSS high-water mark (``/proc/self/clear_refs``), fits the model with its
default parameters, and reports wall and CPU seconds and its peak RSS during the fit
(``VmHWM``; the input's own resident size is reported beside it). One process per fit
means no model inherits another's heap.

Same-run references (already installed, nothing added): a plain numpy item count for
``popularity``, a pandas group-by for ``popularity_region``, scikit-learn's
``NearestNeighbors`` (brute-force cosine, the full k-neighbour graph) for ``item_knn``,
the paper's numpy EASE (``np.linalg.inv``) for ``ease``, scikit-learn's
``TruncatedSVD`` with as many factors for ``als`` (``implicit`` is not installed), and
none for ``ltr`` (no learning-to-rank library is installed; its fit includes its five
component models, fitted twice: on the label period's past and on all data).

Note the CLI's ``shopstream train`` also tunes each model on a validation split (up to
four fits) and evaluates it; this benchmark times one fit with the defaults.

Usage: ``python -m benchmarks.training [--interactions N] [--models a,b] [--no-peer]``.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, BenchResult, plot_bars, write_result

__all__ = ["main", "build_input", "REFERENCES"]

log = logging.getLogger(__name__)

DEFAULT_INTERACTIONS = 1_000_000
START_TIME = "2026-11-01T00:00:00Z"
CACHE_DIR = Path(".shopstream-bench") / "training"

REFERENCES: dict[str, str] = {
    "popularity": "numpy bincount of weights per item",
    "popularity_region": "pandas group-by (region, item) sum",
    "item_knn": "scikit-learn NearestNeighbors (brute cosine, k-neighbour graph)",
    "ease": "textbook numpy EASE (np.linalg.inv)",
    "als": "scikit-learn TruncatedSVD (same factors)",
}
"""The same-run reference per model kind (``ltr`` has none installed)."""


# --------------------------------------------------------------------------- input
def build_input(count: int, *, seed: int, users: int, items: int, categories: int,
                cache_dir: Path = CACHE_DIR) -> tuple[Path, dict[str, Any]]:
    """The cleaned interactions frame of ``count`` generated events, as a Parquet file.

    Returns the path and a description (rows read, kept, dropped, digest).
    """
    from rich.console import Console

    from pipelines.clickstream_model import GeneratorConfig
    from pipelines.generate import run_generate
    from pipelines.settings import Settings
    from training.data import read_interactions_file

    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = f"interactions-{count}-s{seed}-u{users}-i{items}-c{categories}"
    parquet, info_path = cache_dir / f"{stem}.parquet", cache_dir / f"{stem}.json"
    if parquet.exists() and info_path.exists():
        return parquet, json.loads(info_path.read_text())
    settings = Settings(data_dir=str(cache_dir / "data"))
    records = cache_dir / f"{stem}.jsonl"
    started = time.perf_counter()
    config = GeneratorConfig(seed=seed, users=users, items=items, categories=categories)
    run_generate(settings, config, count=count, start_time=START_TIME, output=records,
                 console=Console(file=io.StringIO()))
    generated = time.perf_counter() - started
    interactions = read_interactions_file(records, weights=settings.train_event_weights)
    frame = interactions.frame
    frame.to_parquet(parquet, index=False)
    records.unlink()
    info = {"events": count, "interactions": len(frame), "users": int(frame["user_id"].nunique()),
            "items": int(frame["item_id"].nunique()), "digest": interactions.source.digest,
            "dropped": interactions.source.rows_dropped, "seed": seed,
            "generate_s": round(generated, 1), "read_s": round(time.perf_counter() - started - generated, 1)}
    info_path.write_text(json.dumps(info, indent=2))
    return parquet, info


# --------------------------------------------------------------------------- child side
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset this process's RSS high-water mark (Linux ``clear_refs`` 5); False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _reference_fit(kind: str, data: Any) -> Any:
    """What a user would write with the installed libraries instead of shopstream's model."""
    import numpy as np

    x = data.matrix
    if kind == "popularity":
        return np.bincount(data.frame["item_idx"].to_numpy(), weights=data.frame["weight"].to_numpy(),
                           minlength=data.n_items)
    if kind == "popularity_region":
        return data.frame.groupby(["region", "item_idx"], observed=True)["weight"].sum()
    if kind == "item_knn":
        from sklearn.neighbors import NearestNeighbors

        from training.models import make_model

        k = min(int(make_model("item_knn").params["neighbors"]) + 1, data.n_items)
        items = x.T.tocsr()
        return NearestNeighbors(n_neighbors=k, metric="cosine", algorithm="brute").fit(items).kneighbors(items)
    if kind == "ease":
        from training.models import make_model

        lam = float(make_model("ease").params["l2"])
        gram = (x.T @ x).toarray().astype(np.float64)
        gram[np.diag_indices_from(gram)] += lam
        p = np.linalg.inv(gram)
        b = p / (-np.diag(p))
        b[np.diag_indices_from(b)] = 0.0
        return b
    if kind == "als":
        from sklearn.decomposition import TruncatedSVD

        from training.models import make_model

        factors = int(make_model("als").params["factors"])
        return TruncatedSVD(n_components=min(factors, min(x.shape) - 1), random_state=42).fit(x)
    raise ValueError(f"no reference for {kind!r}")


def fit_once(kind: str, input_path: Path, *, reference: bool) -> dict[str, Any]:
    """In this process: load the input, then time one fit and its peak RSS."""
    import pandas as pd

    from training.data import make_training_data
    from training.models import make_model

    frame = pd.read_parquet(input_path)
    data = make_training_data(frame)
    _ = data.matrix  # the shared input (built by the split in a real run), outside the clock
    del frame
    gc.collect()
    before_kb = _status_kb("VmRSS")
    reset = _reset_peak()
    started, cpu = time.perf_counter(), time.process_time()
    if reference:
        out = _reference_fit(kind, data)
    else:
        out = make_model(kind).fit(data)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    peak_kb = _status_kb("VmHWM")  # since the reset, else since the process started
    del out
    return {"kind": kind, "reference": reference, "fit_s": seconds, "cpu_s": cpu_s,
            "rss_before_mb": before_kb / 1024, "peak_mb": peak_kb / 1024,
            "fit_extra_mb": max(peak_kb - before_kb, 0) / 1024, "peak_since_start": not reset,
            "users": data.n_users, "items": data.n_items, "nnz": int(data.matrix.nnz)}


# --------------------------------------------------------------------------- parent side
def _run_child(kind: str, input_path: Path, *, reference: bool, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.training", "--fit", kind, "--input", str(input_path)]
    if reference:
        cmd.append("--reference")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> BenchResult:
    from training.models import MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interactions", type=int, default=DEFAULT_INTERACTIONS,
                        help=f"generated events to train on (default {DEFAULT_INTERACTIONS:,})")
    parser.add_argument("--models", default="all", help="comma list of model kinds (default all)")
    parser.add_argument("--no-peer", action="store_true", help="skip the reference implementations")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--users", type=int, default=10_000, help="generated store: users")
    parser.add_argument("--items", type=int, default=2_000, help="generated store: items")
    parser.add_argument("--categories", type=int, default=40, help="generated store: categories")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per fit")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where plots go")
    # Called by benchmarks.run_all without arguments: defaults, never run_all's own argv.
    args = parser.parse_args(argv if argv is not None else [])
    kinds = list(MODELS) if args.models == "all" else [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; expected 'all' or some of {', '.join(MODELS)}")

    load_start = os.getloadavg()
    print(f"[training] building the input: {args.interactions:,} generated events (cached under "
          f"{CACHE_DIR})", flush=True)
    input_path, info = build_input(args.interactions, seed=args.seed, users=args.users, items=args.items,
                                   categories=args.categories)
    print(f"[training] input: {info['interactions']:,} interactions, {info['users']:,} users, "
          f"{info['items']:,} items", flush=True)
    result = BenchResult(
        name="training",
        title=f"Training: one fit per model on {info['interactions']:,} interactions "
              f"(wall s, peak RSS MB of a fresh process)",
        targets={"training": "no numeric goal in DESIGN.md; same-run references for scale"},
    )
    ours: dict[str, dict[str, Any]] = {}
    refs: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        mine = _run_child(kind, input_path, reference=False, timeout=args.timeout)
        ours[kind] = mine
        ref: dict[str, Any] = {}
        if not args.no_peer and kind in REFERENCES:
            ref = _run_child(kind, input_path, reference=True, timeout=args.timeout)
            refs[kind] = ref
        line = f"[training] {kind}: "
        line += (f"error {mine['error']}" if "error" in mine else
                 f"fit {mine['fit_s']:.2f} s, peak {mine['peak_mb']:.0f} MB (+{mine['fit_extra_mb']:.0f})")
        if ref:
            line += f"; reference ({REFERENCES[kind]}): " + (
                f"error {ref['error']}" if "error" in ref else f"{ref['fit_s']:.2f} s, peak {ref['peak_mb']:.0f} MB")
        print(line, flush=True)
        row: dict[str, Any] = {
            "model": kind,
            "fit_s": mine.get("fit_s"), "cpu_s": mine.get("cpu_s"),
            "peak_mb": mine.get("peak_mb"), "fit_extra_mb": mine.get("fit_extra_mb"),
            "reference": REFERENCES.get(kind, "none installed") if not args.no_peer else "skipped",
            "ref_fit_s": ref.get("fit_s"), "ref_cpu_s": ref.get("cpu_s"), "ref_peak_mb": ref.get("peak_mb"),
        }
        result.rows.append(row)
        if "error" in mine:
            result.notes.append(f"{kind} failed: {mine['error']}")
        if ref.get("error"):
            result.notes.append(f"{kind} reference failed: {ref['error']}")
        if "fit_s" in mine and "fit_s" in ref and mine["fit_s"] > 0:
            result.ratios[f"{kind} fit time: reference / shopstream"] = ref["fit_s"] / mine["fit_s"]
            if mine["cpu_s"] > 0:
                result.ratios[f"{kind} CPU time: reference / shopstream"] = ref["cpu_s"] / mine["cpu_s"]
            result.ratios[f"{kind} peak RSS: reference / shopstream"] = ref["peak_mb"] / mine["peak_mb"]
    components = ("popularity", "popularity_region", "item_knn", "ease", "als")
    if "fit_s" in ours.get("ltr", {}) and all("fit_s" in ours.get(c, {}) for c in components):
        parts = sum(ours[c]["fit_s"] for c in components)
        result.notes.append(
            f"ltr fits its five component models twice; their single fits sum to {parts:.1f} s here, "
            f"so the re-ranker's own share is about {max(ours['ltr']['fit_s'] - 2 * parts, 0):.1f} s.")
    first = next((v for v in ours.values() if "users" in v), {})
    result.notes.append(
        f"input: {info['events']:,} events generated with seed {args.seed} ({args.users:,} users, "
        f"{args.items:,} items, {args.categories} categories), read through the event contract: "
        f"{info['interactions']:,} interactions, {first.get('users', info['users']):,} users x "
        f"{first.get('items', info['items']):,} items, {first.get('nnz', 0):,} non-zero pairs; "
        f"digest {info['digest']}.")
    result.notes.append(
        "fit_s: wall seconds of one fit with default parameters (no tuning); cpu_s: its CPU seconds "
        "(all threads; steadier than wall time on a busy machine); peak_mb: the fitting "
        "process's RSS high-water mark during the fit, input included; fit_extra_mb: peak minus the "
        "RSS before the fit. Ratios above 1 mean shopstream is faster / smaller.")
    result.notes.append(
        f"{os.cpu_count()} CPUs shared with other work; load average at the start "
        f"{', '.join(f'{x:.1f}' for x in load_start)}, at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}. Same-run comparisons only.")
    done = [k for k in kinds if "fit_s" in ours[k]]
    if done:
        path = plot_bars(
            done,
            {"fit wall seconds": {"shopstream": [ours[k]["fit_s"] for k in done],
                                  "reference": [refs.get(k, {}).get("fit_s") for k in done]},
             "peak RSS MB (fresh process, input included)": {
                 "shopstream": [ours[k]["peak_mb"] for k in done],
                 "reference": [refs.get(k, {}).get("peak_mb") for k in done]}},
            args.results_dir / "training_fit.png",
            title=f"Fitting each model on {info['interactions']:,} interactions",
        )
        result.plots.append(str(path))
    return result


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="one fit in this process (used by the benchmark)")
    parser.add_argument("--fit", required=True)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(fit_once(args.fit, args.input, reference=args.reference)), flush=True)
    return 0


if __name__ == "__main__":
    if "--fit" in sys.argv[1:]:
        sys.exit(_child_main(sys.argv[1:]))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    outcome = main(sys.argv[1:])
    path = write_result(outcome, Path(sys.argv[sys.argv.index("--results-dir") + 1])
                        if "--results-dir" in sys.argv else RESULTS_DIR)
    print(outcome.markdown())
    print(f"wrote {path}")
