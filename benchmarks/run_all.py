"""``make bench``: run every benchmark, then gather their tables into results/README.md.

Each benchmark module exposes ``main(argv) -> BenchResult``; the tables also go into the
project README between the ``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from benchmarks.common import RESULTS_DIR, write_result

BENCHMARKS = ("streaming_throughput", "serving_latency")
README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS), help="benchmarks to run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    failed = []
    for name in args.names:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"== benchmark: {name}", flush=True)
        try:
            result = module.main([])
        except Exception as exc:  # noqa: BLE001 - report and continue with the others
            logging.exception("benchmark %s failed", name)
            failed.append(f"{name}: {exc}")
            continue
        print(f"   wrote {write_result(result)}", flush=True)
    tables = [p.read_text() for p in sorted(RESULTS_DIR.glob("*.md")) if p.name != "README.md"]
    summary = "\n".join(tables)
    (RESULTS_DIR / "README.md").write_text("# Benchmark results\n\n" + summary)
    text = README.read_text()
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        README.write_text(f"{head}{START}\n{summary}\n{END}{tail}")
    for failure in failed:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
