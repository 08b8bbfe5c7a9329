"""Replaying a real data set: the column mapping, the Online Retail preset, order and verdicts."""

from __future__ import annotations

import collections
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pandas as pd
import pytest
from rich.console import Console

from features.events import Event, validate_event
from pipelines.cli import UserError
from pipelines.producer import ProduceReport, read_records
from pipelines.replay import Source, load_table, parse_mapping, plan_replay, preset_path, run_replay
from pipelines.settings import Settings

RETAIL_ROWS = 70_051


def _quiet() -> Console:
    return Console(quiet=True)


# ------------------------------------------------------------------ mapping
def test_parse_mapping_columns_and_constants() -> None:
    mapping = parse_mapping(["user_id=CustomerID", "event_type==purchase", "item_id=a=b", "region== UK"])
    assert mapping["user_id"] == Source(column="CustomerID")
    assert mapping["event_type"] == Source(constant="purchase")
    assert mapping["item_id"] == Source(column="a=b")  # only the first '=' separates
    assert mapping["region"] == Source(constant=" UK")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("user_id", "expected FIELD=COLUMN or FIELD==CONSTANT"),
        ("=CustomerID", "expected FIELD=COLUMN or FIELD==CONSTANT"),
        ("customer=CustomerID", "unknown field 'customer'"),
        ("price==", "empty constant for price"),
        ("price=", "empty column name for price"),
    ],
)
def test_parse_mapping_errors_name_the_option(item: str, message: str) -> None:
    with pytest.raises(UserError) as info:
        parse_mapping([item])
    assert message in str(info.value) and str(info.value).startswith(f"--map {item!r}")


def test_parse_mapping_field_twice() -> None:
    with pytest.raises(UserError, match="'user_id' is mapped twice"):
        parse_mapping(["user_id=A", "user_id=B"])


def _small_csv(tmp_path: Path) -> Path:
    path = tmp_path / "clicks.csv"
    path.write_text(
        "sid;uid;item;cat;country;when;amount;qty;eid\n"
        "s1;u1;i1;c1;UK;2024-06-01 12:00:02;9.5;1;e1\n"
        "s1;u1;i2;c1;UK;2024-06-01 12:00:00;1.25;2;e2\n"   # earlier: goes first
        "s2;u2;i3;c2;FR;2024-06-01 12:00:02;abc;1;e3\n"    # same time as e1: keeps file order
        "s2;u2;i4;c2;FR;soon;3.0;1;e4\n"                   # unparseable time: stays after e3
        "s3;u3;i5;c3;DE;1717243203000;;1;e5\n"             # epoch millis; no price
        "s3;u3;i6;c3;DE;2024-06-01T12:00:04Z;2.0;1.5;e1\n"  # fractional quantity; id of row 1
        "s4;u4;i7;c4;DE;2024-06-01T12:00:05Z;2.0;3;e1\n"    # valid, but e1 again
    )
    return path


SMALL_MAP = ["session_id=sid", "user_id=uid", "item_id=item", "category_id=cat", "region=country",
             "event_time=when", "price=amount", "quantity=qty", "event_id=eid", "event_type==purchase"]


def test_plan_replay_generic_mapping(tmp_path: Path) -> None:
    path = _small_csv(tmp_path)
    plan = plan_replay(load_table(path), path, overrides=parse_mapping(SMALL_MAP))
    docs = [orjson.loads(v) for v in plan.values]
    assert [d["event_id"] for d in docs] == ["e2", "e1", "e3", "e4", "e5", "e1", "e1"]
    assert docs[0]["event_time"] == "2024-06-01T12:00:00.000Z" and docs[0]["price"] == 1.25
    assert docs[0]["quantity"] == 2 and docs[4]["event_time"] == "2024-06-01T12:00:03.000Z"
    assert plan.labels == [
        None,
        None,
        "wrong_type:price",
        "invalid_timestamp:event_time",
        "missing_price:price",
        "invalid_quantity:quantity",
        "duplicate",
    ]
    assert plan.keys[0] == b"u1" and plan.rows_read == 7


def test_plan_replay_limit_keeps_the_earliest(tmp_path: Path) -> None:
    path = _small_csv(tmp_path)
    plan = plan_replay(load_table(path), path, overrides=parse_mapping(SMALL_MAP), limit=2)
    assert [orjson.loads(v)["event_id"] for v in plan.values] == ["e2", "e1"]


