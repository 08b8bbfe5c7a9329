"""Pure parts of the stream's state: batch records, tile arithmetic, key layout (no servers)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.stream_state import BatchRecord, SnapshotMark, TileStore, dirty_key, tiles_key


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
