"""Training data: interactions read from the offline store (or any table), matrices, splits.

A training run reads raw validated events for a time range from the offline store
(``<offline>/events``, hive-partitioned by ``event_date``/``event_hour``) with
pyarrow, or any interactions table given with ``--events`` (CSV, Parquet or JSON
lines with a user, an item, a time and an event type or a weight). Either way it
ends as one :class:`Interactions` frame plus a :class:`DataSource` that says
exactly what was read (paths, time range, row counts, a content digest), which the
CLI logs to MLflow as a dataset.

Everything below the readers is pure: weights per event type, the user x item
matrix, the time-based split (train on the past, test on the following period)
and the per-user random split, each returning index maps that the models and the
evaluation share.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

__all__ = [
    "EVENT_TYPES",
    "INTERACTION_COLUMNS",
    "DataSource",
    "Interactions",
    "TrainingData",
    "Split",
    "read_offline_events",
    "read_interactions_file",
    "interactions_from_events",
    "content_digest",
    "make_training_data",
    "time_split",
    "user_random_split",
    "make_split",
    "validation_split",
]

_log = logging.getLogger(__name__)

EVENT_TYPES: tuple[str, ...] = ("view", "add_to_cart", "purchase")
INTERACTION_COLUMNS: tuple[str, ...] = ("user_id", "item_id", "event_time", "event_type", "weight", "region")
_EVENT_COLUMNS = ["user_id", "item_id", "event_time", "event_type", "region", "category_id"]

# Column aliases accepted by --events, first match wins (lower-cased comparison).
_ALIASES: dict[str, tuple[str, ...]] = {
    "user_id": ("user_id", "user", "userid", "customerid", "customer_id", "visitorid"),
    "item_id": ("item_id", "item", "itemid", "stockcode", "product_id", "productid", "sku"),
    "event_time": ("event_time", "timestamp", "time", "ts", "invoicedate", "eventdate", "datetime", "date"),
    "event_type": ("event_type", "event", "type", "action"),
    "weight": ("weight", "rating", "value"),
    "region": ("region", "country"),
    "quantity": ("quantity", "qty"),
    "invoice": ("invoiceno", "invoice", "invoice_no"),
    "category_id": ("category_id", "category", "categoryid"),
}


@dataclass(frozen=True)
class DataSource:
    """What a run read, so it can be reproduced (logged to MLflow as the dataset's source).

    Attributes
    ----------
    uri:
        The offline store's events folder or the ``--events`` file.
    kind:
        ``offline-store`` or ``file``.
    since, until:
        The requested half-open time range ``[since, until)`` (ISO-8601 UTC), if any.
    files:
        The Parquet/CSV files actually read (partition pruning applied).
    rows_read:
        Rows read before cleaning; ``rows_dropped`` says how many were unusable and why.
    digest:
        sha256 (16 hex) of the cleaned interactions' content, order-independent.
    """

    uri: str
    kind: str
    since: str | None = None
    until: str | None = None
    files: tuple[str, ...] = ()
    rows_read: int = 0
    rows_dropped: Mapping[str, int] = field(default_factory=dict)
    digest: str = ""

    def describe(self) -> dict[str, Any]:
        """A flat, JSON-able summary (used for MLflow params and dataset tags)."""
        return {
            "uri": self.uri,
            "kind": self.kind,
            "since": self.since or "",
            "until": self.until or "",
            "files": len(self.files),
            "rows_read": self.rows_read,
            "rows_dropped": sum(self.rows_dropped.values()),
            "digest": self.digest,
        }


@dataclass(frozen=True)
class Interactions:
    """Cleaned interactions: one row per event (``INTERACTION_COLUMNS``), sorted by time."""

    frame: pd.DataFrame
    source: DataSource

    @property
    def rows(self) -> int:
        return len(self.frame)

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp]:
        times = self.frame["event_time"]
        return times.min(), times.max()


# --------------------------------------------------------------------------- readers
def _utc(value: str | pd.Timestamp | None) -> pd.Timestamp | None:
    if value is None:
        return None
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def read_offline_events(
    events_path: str,
    since: str | pd.Timestamp | None = None,
    until: str | pd.Timestamp | None = None,
    *,
    weights: Mapping[str, float],
) -> Interactions:
    """Read raw events in ``[since, until)`` from the offline store's Parquet folder.

    Partitions outside the range are pruned by ``event_date`` before any file is
    opened; the exact bound is then applied on ``event_time``. Only the columns the
    models need are read.

    Parameters
    ----------
    events_path:
        ``<offline>/events`` (local path; other filesystems through pyarrow's URI support).
    since, until:
        Half-open time range in UTC (naive values are taken as UTC); ``None`` is open.
    weights:
        Implicit weight per event type (see :func:`interactions_from_events`).
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    start, end = _utc(since), _utc(until)
    partitioning = ds.partitioning(
        pa.schema([("event_date", pa.string()), ("event_hour", pa.string())]), flavor="hive"
    )
    dataset = ds.dataset(events_path, format="parquet", partitioning=partitioning)
    present = set(dataset.schema.names)
    columns = [c for c in _EVENT_COLUMNS if c in present]
    missing = {"user_id", "item_id", "event_time", "event_type"} - present
    if missing:
        raise ValueError(f"{events_path}: not an events table, missing columns {sorted(missing)}")
    expr = None
    if start is not None:
        expr = ds.field("event_date") >= start.strftime("%Y-%m-%d")
    if end is not None:
        # end is exclusive; the last day that can hold an earlier timestamp:
        last_day = (end - pd.Timedelta(microseconds=1)).strftime("%Y-%m-%d")
        bound = ds.field("event_date") <= last_day
        expr = bound if expr is None else expr & bound
    fragments = list(dataset.get_fragments(filter=expr)) if expr is not None else list(dataset.get_fragments())
    files = tuple(sorted(f.path for f in fragments))
    table = dataset.to_table(columns=columns, filter=expr)
    frame = table.to_pandas()
    rows_read = len(frame)
    frame["event_time"] = pd.to_datetime(frame["event_time"], utc=True)
    in_range = pd.Series(True, index=frame.index)
    if start is not None:
        in_range &= frame["event_time"] >= start
    if end is not None:
        in_range &= frame["event_time"] < end
    frame = frame[in_range]
    cleaned, dropped = interactions_from_events(frame, weights)
    source = DataSource(
        uri=events_path,
        kind="offline-store",
        since=start.isoformat() if start is not None else None,
        until=end.isoformat() if end is not None else None,
        files=files,
        rows_read=rows_read,
        rows_dropped={"outside_time_range": int((~in_range).sum()), **dropped},
        digest=content_digest(cleaned),
    )
    _log.info("read %d events from %d files under %s", rows_read, len(files), events_path)
    return Interactions(cleaned, source)


def _pick(columns: list[str], field_name: str) -> str | None:
    lowered = {c.lower(): c for c in columns}
    for alias in _ALIASES[field_name]:
        if alias in lowered:
            return lowered[alias]
    return None


def read_interactions_file(
    path: str | Path,
    *,
    weights: Mapping[str, float],
    since: str | pd.Timestamp | None = None,
    until: str | pd.Timestamp | None = None,
    default_event_type: str = "purchase",
) -> Interactions:
    """Read any interactions table (CSV, Parquet, JSON lines) into :class:`Interactions`.

    Columns are recognised by name (``user_id``/``user``/``CustomerID``, ``item_id``/
    ``item``/``StockCode``, ``event_time``/``timestamp``/``InvoiceDate``, ``event_type``
    or ``weight``, optional ``region``/``Country`` and ``quantity``), so the Online Retail
    CSV and the generator's JSON lines load without a mapping. Rows with an empty user
    or item, an unreadable time, a quantity below 1 (returns and cancellations) or an
    unknown event type are dropped and counted. A table with neither an event type nor a
    weight column is a transaction log: every row counts as ``default_event_type``.
    Naive times are taken as UTC.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"interactions file not found: {p}")
    suffixes = "".join(p.suffixes).lower()
    if ".parquet" in suffixes or p.is_dir():
        raw = pd.read_parquet(p)
    elif ".json" in suffixes:
        if _is_record_file(p):
            return _read_record_file(p, weights=weights, since=since, until=until)
        import pyarrow.json as pj

        raw = pj.read_json(p).to_pandas()
    else:
        raw = pd.read_csv(p, dtype=str, keep_default_na=False, na_values=[""])
    rows_read = len(raw)
    cols = list(raw.columns)
    picked = {name: _pick(cols, name) for name in _ALIASES}
    missing = [n for n in ("user_id", "item_id", "event_time") if picked[n] is None]
    if missing:
        raise ValueError(
            f"{p}: cannot find column(s) for {missing}; expected e.g. user_id, item_id, "
            f"event_time and event_type or weight (found {cols})"
        )
    frame = pd.DataFrame(
        {
            "user_id": raw[picked["user_id"]],
            "item_id": raw[picked["item_id"]],
            "event_time": raw[picked["event_time"]],
        }
    )
    frame["region"] = raw[picked["region"]] if picked["region"] else "unknown"
    if picked["category_id"]:
        frame["category_id"] = raw[picked["category_id"]]
    dropped: dict[str, int] = {}
    keep = pd.Series(True, index=raw.index)
    if picked["quantity"]:
        # the contract's default quantity is 1: only an explicit value below 1 (a return,
        # a cancellation) drops the row
        qty = pd.to_numeric(raw[picked["quantity"]], errors="coerce")
        bad_qty = qty.notna() & (qty < 1)
        dropped["quantity_below_1"] = int((bad_qty & keep).sum())
        keep &= ~bad_qty
    if picked["invoice"]:
        cancelled = raw[picked["invoice"]].astype(str).str.upper().str.startswith("C")
        dropped["cancelled_invoice"] = int((cancelled & keep).sum())
        keep &= ~cancelled
    if picked["event_type"]:
        frame["event_type"] = raw[picked["event_type"]]
    elif picked["weight"]:
        frame["event_type"] = "weighted"
        frame["weight"] = pd.to_numeric(raw[picked["weight"]], errors="coerce")
    else:
        frame["event_type"] = default_event_type
    frame["event_time"] = _parse_times(frame["event_time"])
    frame = frame[keep]
    start, end = _utc(since), _utc(until)
    outside = pd.Series(False, index=frame.index)
    if start is not None:
        outside |= frame["event_time"] < start
    if end is not None:
        outside |= frame["event_time"] >= end
    dropped["outside_time_range"] = int(outside.sum())
    frame = frame[~outside]
    cleaned, more = interactions_from_events(frame, weights)
    dropped.update(more)
    source = DataSource(
        uri=str(p.resolve()),
        kind="file",
        since=start.isoformat() if start is not None else None,
        until=end.isoformat() if end is not None else None,
        files=(str(p.resolve()),),
        rows_read=rows_read,
        rows_dropped={k: v for k, v in dropped.items() if v},
        digest=content_digest(cleaned),
    )
    _log.info("read %d rows from %s, kept %d", rows_read, p, len(cleaned))
    return Interactions(cleaned, source)


def _is_record_file(path: Path) -> bool:
    """Whether a JSON-lines file holds Kafka records (``{"key", "value": base64}``).

    That is what ``shopstream generate/replay --output`` write: the raw payloads,
    malformed ones included, exactly as they would reach the topic.
    """
    import orjson

    with path.open("rb") as fh:
        first = fh.readline()
    try:
        doc = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and set(doc) == {"key", "value"}


def _read_record_file(
    path: Path, *, weights: Mapping[str, float], since: str | pd.Timestamp | None,
    until: str | pd.Timestamp | None,
) -> Interactions:
    """Raw Kafka records -> the event contract (as the stream applies it) -> interactions.

    Records the contract rejects are counted by reason; duplicates (same ``event_id`` and
    ``event_time``) count once, as in the stream. The "not in the future" rule is checked against the
    newest event time in the file, not the wall clock, so a file can be evaluated
    whenever it was generated.
    """
    import base64

    import orjson

    from features.events import EVENT_IDENTITY, Event, validate_event

    payloads: list[bytes] = []
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                payloads.append(base64.b64decode(orjson.loads(line)["value"]))
    far_future = datetime(9999, 1, 1, tzinfo=UTC)
    events: list[dict[str, object]] = []
    dropped: dict[str, int] = {}
    for payload in payloads:
        result = validate_event(payload, now=far_future)
        if isinstance(result, Event):
            events.append(result.as_dict())
        else:
            reason = f"contract:{result}"
            dropped[reason] = dropped.get(reason, 0) + 1
    frame = pd.DataFrame(events)
    if not frame.empty:
        before = len(frame)
        frame = frame.drop_duplicates(list(EVENT_IDENTITY))
        dropped["duplicate_event_id"] = before - len(frame)
        frame["event_time"] = pd.to_datetime(frame["event_time"], utc=True)
    else:
        frame = pd.DataFrame(columns=["user_id", "item_id", "event_time", "event_type", "region"])
    start, end = _utc(since), _utc(until)
    outside = pd.Series(False, index=frame.index)
    if start is not None:
        outside |= frame["event_time"] < start
    if end is not None:
        outside |= frame["event_time"] >= end
    dropped["outside_time_range"] = int(outside.sum())
    cleaned, more = interactions_from_events(frame[~outside], weights)
    dropped.update(more)
    source = DataSource(
        uri=str(path.resolve()), kind="file",
        since=start.isoformat() if start is not None else None,
        until=end.isoformat() if end is not None else None,
        files=(str(path.resolve()),), rows_read=len(payloads),
        rows_dropped={k: v for k, v in dropped.items() if v}, digest=content_digest(cleaned),
    )
    _log.info("read %d records from %s, kept %d", len(payloads), path, len(cleaned))
    return Interactions(cleaned, source)


def _parse_times(values: pd.Series) -> pd.Series:
    """ISO-8601 strings, datetimes or epoch milliseconds -> UTC timestamps (NaT if unreadable)."""
    if pd.api.types.is_datetime64_any_dtype(values):
        return pd.to_datetime(values, utc=True)
    numeric = pd.to_numeric(values, errors="coerce")
    if numeric.notna().all() and len(values):
        return pd.to_datetime(numeric, unit="ms", utc=True)
    return pd.to_datetime(values, utc=True, errors="coerce", format="mixed")


# --------------------------------------------------------------------------- cleaning
def interactions_from_events(
    events: pd.DataFrame, weights: Mapping[str, float]
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Keep usable rows and give each an implicit weight; count what was dropped.

    Parameters
    ----------
    events:
        Columns ``user_id``, ``item_id``, ``event_time`` (UTC), ``event_type``; optional
        ``weight`` (used for rows whose type is ``weighted``), ``region``, ``category_id``.
    weights:
        Weight per event type, e.g. ``{"view": 1, "add_to_cart": 3, "purchase": 5}``.

    Returns
    -------
    (frame, dropped):
        ``frame`` has :data:`INTERACTION_COLUMNS` (+ ``category_id`` if given), sorted by
        time; ``dropped`` maps a reason to a row count.
    """
    frame = events.copy()
    dropped: dict[str, int] = {}
    for col in ("user_id", "item_id"):
        frame[col] = frame[col].astype("string").str.strip()
    empty = frame["user_id"].isna() | (frame["user_id"] == "") | frame["item_id"].isna() | (frame["item_id"] == "")
    dropped["empty_user_or_item"] = int(empty.sum())
    frame = frame[~empty]
    no_time = frame["event_time"].isna()
    dropped["bad_time"] = int(no_time.sum())
    frame = frame[~no_time]
    types = frame["event_type"].astype("string")
    mapped = types.map(lambda t: weights.get(t, np.nan) if isinstance(t, str) else np.nan).astype(float)
    if "weight" in frame.columns:
        explicit = pd.to_numeric(frame["weight"], errors="coerce")
        mapped = mapped.where(types != "weighted", explicit)
    bad_type = mapped.isna() | (mapped <= 0)
    dropped["unknown_event_type_or_weight"] = int(bad_type.sum())
    frame = frame[~bad_type].assign(weight=mapped[~bad_type].to_numpy())
    if "region" not in frame.columns:
        frame["region"] = "unknown"
    frame["region"] = frame["region"].astype("string").fillna("unknown")
    frame["event_type"] = frame["event_type"].astype("string")
    frame["user_id"] = frame["user_id"].astype(str)
    frame["item_id"] = frame["item_id"].astype(str)
    cols = list(INTERACTION_COLUMNS) + (["category_id"] if "category_id" in frame.columns else [])
    frame = frame[cols].sort_values("event_time", kind="stable").reset_index(drop=True)
    return frame, {k: v for k, v in dropped.items() if v}


def content_digest(frame: pd.DataFrame) -> str:
    """Order-independent sha256 (16 hex) of the interactions' user, item, time, type and weight."""
    if frame.empty:
        return hashlib.sha256(b"").hexdigest()[:16]
    cols = ["user_id", "item_id", "event_time", "event_type", "weight"]
    hashed = pd.util.hash_pandas_object(frame[cols], index=False).to_numpy()
    hashed.sort()
    return hashlib.sha256(hashed.tobytes()).hexdigest()[:16]


# --------------------------------------------------------------------------- matrices
@dataclass(frozen=True)
class TrainingData:
    """Interactions mapped onto fixed user and item index spaces (what models fit on).

    The index maps are fixed by the full training period, so a sub-period
    (:meth:`before`) keeps the same indices: a model fitted on the earlier part scores
    the same columns, which is what the learning-to-rank stage and the validation
    split rely on.

    Attributes
    ----------
    frame:
        Interactions with integer ``user_idx`` and ``item_idx`` columns.
    user_ids, item_ids:
        Index -> external id.
    user_region:
        The most frequent region of each user in the training period (``unknown`` if none).
    """

    frame: pd.DataFrame
    user_ids: np.ndarray
    item_ids: np.ndarray
    user_region: np.ndarray

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @cached_property
    def matrix(self) -> sp.csr_matrix:
        """users x items, ``log1p`` of the summed event weights (float32 CSR)."""
        return interaction_matrix(self.frame, self.n_users, self.n_items)

    @property
    def end_time(self) -> pd.Timestamp:
        return self.frame["event_time"].max()

    def before(self, cutoff: pd.Timestamp) -> TrainingData:
        """The same index spaces, only the interactions strictly before ``cutoff``."""
        return replace(self, frame=self.frame[self.frame["event_time"] < cutoff])

    def restrict(self, mask: np.ndarray | pd.Series) -> TrainingData:
        """The same index spaces, only the rows where ``mask`` is true."""
        return replace(self, frame=self.frame[np.asarray(mask)])

    @cached_property
    def user_index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.user_ids)}

    @cached_property
    def item_index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.item_ids)}