def test_plan_replay_missing_column_names_it(tmp_path: Path) -> None:
    path = _small_csv(tmp_path)
    mapping = parse_mapping([m if not m.startswith("region") else "region=Country" for m in SMALL_MAP])
    with pytest.raises(UserError, match=r"--map region=Country: no column 'Country' in clicks.csv \(columns: sid"):
        plan_replay(load_table(path), path, overrides=mapping)


def test_plan_replay_unmapped_required_field_names_it(tmp_path: Path) -> None:
    path = _small_csv(tmp_path)
    mapping = parse_mapping([m for m in SMALL_MAP if not m.startswith("category_id")])
    with pytest.raises(UserError, match="no mapping for category_id: add --map category_id=COLUMN"):
        plan_replay(load_table(path), path, overrides=mapping)


def test_plan_replay_default_event_id_and_optional_fields(tmp_path: Path) -> None:
    path = _small_csv(tmp_path)
    mapping = parse_mapping([m for m in SMALL_MAP if not m.startswith(("event_id", "quantity", "price"))])
    plan = plan_replay(load_table(path), path, overrides=mapping)
    docs = [orjson.loads(v) for v in plan.values]
    ids = [d["event_id"] for d in docs]
    assert len(set(ids)) == 7 and ids[0].endswith("-2")  # the second row of the file came first
    assert all("price" not in d and "quantity" not in d for d in docs)


def test_plan_replay_parquet_types(tmp_path: Path) -> None:
    path = tmp_path / "orders.parquet"
    pd.DataFrame({
        "customer": [17850.0, None],
        "when": pd.to_datetime(["2011-01-02 10:00", "2011-01-01 09:00"]),
        "price": [2.55, 3.0],
        "qty": [6, 1],
    }).to_parquet(path)
    mapping = parse_mapping(["user_id=customer", "event_time=when", "price=price", "quantity=qty",
                             "session_id==s", "item_id==i", "category_id==c", "region==UK",
                             "event_type==purchase"])
    plan = plan_replay(load_table(path), path, overrides=mapping)
    docs = [orjson.loads(v) for v in plan.values]
    assert docs[0]["event_time"] == "2011-01-01T09:00:00.000Z" and "user_id" not in docs[0]
    assert docs[1]["user_id"] == "17850" and docs[1]["quantity"] == 6 and docs[1]["price"] == 2.55
    assert plan.labels == ["missing_field:user_id", None]


def test_load_table_rejects_other_formats(tmp_path: Path) -> None:
    (tmp_path / "data.xlsx").write_bytes(b"x")
    with pytest.raises(UserError, match="expected a .csv or .parquet file"):
        load_table(tmp_path / "data.xlsx")
    with pytest.raises(UserError, match="no such file"):
        load_table(tmp_path / "missing.csv")


def test_run_replay_names_a_missing_or_unreadable_file_before_the_mapping(
        settings: Settings, tmp_path: Path) -> None:
    """A mistyped path, with no --map given, was reported as "no mapping for event_type"."""
    with pytest.raises(UserError, match=f"^no such file: {tmp_path / 'typo.csv'}$"):
        run_replay(settings, path=tmp_path / "typo.csv", output=tmp_path / "o.jsonl", console=_quiet())
    (tmp_path / "notes.md").write_text("# not a table\n")
    with pytest.raises(UserError, match=r"notes\.md: expected a \.csv or \.parquet file, not \.md$"):
        run_replay(settings, path=tmp_path / "notes.md", output=tmp_path / "o.jsonl", console=_quiet())
    assert not (tmp_path / "o.jsonl").exists()


