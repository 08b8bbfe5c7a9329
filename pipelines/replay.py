"""``shopstream replay``: a real data set into the events topic, in event-time order.

Read (CSV or Parquet) -> map columns to the event contract -> sort by event
time (stable: rows with the same time keep their file order) -> send, as fast
as possible or with the original gaps divided by ``--speedup``.

Mapping
    ``--map FIELD=COLUMN`` takes a contract field from a column,
    ``--map FIELD==CONSTANT`` sets it to one value for every row (e.g.
    ``--map event_type==purchase``). Every required field needs one, except
    ``event_id``, which defaults to ``<file tag>-<row number>``. A preset
    supplies a whole mapping; ``--map`` options override single fields of it.

Values
    An empty cell is no value: the field is left out (required fields are then
    ``missing_field``). Prices and quantities are sent as numbers when they
    parse, else as the text (the contract answers ``wrong_type``). Times are
    parsed and sent as ISO-8601 UTC; a time without an offset is taken as UTC;
    numeric times are epoch millis (epoch seconds when below 1e11). A time that
    does not parse is sent as it is (``invalid_timestamp``) and keeps its place
    after the row before it.

Rows the contract rejects are sent anyway: the stream quarantines them with a
reason. The summary says how many it will reject and why, judged by
:func:`features.events.validate_event` with "now" set to each row's own time
plus one minute, so that historic data is not taken for "future".

Preset ``online-retail`` (``<shared_data_dir>/online_retail_2010-12_2011-01.csv``)
    InvoiceNo -> session_id, StockCode -> item_id, Country -> region,
    InvoiceDate -> event_time (UK local time, which is UTC in December and
    January), UnitPrice -> price, Quantity -> quantity, event_type = purchase.
    CustomerID -> user_id, written without a trailing ``.0``; an empty
    CustomerID is a guest checkout and becomes ``guest-<InvoiceNo>`` so its
    purchases still count. The data set has no categories: category_id is a
    stand-in, the first two characters of the StockCode (codes that start
    alike are related products). event_id is ``<InvoiceNo>-<StockCode>-<row>``,
    with the 1-based row number in the file, so a re-run re-sends the same ids.
    Cancellations (negative quantities) are rejected by the contract as
    ``invalid_quantity``.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from rich.console import Console

from features.events import FIELDS, VALID_COLUMNS, Event, validate_event
from pipelines.cli import UserError
from pipelines.producer import (
    BULK_PROCESSES,
    BULK_THRESHOLD,
    DUPLICATE,
    DeliveryError,
    ProduceReport,
    open_sink,
    produce,
    render_summary,
)
from pipelines.settings import Settings

__all__ = [
    "Source",
    "Preset",
    "PRESETS",
    "parse_mapping",
    "load_table",
    "ReplayPlan",
    "plan_replay",
    "preset_path",
    "run_replay",
]

log = logging.getLogger(__name__)

_KINDS = {spec.name: spec.kind for spec in FIELDS}
_REQUIRED = tuple(spec.name for spec in FIELDS if spec.required and spec.name != "event_id")
VALIDATION_NOW_OFFSET = timedelta(minutes=1)
"""Each row is validated as if it arrived this long after its own event time."""
_SECONDS_BELOW = 1e11
"""Numeric times below this are epoch seconds (1e11 s is the year 5138; 1e11 ms is 1973)."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where a field's value comes from: a column, or one constant for every row."""

    column: str | None = None
    constant: str | None = None

    def describe(self, name: str) -> str:
        return f"{name}={self.column}" if self.column is not None else f"{name}=={self.constant}"


Derivation = Callable[[pd.DataFrame], pd.Series]


@dataclass(frozen=True)
class Preset:
    """A ready mapping for a known data set; ``derived`` fields are computed from several columns."""

    name: str
    file_name: str
    mapping: dict[str, Source]
    derived: dict[str, Derivation] = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    """Columns the preset needs (checked before reading values)."""


