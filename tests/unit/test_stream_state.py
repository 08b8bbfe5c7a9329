"""Pure parts of the stream's state: batch records, tile arithmetic, key layout (no servers)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.stream_state import (
    BatchRecord,
    PassConfig,
    SnapshotMark,
    TileStore,
    batch_marker,
    dirty_key,
    merged_already,
    tiles_key,
)


def test_batch_record_round_trips_through_json() -> None:
    mark = SnapshotMark(tile=1_717_243_200, first=1_717_243_140, batch_id=38)
    record = BatchRecord(batch_id=41, clock_us=1_717_243_200_123_456, snapshot=mark)
    assert BatchRecord.from_json(record.to_json()) == record
    assert record.clock == datetime(2024, 6, 1, 12, 0, 0, 123_456, tzinfo=UTC)
    assert BatchRecord(0, None).clock is None
    assert BatchRecord.from_json(BatchRecord(3, None).to_json()) == BatchRecord(3, None)


def test_batch_record_reads_a_record_of_the_previous_format() -> None:
    """A checkpoint written before snapshots had a batch keeps working: no redo is asked."""
    old = '{"batch_id": 7, "clock_us": 1717243200123456, "snapshot_tile": 1717243200}'
    record = BatchRecord.from_json(old)
    assert record.snapshot == SnapshotMark(tile=1_717_243_200, first=None, batch_id=None)


@pytest.mark.parametrize(
    ("ts_us", "tile"),
    [
        (1_717_243_200_000_000, 1_717_243_200),  # on a boundary
        (1_717_243_259_999_999, 1_717_243_200),  # a microsecond before the next one
        (1_717_243_260_000_000, 1_717_243_260),
    ],
)
def test_tile_of_floors_to_the_slide(ts_us: int, tile: int) -> None:
    store = TileStore({}, slide_seconds=60, last_items_n=10, long_window_seconds=86_400,
                      ttl_seconds=3600)
    assert store.tile_of(ts_us) == tile


def test_tile_keys_cannot_escape_their_namespace() -> None:
    assert tiles_key("user", "u1") == "ss:v1:tiles:user:u1"
    assert tiles_key("user", "a:b*") == "ss:v1:tiles:user:a%3Ab%2A"
    assert dirty_key("item", 1_717_243_200) == "ss:v1:stream:dirty:item:1717243200"


def _cfg(batch_id: int, run: str) -> PassConfig:
    store = TileStore({}, slide_seconds=60, last_items_n=10, long_window_seconds=86_400,
                      ttl_seconds=3600)
    return store.config(batch_id, 1_717_243_200_000_000, run=run)


@pytest.mark.parametrize(
    ("stored", "batch_id", "run", "replay"),
    [
        (None, 0, "a1", False),  # a key no batch merged into yet
        (b"a1:7", 7, "a1", True),  # batch 7 again after a crash: its deltas are in
        (b"a1:7", 5, "a1", True),  # an older batch of the same run: in as well
        (b"a1:7", 8, "a1", False),  # the next batch
        (b"a1:900", 0, "b2", False),  # a new checkpoint's first batch: not the old run's 900
        (b"a1:3", 3, "b2", False),  # same batch id, another run
        (b"7", 7, "a1", True),  # a marker written before markers named the run
        (b"7", 8, "a1", False),
    ],
)
def test_a_batch_counts_as_merged_only_for_a_marker_of_its_own_run(
    stored: bytes | None, batch_id: int, run: str, replay: bool,
) -> None:
    """Batch ids restart at 0 on a new checkpoint: a marker of another run must not make
    its batches look like replays (their events would never reach the key's tiles)."""
    assert merged_already(stored, _cfg(batch_id, run)) is replay


def test_a_marker_reads_back_as_its_own_batch() -> None:
    cfg = _cfg(12, "ab12")
    assert batch_marker(cfg) == "ab12:12"
    assert merged_already(batch_marker(cfg).encode(), cfg)
    assert batch_marker(_cfg(12, "")) == "12"


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_pass_pauses_the_cyclic_collector_and_puts_it_back(enabled_before: bool) -> None:
    import gc

    from pipelines.stream_state import _cyclic_gc_paused

    was = gc.isenabled()
    try:
        (gc.enable if enabled_before else gc.disable)()
        with _cyclic_gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled_before
        with pytest.raises(RuntimeError), _cyclic_gc_paused():
            raise RuntimeError("a failed pass")
        assert gc.isenabled() is enabled_before  # a Python worker is reused by the next task
    finally:
        (gc.enable if was else gc.disable)()


def test_the_pass_runs_with_the_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import pipelines.stream_state as ss

    seen: list[bool] = []
    monkeypatch.setattr(ss, "_update", lambda deltas, metadata, cfg: seen.append(gc.isenabled()))
    cfg = TileStore({}, slide_seconds=60, last_items_n=5, long_window_seconds=86_400,
                    ttl_seconds=3600).config(0, 1_717_243_200_000_000)
    assert list(ss.update_batches(iter([]), cfg=cfg)) == []
    assert seen == [False]
    assert gc.isenabled()