def test_run_replay_preset_missing_column(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "retail.csv"
    path.write_text("InvoiceNo,StockCode,Quantity,InvoiceDate,UnitPrice,Country\n1,A,1,2011-01-01 10:00,1.0,UK\n")
    with pytest.raises(UserError, match="preset online-retail: column 'CustomerID' is missing from retail.csv"):
        run_replay(settings, path=path, preset="online-retail", output=tmp_path / "o.jsonl", console=_quiet())


def test_run_replay_speedup_paces_event_time(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "paced.csv"
    rows = [f"s{i},u{i},i{i},c,UK,2024-06-01T12:00:0{i}Z" for i in range(3)]  # 2 s of event time
    path.write_text("sid,uid,item,cat,country,when\n" + "\n".join(rows) + "\n")
    mapping = ["session_id=sid", "user_id=uid", "item_id=item", "category_id=cat", "region=country",
               "event_time=when", "event_type==view"]
    report = run_replay(settings, path=path, mapping=mapping, speedup=4.0,
                        output=tmp_path / "o.jsonl", console=_quiet())
    assert report.sent == 3 and report.elapsed_s >= 0.45  # 2 s / 4 = 0.5 s between first and last


# ------------------------------------------------------------------ the Online Retail preset
@pytest.fixture(scope="module")
def retail(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[ProduceReport, Path, str]:
    out = tmp_path_factory.mktemp("replay") / "retail.jsonl"
    buffer = io.StringIO()
    report = run_replay(settings, preset="online-retail", output=out,
                        console=Console(file=buffer, width=120))
    return report, out, buffer.getvalue()


def test_replay_preset_reads_and_sends_every_row(retail: tuple[ProduceReport, Path, str]) -> None:
    report, out, summary = retail
    assert report.details["rows read"] == RETAIL_ROWS
    assert report.sent == RETAIL_ROWS and report.failed == 0
    assert sum(1 for _ in read_records(out)) == RETAIL_ROWS
    assert "70,051" in summary and "invalid_quantity:quantity" in summary


def test_replay_preset_reject_counts_by_reason(retail: tuple[ProduceReport, Path, str]) -> None:
    report, _, _ = retail
    # 1,175 cancellations and 112 stock adjustments have a negative quantity; price 0 is valid.
    assert dict(report.rejected) == {"invalid_quantity:quantity": 1287}
    assert report.valid == RETAIL_ROWS - 1287 and report.duplicates == 0


def test_replay_preset_event_time_order_and_values(
    retail: tuple[ProduceReport, Path, str], settings: Settings
) -> None:
    _, out, _ = retail
    raw = pd.read_csv(preset_path(settings, "online-retail"), dtype=str, keep_default_na=False)
    previous: tuple[str, int] = ("", 0)
    guests = 0
    for key, value in read_records(out):
        doc = orjson.loads(value)
        invoice, stock = doc["session_id"], doc["item_id"]
        row = int(doc["event_id"].rsplit("-", 1)[1])
        assert doc["event_id"] == f"{invoice}-{stock}-{row}"
        source = raw.iloc[row - 1]
        assert (source.InvoiceNo, source.StockCode) == (invoice, stock)
        assert (doc["event_time"], row) > previous, "not in stable event-time order"
        previous = (doc["event_time"], row)
        assert doc["event_type"] == "purchase"
        assert doc["category_id"] == stock[:2] and doc["region"] == source.Country
        assert key == doc["user_id"].encode()
        if source.CustomerID == "":
            assert doc["user_id"] == f"guest-{invoice}"
            guests += 1
        else:
            assert doc["user_id"] == source.CustomerID and "." not in doc["user_id"]
    assert guests == 27_275


def test_replay_preset_verdicts_use_the_rows_own_time(retail: tuple[ProduceReport, Path, str]) -> None:
    _, out, _ = retail
    records = list(read_records(out))
    first = orjson.loads(records[0][1])
    assert first["event_time"] == "2010-12-01T08:26:00.000Z"
    verdict = validate_event(records[0][1], now=datetime(2010, 12, 1, 8, 27, tzinfo=UTC))
    assert isinstance(verdict, Event)
    later = validate_event(records[-1][1], now=datetime(2010, 12, 1, 8, 27, tzinfo=UTC) + timedelta(minutes=1))
    assert str(later) == "future_timestamp:event_time"  # which is why each row is judged at its own time
    cancellations = [orjson.loads(v) for _, v in records if orjson.loads(v)["session_id"].startswith("C")]
    assert len(cancellations) == 1175 and all(c["quantity"] < 0 for c in cancellations)


def test_replay_preset_counts_match_the_data_readme(settings: Settings) -> None:
    raw = pd.read_csv(preset_path(settings, "online-retail"), dtype=str, keep_default_na=False)
    assert len(raw) == RETAIL_ROWS
    assert collections.Counter(raw.InvoiceNo.str.startswith("C"))[True] == 1175
