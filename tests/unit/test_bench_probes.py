"""Freshness probe figures: a probe that never came online is slower than the timeout."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.common import BenchResult
from benchmarks.streaming_throughput import probe_summary, warm_rate


def test_all_probes_seen_gives_numbers() -> None:
    out = probe_summary([1.0, 2.0, 3.0], sent=3)
    assert out["seen"] == 3 and out["probes"] == 3
    assert out["p50_s"] == 2.0 and math.isclose(out["p99_s"], 2.98) and out["max_s"] == 3.0


def test_no_probe_seen_is_over_the_timeout_not_nan() -> None:
    out = probe_summary([], sent=5, timeout_s=60)
    assert out["p50_s"] == "> 60" and out["p99_s"] == "> 60" and out["max_s"] == "> 60"


def test_a_few_missed_probes_move_the_tail_only() -> None:
    out = probe_summary([0.5] * 95, sent=100, timeout_s=60)
    assert out["p50_s"] == 0.5
    assert out["p99_s"] == "> 60"


def test_the_table_prints_the_text_as_is() -> None:
    result = BenchResult(name="x", title="x", rows=[{"system": "freshness", **{
        k: v for k, v in probe_summary([], sent=2).items() if k.endswith("_s")}}])
    table = result.markdown()
    assert "> 60" in table and "nan" not in table


def test_warm_rate_leaves_out_the_first_batch_with_events() -> None:
    # an empty batch first (the query's start), a slow first batch, two warm ones
    batches = [(0, 300.0), (200_000, 28_000.0), (150_000, 10_000.0), (50_000, 5_000.0)]
    assert warm_rate(batches) == 200_000 / 15.0


def test_warm_rate_needs_a_second_batch() -> None:
    assert warm_rate([(2_000, 900.0)]) is None
    assert warm_rate([(0, 10.0), (2_000, 900.0), (0, 20.0)]) is None
    assert warm_rate([]) is None


def test_realtime_rates_parse_and_name_a_bad_value() -> None:
    import argparse

    import pytest

    from benchmarks.streaming_throughput import main, rates

    assert rates("300, 500,,700") == [300.0, 500.0, 700.0]
    for bad in ("300,fast", "0", "-5", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a positive number"):
            rates(bad)
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage and the option's name, exit 2
        main(["--realtime-rates", "300,fast"])
    assert exit_info.value.code == 2


def test_the_backlogs_traffic_takes_a_store_size_and_names_a_bad_one(capsys) -> None:
    """--users/--items size the generator's store (default its own); a size or event rate
    that is not positive stops the bench with usage, naming the option."""
    import pytest

    from benchmarks.streaming_throughput import main, traffic

    assert (traffic().users, traffic().items) == (10_000, 2_000)
    big = traffic(1_000_000, 100_000)
    assert (big.users, big.items, big.bad_fraction) == (1_000_000, 100_000, 0.02)
    for option in ("--users", "--items", "--event-rate", "--drains"):
        with pytest.raises(SystemExit) as exit_info:
            main([option, "0"])
        assert exit_info.value.code == 2
        assert f"{option} must be positive" in capsys.readouterr().err


def test_epoch_boundaries_are_counted_from_the_drivers_log(tmp_path: Path) -> None:
    """The boundaries the probes met: the epochs the log reports ended between two reads
    (rich wraps a line's rest, never its start); no log yet counts none."""
    from benchmarks.streaming_throughput import epochs_logged

    log = tmp_path / "driver.log"
    assert epochs_logged(log) == 0
    log.write_text("[01:17:33] INFO     real-time epoch 0: 66,144 rows in 69.6s (running 63.1s;\n"
                   "                    queryPlanning 3.91s)\n"
                   "[01:17:40] INFO     batch 3: 10036 rows in 5.57s\n")
    before = epochs_logged(log)
    with log.open("a") as f:
        f.write("[01:18:36] INFO     real-time epoch 1: 63,324 rows in 62.3s (running 61.0s)\n")
    assert (before, epochs_logged(log) - before) == (1, 1)


def test_the_sustained_rate_leaves_out_the_first_drain() -> None:
    from benchmarks.streaming_throughput import sustained

    drains = [{"events": 1_500_000, "batches": 3, "busy_s": 60.0},
              {"events": 1_500_000, "batches": 3, "busy_s": 30.0},
              {"events": 1_500_000, "batches": 4, "busy_s": 45.0}]
    rate = sustained(drains)
    assert rate is not None
    assert rate["events_per_s"] == 3_000_000 / 75.0
    assert (rate["events"], rate["batches"], rate["drains"]) == (3_000_000, 7, 2)
    assert sustained(drains[:1]) is None
    assert sustained([drains[0], {"events": 0, "batches": 0, "busy_s": 0.0}]) is None


def test_the_sustained_row_names_its_drains() -> None:
    from benchmarks.streaming_throughput import _sustained_row

    one = {"events": 10, "batches": 1, "busy_s": 1.0, "events_per_s": 10.0, "drains": 1}
    assert _sustained_row("x", one)["system"] == (
        "x, sustained: drain 2 of the same backlog, warm driver")
    assert "drains 2-3 of" in _sustained_row("x", {**one, "drains": 2})["system"]