def _retail_user(df: pd.DataFrame) -> pd.Series:
    customer = df["CustomerID"].astype(str).str.strip().str.replace(r"\.0+$", "", regex=True)
    return customer.where(customer != "", "guest-" + df["InvoiceNo"].astype(str).str.strip())


def _retail_category(df: pd.DataFrame) -> pd.Series:
    return df["StockCode"].astype(str).str.strip().str[:2]


def _retail_event_id(df: pd.DataFrame) -> pd.Series:
    rows = pd.Series(np.arange(1, len(df) + 1), index=df.index).astype(str)
    return df["InvoiceNo"].astype(str).str.strip() + "-" + df["StockCode"].astype(str).str.strip() + "-" + rows


PRESETS: dict[str, Preset] = {
    "online-retail": Preset(
        name="online-retail",
        file_name="online_retail_2010-12_2011-01.csv",
        mapping={
            "session_id": Source(column="InvoiceNo"),
            "item_id": Source(column="StockCode"),
            "region": Source(column="Country"),
            "event_time": Source(column="InvoiceDate"),
            "price": Source(column="UnitPrice"),
            "quantity": Source(column="Quantity"),
            "event_type": Source(constant="purchase"),
        },
        derived={
            "user_id": _retail_user,
            "category_id": _retail_category,
            "event_id": _retail_event_id,
        },
        columns=("InvoiceNo", "StockCode", "Quantity", "InvoiceDate", "UnitPrice", "CustomerID", "Country"),
    ),
}


def parse_mapping(items: Sequence[str]) -> dict[str, Source]:
    """Parse ``--map`` options; errors name the option and the problem.

    >>> parse_mapping(["user_id=CustomerID", "event_type==purchase"])["event_type"].constant
    'purchase'
    """
    mapping: dict[str, Source] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserError(f"--map {item!r}: expected FIELD=COLUMN or FIELD==CONSTANT")
        if name not in VALID_COLUMNS:
            raise UserError(f"--map {item!r}: unknown field {name!r} (fields: {', '.join(VALID_COLUMNS)})")
        if name in mapping:
            raise UserError(f"--map {item!r}: field {name!r} is mapped twice")
        if rest.startswith("="):
            if not rest[1:]:
                raise UserError(f"--map {item!r}: empty constant for {name}")
            mapping[name] = Source(constant=rest[1:])
        else:
            if not rest:
                raise UserError(f"--map {item!r}: empty column name for {name}")
            mapping[name] = Source(column=rest)
    return mapping


def _sniff_delimiter(path: Path) -> str:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        header = fh.readline()
    counts = {d: header.count(d) for d in (",", ";", "\t", "|")}
    return max(counts, key=lambda d: counts[d]) if any(counts.values()) else ","


_PARQUET = (".parquet", ".pq")
_CSV = (".csv", ".tsv", ".txt")


def check_table_path(path: Path) -> None:
    """A file :func:`load_table` can read, or a :class:`UserError` saying why not: asked
    first, so a mistyped path is not reported as a missing ``--map``."""
    if not path.is_file():
        raise UserError(f"no such file: {path}")
    suffix = path.suffix.lower()
    if suffix not in _PARQUET + _CSV:
        raise UserError(f"{path}: expected a .csv or .parquet file, not {suffix or 'no suffix'}")


def load_table(path: Path) -> pd.DataFrame:
    """Read a CSV (every column as text, delimiter sniffed from the header) or a Parquet file."""
    path = Path(path)
    check_table_path(path)
    if path.suffix.lower() in _PARQUET:
        return pd.read_parquet(path)
    return pd.read_csv(path, dtype=str, keep_default_na=False, sep=_sniff_delimiter(path))


# ------------------------------------------------------------------ columns to values
def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _text_values(col: pd.Series) -> list[Any]:
    """Id and string fields: text; integral floats without ``.0``; blanks -> None."""
    if pd.api.types.is_float_dtype(col.dtype):
        return [None if math.isnan(v) else (str(int(v)) if v.is_integer() else repr(v)) for v in col.tolist()]
    if pd.api.types.is_bool_dtype(col.dtype) or pd.api.types.is_integer_dtype(col.dtype):
        return col.astype(str).tolist()
    return [None if _is_blank(v) else (v if isinstance(v, str) else str(v)) for v in col.tolist()]


