"""Data lineage: a JSON manifest per batch run, naming exactly what it read and wrote.

A backfill writes ``<data_dir>/lineage/backfill/<run_id>.json``::

    {
      "kind": "backfill", "run_id": "20240101T120000Z-1a2b3c4d", "manifest_version": 1,
      "started_at": "...", "finished_at": "...", "git_commit": "..." | null,
      "parameters": {"since": ..., "until": ..., "step_seconds": ..., "slide_seconds": ..., ...},
      "inputs": {
        "source": "offline_store" | "file", "path": "...", "format": "parquet" | "jsonl" | "csv",
        "time_range": {"since": ..., "until": ...},      # events read (24h before since .. until)
        "files": [{"path": ..., "size": ..., "modified": ..., "sha256": ... | null}, ...],
        "rows": {"read": N, "quarantined": N, "in_range": N, "duplicates": N, "used": N},
        "digest": "xxhash64-sum:<hex>"                     # order-independent, of the events used
      },
      "outputs": {"user_activity": {"path": ..., "rows": N, "created": ..., "as_of": [first, last]}, ...},
      "online": {"user_activity": N, "item_stats": N, "top_lists": N, "item_metadata": N}
    }

A training run that reads the snapshots of this run names the manifest (or its
``run_id`` and ``created``): the snapshot rows of one run share one ``created``
value, so "the rows with ``created <= X``" is an exact, reproducible snapshot
id, and the input digest tells whether the events behind it changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "MANIFEST_VERSION",
    "FileFingerprint",
    "Manifest",
    "new_run_id",
    "manifest_dir",
    "file_fingerprints",
    "dataframe_digest",
    "write_manifest",
    "read_manifest",
    "list_manifests",
]

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1
HASH_LIMIT_BYTES = 256 * 1024 * 1024
"""Files up to this size get a sha256; larger ones are named by size and mtime only."""


@dataclass(frozen=True)
class FileFingerprint:
    path: str
    size: int | None
    modified: str | None
    sha256: str | None


@dataclass
class Manifest:
    """What one batch run read and wrote (serialized as JSON)."""

    kind: str
    run_id: str
    started_at: str
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    online: dict[str, Any] = field(default_factory=dict)
    finished_at: str | None = None
    git_commit: str | None = None
    manifest_version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, datetime):
        return iso(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def iso(ts: datetime) -> str:
    """ISO-8601 UTC with a ``Z``."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"{now.astimezone(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def manifest_dir(settings: Settings, kind: str = "backfill") -> str:
    return settings.data_path("lineage", kind)


def _local(path: str) -> str | None:
    if path.startswith("file:"):
        return path.removeprefix("file://").removeprefix("file:")
    return None if "://" in path else path


def file_fingerprints(paths: Iterable[str], *, hash_limit: int = HASH_LIMIT_BYTES) -> list[FileFingerprint]:
    """Size, mtime and (for local files up to ``hash_limit``) sha256 of each input file."""
    out = []
    for path in sorted(set(paths)):
        local = _local(path)
        if local is None or not os.path.isfile(local):
            out.append(FileFingerprint(path, None, None, None))
            continue
        stat = os.stat(local)
        digest = None
        if stat.st_size <= hash_limit:
            h = hashlib.sha256()
            with open(local, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            digest = h.hexdigest()
        modified = iso(datetime.fromtimestamp(stat.st_mtime, tz=UTC))
        out.append(FileFingerprint(path, stat.st_size, modified, digest))
    return out


def dataframe_digest(df: DataFrame, columns: Iterable[str]) -> tuple[int, str]:
    """``(rows, digest)``: an order-independent digest of the rows (sum of xxhash64 per row).

    Computed by Spark in one pass; equal data gives an equal digest whatever
    the partitioning or file layout.
    """
    from pyspark.sql import functions as F

    cols = list(columns)
    row = df.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("s"),
    ).first()
    assert row is not None  # a global aggregate always has one row
    n = int(row["n"])
    total = int(row["s"] or 0)
    return n, f"xxhash64-sum:{total % (1 << 64):016x}:{n}"


def _git_commit() -> str | None:
    try:
        repo = Path(__file__).resolve().parent.parent
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                                text=True, timeout=5, check=False)
        return result.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_manifest(settings: Settings, manifest: Manifest) -> str:
    """Write the manifest JSON under the data dir; returns its path (or URI)."""
    if manifest.git_commit is None:
        manifest.git_commit = _git_commit()
    name = f"{manifest.run_id}.json"
    directory = manifest_dir(settings, manifest.kind)
    text = manifest.to_json()
    local = _local(directory)
    if local is not None:
        Path(local).mkdir(parents=True, exist_ok=True)
        target = Path(local) / name
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)  # readers never see a half-written manifest
        return str(target)
    from pyarrow import fs

    uri = f"{directory}/{name}".replace("s3a://", "s3://", 1)
    filesystem, path = fs.FileSystem.from_uri(uri)
    with filesystem.open_output_stream(path) as out:
        out.write(text.encode("utf-8"))
    return uri


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A manifest as a dict (local path)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def list_manifests(settings: Settings, kind: str = "backfill") -> list[Path]:
    """Local manifests of a kind, oldest first (run ids sort by start time)."""
    local = _local(manifest_dir(settings, kind))
    if local is None or not os.path.isdir(local):
        return []
    return sorted(Path(local).glob("*.json"))