def interaction_matrix(frame: pd.DataFrame, n_users: int, n_items: int) -> sp.csr_matrix:
    """Sum weights per (user, item) and squash with ``log1p`` so that a binge of views
    cannot outweigh a handful of purchases by orders of magnitude."""
    if frame.empty:
        return sp.csr_matrix((n_users, n_items), dtype=np.float32)
    m = sp.coo_matrix(
        (frame["weight"].to_numpy(np.float64), (frame["user_idx"].to_numpy(), frame["item_idx"].to_numpy())),
        shape=(n_users, n_items),
    ).tocsr()
    m.sum_duplicates()
    m.data = np.log1p(m.data)
    return m.astype(np.float32)


def make_training_data(frame: pd.DataFrame) -> TrainingData:
    """Index users and items of a training frame (ids sorted, so indices are reproducible)."""
    user_ids = np.array(sorted(frame["user_id"].unique()), dtype=object)
    item_ids = np.array(sorted(frame["item_id"].unique()), dtype=object)
    u_index = pd.Index(user_ids)
    i_index = pd.Index(item_ids)
    indexed = frame.assign(
        user_idx=u_index.get_indexer(frame["user_id"]).astype(np.int64),
        item_idx=i_index.get_indexer(frame["item_id"]).astype(np.int64),
    )
    if "region" in frame.columns and len(frame):
        top = (
            indexed.groupby(["user_idx", "region"], observed=True).size().rename("n").reset_index()
            .sort_values(["user_idx", "n", "region"], ascending=[True, False, True])
            .drop_duplicates("user_idx")
        )
        region = np.full(len(user_ids), "unknown", dtype=object)
        region[top["user_idx"].to_numpy()] = top["region"].astype(str).to_numpy()
    else:
        region = np.full(len(user_ids), "unknown", dtype=object)
    return TrainingData(indexed.reset_index(drop=True), user_ids, item_ids, region)