def _number_values(col: pd.Series, *, integral: bool) -> list[Any]:
    """Numbers where they parse (ints for integral quantities), the text where not, blanks -> None."""
    raw = col.tolist()
    numbers = pd.to_numeric(col, errors="coerce").tolist()
    out: list[Any] = []
    for text, number in zip(raw, numbers, strict=True):
        if _is_blank(text):
            out.append(None)
        elif isinstance(number, float) and math.isnan(number):
            out.append(text)  # not a number: sent as is, the contract says wrong_type
        elif integral and float(number).is_integer() and abs(number) < 2**63:
            out.append(int(number))
        else:
            out.append(float(number))
    return out


def _iso(ts: pd.Series) -> list[str]:
    return (ts.dt.strftime("%Y-%m-%dT%H:%M:%S.%f").str[:-3] + "Z").tolist()


def _epoch_times(numbers: pd.Series) -> pd.Series:
    """Epoch millis (seconds below :data:`_SECONDS_BELOW`) as UTC times; NaT where not valid."""
    millis = numbers.where(numbers.abs() >= _SECONDS_BELOW, numbers * 1000.0)
    ok = millis.notna() & (millis >= 0) & (millis <= 253_402_300_799_999) & (millis % 1 == 0)
    return pd.to_datetime(millis.where(ok), unit="ms", utc=True)


