"""The README's benchmark block: rewritten between the markers, nothing else touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import BenchResult
from benchmarks.run_all import (
    BENCHMARKS,
    END,
    START,
    _tables,
    previous_tables,
    render_block,
    rewrite_readme,
)

META = {"when": "2026-11-22T17:00:00+00:00", "cores": 2, "load_average": [0.5, 0.75, 1.0],
        "commit": "abc1234"}

OLD = f"""# project

intro

## Benchmarks

How to run them.

{START}
| old | table |
|---|---|
| 1 | 2 |
{END}

## At scale

the rest, with a trailing space \n"""


def _table(title: str, value: float) -> str:
    result = BenchResult(name="x", title=title, rows=[{"system": "ours", "p99_ms": value}],
                         ratios={"p99: peer / ours": 2.0}, plots=["/abs/x.png"])
    return result.markdown(plots=False)


def test_block_replaced_and_the_rest_kept_byte_for_byte() -> None:
    block = render_block([_table("Streaming", 1.5), _table("Serving", 0.25)], meta=META)
    new = rewrite_readme(OLD, block)
    head, rest = new.split(START)
    inside, tail = rest.split(END)
    assert head == OLD.split(START)[0]
    assert tail == OLD.split(END)[1]
    assert "| old | table |" not in inside
    assert "### Streaming" in inside and "### Serving" in inside
    assert inside.index("### Streaming") < inside.index("### Serving")
    assert "| ours | 1.500 |" in inside and "| ours | 0.250 |" in inside
    assert "2.00×" in inside
    # the date, the machine (cores, load at the start) and the commit
    assert "2026-11-22T17:00:00+00:00" in inside
    assert "2 cores" in inside and "0.50, 0.75, 1.00" in inside
    assert "abc1234" in inside
    # README form: no image links to an untracked folder
    assert "![" not in inside


def test_rewrite_is_idempotent() -> None:
    block = render_block([_table("Training", 3.0)], meta=META)
    once = rewrite_readme(OLD, block)
    assert rewrite_readme(once, block) == once
    assert once.count(START) == 1 and once.count(END) == 1


def test_new_tables_replace_the_previous_ones() -> None:
    first = rewrite_readme(OLD, render_block([_table("Serving", 9.0)], meta=META))
    second = rewrite_readme(first, render_block([_table("Serving", 1.0)], meta=META))
    assert "| ours | 9.000 |" not in second
    assert "| ours | 1.000 |" in second


def test_no_tables_says_so() -> None:
    new = rewrite_readme(OLD, render_block([], meta=META))
    assert "No benchmark results yet." in new


@pytest.mark.parametrize(
    "text",
    [
        "no markers at all\n",
        f"only the start {START}\n",
        f"{END} before {START}\n",
        f"{START} twice {START} {END}\n",
    ],
)
def test_missing_or_misplaced_markers_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bench"):
        rewrite_readme(text, "block")


def test_the_project_readme_has_the_markers_once() -> None:
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text()
    assert rewrite_readme(text, "x").count(START) == 1


def test_table_has_every_rows_columns() -> None:
    result = BenchResult(name="x", title="t", rows=[{"system": "a", "events_per_s": 10.0},
                                                     {"system": "b", "p99_s": 0.5}])
    header = result.markdown().splitlines()[2]
    assert header == "| system | events_per_s | p99_s |"
    assert "| b | None | 0.500 |" in result.markdown()


def test_a_benchmark_without_a_result_file_keeps_its_table(tmp_path: Path) -> None:
    """One benchmark run on a new checkout (results are not in git): the others' tables
    stay as the README shows them, not "Not run yet"."""
    readme = rewrite_readme(OLD, render_block(
        [_table("Streaming: events/s", 5.0) + "\n\n_streaming at abc1234_",
         _table("Serving: one user", 7.0) + "\n\n_serving at abc1234_"], meta=META))
    kept = previous_tables(readme)
    assert set(kept) == {"streaming_throughput", "serving_latency"}
    assert "| ours | 7.000 |" in kept["serving_latency"] and "_serving at abc1234_" in kept["serving_latency"]
    assert "Streaming" not in kept["serving_latency"]
    tables = _tables(tmp_path, kept)  # no result files at all
    assert tables[BENCHMARKS.index("serving_latency")] == kept["serving_latency"]
    assert tables[BENCHMARKS.index("training")] == "### training\n\nNot run yet."
    assert previous_tables("no markers\n") == {}