# --------------------------------------------------------------------------- splits
@dataclass(frozen=True)
class Split:
    """A train/test split on the train period's index spaces.

    Attributes
    ----------
    train:
        What models fit on.
    test:
        users x items binary CSR of the relevant test items: items the user interacted
        with in the test part, that are in the training catalog and that the user had
        not interacted with in training (re-finding a seen item is not a recommendation).
    test_frame:
        The raw test interactions (all users and items), for dataset logging.
    cutoff:
        Start of the test period (time split) or ``None``.
    kind:
        ``time`` or ``user_random``.
    """

    train: TrainingData
    test: sp.csr_matrix
    test_frame: pd.DataFrame
    cutoff: pd.Timestamp | None
    kind: str

    @property
    def eval_users(self) -> np.ndarray:
        """Users with at least one relevant test item (warm users: known from training)."""
        return np.flatnonzero(np.diff(self.test.indptr) > 0)

    def stats(self) -> dict[str, Any]:
        test_users = self.test_frame["user_id"].nunique()
        return {
            "split": self.kind,
            "cutoff": self.cutoff.isoformat() if self.cutoff is not None else "",
            "train_rows": len(self.train.frame),
            "train_users": self.train.n_users,
            "train_items": self.train.n_items,
            "test_rows": len(self.test_frame),
            "test_users": int(test_users),
            "eval_users": len(self.eval_users),
            "cold_test_users": int(test_users - self.test_frame.loc[
                self.test_frame["user_id"].isin(self.train.user_index), "user_id"].nunique()),
            "test_relevant_pairs": int(self.test.nnz),
        }


