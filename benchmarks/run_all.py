"""``make bench``: run every benchmark, then put their latest tables into the README.

Each benchmark module exposes ``main(argv) -> BenchResult``; this writes
``benchmarks/results/<name>.{json,md}`` (plots beside them), gathers every table into
``benchmarks/results/README.md``, and rewrites the project README between the
``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers with the latest table of
each benchmark (those not run this time keep their last result), the date, the machine
(cores, load average at the start) and the commit.

Default sizes (``make bench``): streaming 3,000,000 backlog events, three micro-batches at
the job's cap (and the same for Feast's processor), 40 freshness probes per mode at 1,000 background events/s, and
Real-time Mode also at 500 and 2,000 events/s (where it keeps up on this 2-core machine,
and where its p99 passes 1 s); the micro-batch online pass 30 live batches of 1,000 events
after 24 h of history for 1,000 users (1.44M events), on an empty store and against raw
Redis; the tile feed 200,000 events' role rows (the default shape;
``--shape tiles``: whole tiles), 3 runs against 3 of a plain consumer writing them raw; serving
10,000 users, 20,000 in-process calls, 10 s of HTTP at 1,000 requests/s per server;
training 1,000,000 generated interactions, every model and its reference.
``--smoke`` runs each at a tiny size (seconds, for CI): the figures mean nothing, only
that every part runs end to end against the real components.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, describe_meta, machine_meta, read_result, write_result

__all__ = ["BENCHMARKS", "DEFAULT_ARGS", "SMOKE_ARGS", "START", "END", "render_block", "rewrite_readme",
           "previous_tables", "main"]

BENCHMARKS = ("streaming_throughput", "history_pass", "serving_latency", "training", "tile_feed",
              "realtime_query")
README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"

SMOKE_ARGS: dict[str, list[str]] = {
    "streaming_throughput": ["--events", "2000", "--cold-events", "500", "--probes", "2",
                             "--warmup", "2", "--rate", "50", "--drains", "2",
                             "--peer-timeout", "600"],
    "history_pass": ["--users", "50", "--hours", "2", "--live", "7", "--events", "100"],
    "tile_feed": ["--events", "3000", "--batch", "1000", "--repeats", "1", "--top-keys", "2000",
                  "--top-changes", "5"],
    "realtime_query": ["--rate", "200", "--repeats", "1", "--warmup", "20", "--window", "5"],
    "serving_latency": ["--users", "200", "--calls", "300", "--closed", "100", "--seconds", "1",
                        "--rate", "100"],
    "training": ["--interactions", "20000", "--models", "popularity,popularity_region,item_knn,ease,als"],
}
"""Tiny sizes per benchmark for ``--smoke`` (CI): every path runs, the figures mean nothing."""

DEFAULT_ARGS: dict[str, list[str]] = {
    "streaming_throughput": ["--realtime-rates", "500,2000"],
}
"""Extra arguments at the default sizes (``make bench``): Real-time Mode at a rate below
and above the default 1,000 events/s, so the rows show where it stops keeping p99 under
1 s on 2 cores (since its Parquet query triggers every 10 s, past 1,000 events/s on a
good day; on a slow day it did not catch up at 500)."""


# --------------------------------------------------------------------------- README (pure)
def render_block(tables: Sequence[str], *, meta: Mapping[str, Any], command: str = "make bench") -> str:
    """The text between the markers: how the figures were taken, then each table."""
    load = meta.get("load_average") or []
    head = (
        f"_Latest `{command}`: {meta.get('when', '?')}, {meta.get('cores', '?')} cores "
        f"(load average at the start {', '.join(f'{x:.2f}' for x in load) or '?'}), "
        f"commit {meta.get('commit') or '?'}. Figures from a shared machine are noisy: "
        "read the same-run ratios, not the absolute values._"
    )
    body = [t.strip() for t in tables if t.strip()]
    return "\n\n".join([head, *body]) if body else head + "\n\nNo benchmark results yet."


def rewrite_readme(text: str, block: str) -> str:
    """``text`` with everything between the bench markers replaced by ``block``.

    Everything outside the markers is kept byte for byte; rewriting twice with the
    same block gives the same text. Raises ``ValueError`` unless each marker occurs
    exactly once, start before end.
    """
    starts, ends = text.count(START), text.count(END)
    if starts != 1 or ends != 1:
        raise ValueError(f"README must hold {START} and {END} once each (found {starts} and {ends})")
    head, rest = text.split(START, 1)
    if END not in rest:
        raise ValueError(f"{END} comes before {START} in the README")
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block.strip()}\n{END}{tail}"


SECTION_HEADINGS = {"streaming_throughput": "### Streaming",
                    "history_pass": "### Micro-batch online pass after",
                    "tile_feed": "### Real-time tile feed",
                    "realtime_query": "### Real-time query",
                    "serving_latency": "### Serving", "training": "### Training"}
"""How each benchmark's table starts in the README block (its result's title)."""


def previous_tables(text: str) -> dict[str, str]:
    """The table of each benchmark in the README's current block, by benchmark name.

    Why: results live under ``benchmarks/results/`` (not in git), so on a new checkout
    running one benchmark has no file for the others; their tables are kept as the
    README shows them (each with its own date and commit line) instead of being lost.
    """
    if text.count(START) != 1 or text.count(END) != 1:
        return {}
    block = text.split(START, 1)[1].split(END, 1)[0]
    found: dict[str, str] = {}
    for section in re.split(r"(?m)^(?=### )", block):
        for name, heading in SECTION_HEADINGS.items():
            if section.startswith(heading):
                found[name] = section.strip()
    return found


def _tables(results_dir: Path, previous: Mapping[str, str] | None = None) -> list[str]:
    """The latest table of each known benchmark (README form: no image links), in order;
    one without a result file keeps its table from ``previous`` (:func:`previous_tables`)."""
    tables = []
    for name in BENCHMARKS:
        path = results_dir / f"{name}.json"
        if not path.exists():
            tables.append((previous or {}).get(name) or f"### {name}\n\nNot run yet.")
            continue
        result, meta = read_result(path)
        tables.append(result.markdown(plots=False).strip() + f"\n\n_{describe_meta(meta)}_")
    return tables


# --------------------------------------------------------------------------- runner
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS),
                        help=f"benchmarks to run (default all: {', '.join(BENCHMARKS)})")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for CI (figures mean nothing)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where results go")
    parser.add_argument("--readme", type=Path, default=README, help="README to rewrite between the markers")
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; expected some of {', '.join(BENCHMARKS)}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    meta = machine_meta()  # load average at the start, before our own work adds to it
    previous = (previous_tables(args.readme.read_text())
                if not args.no_readme and args.readme.exists() else {})
    failed = []
    for name in args.names:
        module = importlib.import_module(f"benchmarks.{name}")
        extra = SMOKE_ARGS if args.smoke else DEFAULT_ARGS
        bench_args = [*extra.get(name, []), "--results-dir", str(args.results_dir)]
        print(f"== benchmark: {name} {' '.join(bench_args)}", flush=True)
        started = time.monotonic()
        try:
            result = module.main(bench_args)
        except Exception as exc:  # noqa: BLE001 - report and continue with the others
            logging.exception("benchmark %s failed", name)
            failed.append(f"{name}: {exc}")
            continue
        print(f"   wrote {write_result(result, args.results_dir)} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    tables = _tables(args.results_dir, previous)
    (args.results_dir).mkdir(parents=True, exist_ok=True)
    (args.results_dir / "README.md").write_text(
        "# Benchmark results\n\n" + render_block(tables, meta=meta) + "\n")
    if not args.no_readme:
        try:
            args.readme.write_text(rewrite_readme(args.readme.read_text(), render_block(tables, meta=meta)))
            print(f"   updated {args.readme} between the bench markers", flush=True)
        except (OSError, ValueError) as exc:
            print(f"README not updated: {exc}", file=sys.stderr)
    for failure in failed:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