def _time_values(col: pd.Series) -> tuple[list[Any], np.ndarray]:
    """ISO-8601 UTC strings (raw text where unparseable) and epoch millis (NaN where unparseable)."""
    if pd.api.types.is_datetime64_any_dtype(col.dtype):
        parsed = col.dt.tz_localize("UTC") if col.dt.tz is None else col.dt.tz_convert("UTC")
    elif pd.api.types.is_numeric_dtype(col.dtype):
        parsed = _epoch_times(col.astype(float))
    else:
        text = col.astype(str).str.strip()
        digits = text.str.fullmatch(r"\d+")
        parsed = pd.to_datetime(text.where(~digits, ""), format="ISO8601", utc=True, errors="coerce")
        retry = parsed.isna() & (text != "") & ~digits
        if retry.any():
            parsed[retry] = pd.to_datetime(text[retry], format="mixed", utc=True, errors="coerce")
        if digits.any():
            parsed[digits] = _epoch_times(pd.to_numeric(text[digits], errors="coerce").astype(float))
    ok = parsed.notna()
    epoch = pd.Timestamp(0, tz="UTC")
    filled = parsed.where(ok, epoch)
    iso = _iso(filled)
    raw = col.tolist()
    values = [iso[i] if good else (None if _is_blank(raw[i]) else raw[i]) for i, good in enumerate(ok.tolist())]
    millis = ((filled - epoch) // pd.Timedelta(milliseconds=1)).astype(float).where(ok).to_numpy(dtype=float)
    return values, millis


def _constant_value(name: str, text: str) -> Any:
    kind = _KINDS[name]
    if kind in ("price", "quantity"):
        try:
            number = float(text)
        except ValueError:
            raise UserError(f"--map {name}=={text}: not a number") from None
        return int(number) if kind == "quantity" and number.is_integer() else number
    if kind == "timestamp":
        try:
            parsed = pd.Timestamp(text)
        except ValueError:
            raise UserError(f"--map {name}=={text}: not an ISO-8601 time") from None
        parsed = parsed.tz_localize("UTC") if parsed.tzinfo is None else parsed.tz_convert("UTC")
        return parsed
    return text


# ------------------------------------------------------------------ the plan
@dataclass
class ReplayPlan:
    """Everything to send, already in event-time order, with the contract's verdicts."""

    path: Path
    rows_read: int
    keys: list[bytes | None]
    values: list[bytes]
    labels: list[str | None]
    """``None`` valid, ``"duplicate"`` (valid, event_id seen before), else ``reason[:field]``."""
    times_ms: list[int]
    mapping: dict[str, str]
    """Field -> how it is filled, for the summary."""

    def records(self) -> Iterator[tuple[bytes | None, bytes, str | None, int]]:
        return zip(self.keys, self.values, self.labels, self.times_ms, strict=True)


def _resolve(
    preset: Preset | None, overrides: dict[str, Source]
) -> tuple[dict[str, Source], dict[str, Derivation]]:
    mapping = dict(preset.mapping) if preset else {}
    derived = dict(preset.derived) if preset else {}
    for name, source in overrides.items():
        mapping[name] = source
        derived.pop(name, None)
    for name in _REQUIRED:
        if name not in mapping and name not in derived:
            raise UserError(f"no mapping for {name}: add --map {name}=COLUMN or --map {name}==CONSTANT")
    return mapping, derived


def plan_replay(
    df: pd.DataFrame,
    path: Path,
    *,
    preset: Preset | None = None,
    overrides: dict[str, Source] | None = None,
    limit: int | None = None,
) -> ReplayPlan:
    """Map, sort and serialize the rows of ``df``, and judge each with the contract.

    Parameters
    ----------
    df
        The table as read by :func:`load_table`.
    path
        Its file (for messages and the default event_id tag).
    preset, overrides
        The preset's mapping and the ``--map`` options on top of it.
    limit
        Keep only the first ``limit`` rows in event-time order.
    """
    mapping, derived = _resolve(preset, overrides or {})
    columns = list(df.columns)
    if derived and preset is not None:
        for column in preset.columns:
            if column not in df.columns:
                raise UserError(
                    f"preset {preset.name}: column {column!r} is missing from {path.name} "
                    f"(columns: {', '.join(map(str, columns))})"
                )
    for name, source in mapping.items():
        if source.column is not None and source.column not in df.columns:
            raise UserError(
                f"--map {source.describe(name)}: no column {source.column!r} in {path.name} "
                f"(columns: {', '.join(map(str, columns))})"
            )
    n = len(df)
    values: dict[str, list[Any]] = {}
    times = np.full(n, np.nan)
    for name in VALID_COLUMNS:
        kind = _KINDS[name]
        if name in derived:
            col = derived[name](df)
        elif name in mapping and mapping[name].column is not None:
            col = df[mapping[name].column]
        elif name in mapping:
            constant = _constant_value(name, mapping[name].constant or "")
            col = pd.Series([constant] * n, index=df.index)
        elif name == "event_id":
            tag = hashlib.blake2b(path.name.encode(), digest_size=4).hexdigest()
            col = pd.Series([f"{tag}-{i}" for i in range(1, n + 1)], index=df.index)
        else:
            continue  # optional and unmapped: left out
        if kind == "timestamp":
            values[name], times = _time_values(col)
        elif kind in ("price", "quantity"):
            values[name] = _number_values(col, integral=kind == "quantity")
        else:
            values[name] = _text_values(col)

    # Event-time order; a row whose time does not parse stays after the row before it.
    sort_key = pd.Series(times).ffill().bfill().fillna(0).to_numpy()
    order = np.argsort(sort_key, kind="stable")
    if limit is not None:
        order = order[:limit]

    names = list(values)
    cols = [values[name] for name in names]
    user_col = values.get("user_id")
    wall_now = datetime.now(UTC)
    keys: list[bytes | None] = []
    raw_values: list[bytes] = []
    labels: list[str | None] = []
    seen: set[str] = set()
    dumps = orjson.dumps
    for i in order.tolist():
        doc = {name: col[i] for name, col in zip(names, cols, strict=True) if col[i] is not None}
        value = dumps(doc)
        user = user_col[i] if user_col is not None else None
        keys.append(user.encode() if isinstance(user, str) else None)
        raw_values.append(value)
        t = times[i]
        now = (
            datetime.fromtimestamp(t / 1000.0, UTC) + VALIDATION_NOW_OFFSET
            if not math.isnan(t) else wall_now
        )
        verdict = validate_event(value, now=now)
        if isinstance(verdict, Event):
            labels.append(DUPLICATE if verdict.event_id in seen else None)
            seen.add(verdict.event_id)
        else:
            labels.append(str(verdict))
    described = {name: source.describe(name) for name, source in mapping.items()}
    described.update({name: f"{name} (preset)" for name in derived})
    return ReplayPlan(
        path=path,
        rows_read=n,
        keys=keys,
        values=raw_values,
        labels=labels,
        times_ms=[int(t) for t in sort_key[order]],
        mapping=described,
    )


def _shared_data_dir(settings: Settings) -> Path:
    """The shared data folder; a relative setting that is not found from the working
    directory is taken relative to the project's root (where the default points from)."""
    folder = Path(settings.shared_data_dir).expanduser()
    if folder.is_absolute() or folder.is_dir():
        return folder
    return (Path(__file__).resolve().parents[1] / folder).resolve()


def preset_path(settings: Settings, name: str) -> Path:
    """The data file a preset replays by default (under ``settings.shared_data_dir``)."""
    return _shared_data_dir(settings) / PRESETS[name].file_name


def run_replay(
    settings: Settings,
    *,
    path: Path | None = None,
    preset: str | None = None,
    mapping: Sequence[str] = (),
    speedup: float | None = None,
    limit: int | None = None,
    output: Path | None = None,
    console: Console | None = None,
) -> ProduceReport:
    """Replay a file into the events topic (or ``output``); print progress and a summary.

    Raises
    ------
    UserError
        Unknown preset, missing file or column, a malformed ``--map``, a bad
        ``--speedup``, an unreachable broker, or records not delivered.
    """
    if speedup is not None and not speedup > 0:
        raise UserError(f"--speedup must be greater than 0 (leave it out to replay as fast as possible), got {speedup}")
    chosen: Preset | None = None
    if preset is not None:
        if preset not in PRESETS:
            raise UserError(f"--preset: unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
        chosen = PRESETS[preset]
    overrides = parse_mapping(mapping)
    if path is None:
        if chosen is None:
            raise UserError("give a CSV or Parquet file to replay, or --preset NAME")
        path = preset_path(settings, chosen.name)
        if not path.is_file():
            raise UserError(
                f"preset {chosen.name}: no file {path} (set SHOPSTREAM_SHARED_DATA_DIR to its folder)"
            )
    path = Path(path)
    check_table_path(path)
    _resolve(chosen, overrides)  # a missing field is reported before reading a large file

    log.info("reading %s", path)
    plan = plan_replay(load_table(path), path, preset=chosen, overrides=overrides, limit=limit)
    bulk = output is None and speedup is None and len(plan.values) >= BULK_THRESHOLD
    try:
        sink = open_sink(settings, output, processes=BULK_PROCESSES if bulk else 1)
    except DeliveryError as exc:
        raise UserError(str(exc)) from exc
    details: dict[str, Any] = {"file": str(path), "rows read": plan.rows_read}
    if chosen is not None:
        details["preset"] = chosen.name
    if plan.times_ms:
        details["event time"] = (
            f"{datetime.fromtimestamp(plan.times_ms[0] / 1000, UTC):%Y-%m-%d %H:%M} .. "
            f"{datetime.fromtimestamp(plan.times_ms[-1] / 1000, UTC):%Y-%m-%d %H:%M} UTC"
        )
    details["speed"] = f"{speedup:g}x event time" if speedup else "as fast as possible"
    report = ProduceReport(target=sink.description, details=details)
    produce(plan.records(), sink, report, pace=speedup, total=len(plan.values), description="replay")
    render_summary(report, console or Console(), title="shopstream replay",
                   bad_heading="the contract will reject, by reason")
    if report.failed:
        raise UserError(
            f"{report.failed:,} of {report.sent:,} records were not delivered "
            f"(first error: {report.first_error})"
        )
    return report