def _relevance(train: TrainingData, test_frame: pd.DataFrame) -> sp.csr_matrix:
    u = pd.Index(train.user_ids).get_indexer(test_frame["user_id"])
    i = pd.Index(train.item_ids).get_indexer(test_frame["item_id"])
    known = (u >= 0) & (i >= 0)
    rel = sp.csr_matrix(
        (np.ones(int(known.sum()), dtype=np.float32), (u[known], i[known])),
        shape=(train.n_users, train.n_items),
    )
    rel.sum_duplicates()
    rel.data[:] = 1.0
    seen = train.matrix.copy()
    seen.data[:] = 1.0
    rel = rel - rel.multiply(seen)
    rel.eliminate_zeros()
    return rel.tocsr()


def time_split(
    frame: pd.DataFrame, *, test_fraction: float = 0.2, test_days: float | None = None
) -> Split:
    """Train on the past, test on the following period.

    The cutoff is ``max(event_time) - test_days`` when given, else the time before
    which ``1 - test_fraction`` of the interactions fall. Everything strictly before
    the cutoff trains; the rest tests.
    """
    if frame.empty:
        raise ValueError("no interactions to split")
    times = frame["event_time"]
    if test_days is not None:
        cutoff = times.max() - pd.Timedelta(days=test_days)
    else:
        cutoff = times.sort_values(kind="stable").iloc[int(len(times) * (1.0 - test_fraction))]
    is_train = (times < cutoff).to_numpy()
    if not is_train.any() or is_train.all():
        raise ValueError(f"time split at {cutoff} leaves an empty train or test part")
    train = make_training_data(frame[is_train])
    test_frame = frame[~is_train]
    return Split(train, _relevance(train, test_frame), test_frame, cutoff, "time")


def user_random_split(frame: pd.DataFrame, *, test_fraction: float = 0.2, seed: int = 42) -> Split:
    """Hold out a random share of each user's distinct items (users with 2+ items).

    Every interaction with a held-out (user, item) pair goes to the test part, so the
    pair is genuinely unseen in training.
    """
    if frame.empty:
        raise ValueError("no interactions to split")
    rng = np.random.default_rng(seed)
    pairs = frame[["user_id", "item_id"]].drop_duplicates()
    pairs = pairs.assign(r=rng.random(len(pairs)))
    pairs["rank"] = pairs.groupby("user_id")["r"].rank(method="first")
    pairs["n"] = pairs.groupby("user_id")["r"].transform("size")
    n_test = np.floor(pairs["n"] * test_fraction).clip(lower=0)
    n_test = np.where((pairs["n"] >= 2) & (n_test == 0), 1, n_test)
    held = pairs[pairs["rank"] <= n_test][["user_id", "item_id"]]
    key = frame["user_id"] + "\x1f" + frame["item_id"]
    held_key = set(held["user_id"] + "\x1f" + held["item_id"])
    is_test = key.isin(held_key).to_numpy()
    train = make_training_data(frame[~is_test])
    test_frame = frame[is_test]
    return Split(train, _relevance(train, test_frame), test_frame, None, "user_random")


def make_split(frame: pd.DataFrame, kind: str, *, test_fraction: float = 0.2,
               test_days: float | None = None, seed: int = 42) -> Split:
    """Dispatch to :func:`time_split` or :func:`user_random_split`."""
    if kind == "time":
        return time_split(frame, test_fraction=test_fraction, test_days=test_days)
    if kind == "user_random":
        return user_random_split(frame, test_fraction=test_fraction, seed=seed)
    raise ValueError(f"unknown split {kind!r}: expected 'time' or 'user_random'")


def validation_split(split: Split, *, test_fraction: float = 0.2, test_days: float | None = None,
                     seed: int = 42) -> Split:
    """Carve a validation split from a split's training part, the same way (never the test part)."""
    frame = split.train.frame[[c for c in split.train.frame.columns if c not in ("user_idx", "item_idx")]]
    return make_split(frame, split.kind, test_fraction=test_fraction, test_days=test_days, seed=seed + 1)
