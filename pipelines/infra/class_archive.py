"""A class-data-sharing archive (JDK AppCDS) of Spark's classes, for every driver JVM.

Why: a Spark driver loads some ten thousand classes from pyspark's 250-odd jars at its
start, each found by looking it up jar by jar. On a loaded machine that is minutes: in a
Real-time run at 2,000 events/s the Parquet sinks' JVM took two minutes to start its
query, class loading (``ZipFile.getEntry``) 27 % of its samples. A dynamic CDS archive
holds those classes parsed and verified, mapped read-only (and shared between the
JVMs running at once): a session and its first queries took 16.4 and 15.9 s with it
against 26.2 and 21.9 s without, alternating on the same machine.

``make setup`` builds it (:func:`build_archive`: a driver started with
``-XX:ArchiveClassesAtExit`` runs a small batch and streaming workload, and the JVM
writes the classes it loaded when it exits); :func:`archive_option` then gives each
driver ``-XX:SharedArchiveFile``. The archive is only valid for the JVM and the jars it
was made with, so it lives in the environment (:func:`archive_dir`) and its file name is
a digest of both (:func:`archive_path`); the JVM checks them again and runs without it,
never fails, should they differ. Classes of the
``spark.jars`` (the Kafka connector, shopstream's jar) and generated code are loaded as
before.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipelines.settings import Settings

__all__ = ["archive_dir", "archive_path", "archive_option", "build_archive", "ClassArchiveError"]

_OPERATOR_CDS = re.compile(r"-XX:(SharedArchiveFile|ArchiveClassesAtExit)=|-Xshare:")
"""JVM options that decide class sharing: when the operator gives one, theirs wins."""


class ClassArchiveError(RuntimeError):
    """The archive could not be built (no JVM, the workload failed, nothing written)."""


def _java() -> Path | None:
    """The ``java`` pyspark's ``spark-class`` starts: ``$JAVA_HOME/bin/java``, else the
    one on ``PATH`` (resolved through its links)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_dir() -> Path:
    """Where this environment's archives live: inside it (``<venv>/var/shopstream``), since
    an archive holds the class path of its pyspark jars, so two checkouts (each its own
    ``.venv``) cannot share one: a JVM given another's prints a warning and loads every
    class again. It goes with the environment it belongs to."""
    return Path(sys.prefix) / "var" / "shopstream"


def archive_path() -> Path | None:
    """The archive of this JVM and these pyspark jars (``None``: no JVM), named by a digest
    of the JVM (its path, and its ``libjvm.so``'s size and time: an upgrade in place) and
    of the jars (their folder and names)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    jars_dir = Path(pyspark.__file__).resolve().parent / "jars"
    libjvm = java.parent.parent / "lib" / "server" / "libjvm.so"
    build = f"{libjvm.stat().st_size} {libjvm.stat().st_mtime_ns}" if libjvm.is_file() else ""
    jars = sorted(p.name for p in jars_dir.glob("*.jar"))
    digest = hashlib.sha256("\n".join([str(java), build, str(jars_dir), *jars]).encode())
    return archive_dir() / f"spark-{pyspark.__version__}-{digest.hexdigest()[:12]}.jsa"


def archive_option(settings: Settings) -> str:
    """``-XX:SharedArchiveFile=...`` when the archive exists and ``spark_class_archive`` is
    on; ``""`` otherwise, or when the operator's JVM options decide class sharing."""
    if not settings.spark_class_archive or _OPERATOR_CDS.search(settings.spark_driver_java_options):
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def build_archive(settings: Settings, *, force: bool = False, timeout_s: float = 900.0) -> Path:
    """Build the archive unless it exists (``force``: again); returns its path.

    The workload runs in a child process (a JVM of its own, started with
    ``-XX:ArchiveClassesAtExit`` on a temporary file), which waits for its JVM to exit,
    the moment the JVM writes the archive; the file is moved in only then, whole, so a
    driver never maps half of one.
    """
    path = archive_path()
    if path is None:
        raise ClassArchiveError("no java found (JAVA_HOME or PATH): Spark cannot start either")
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".building-") as tmp:
        staged = Path(tmp) / path.name
        env = {**settings.child_env(), "SHOPSTREAM_SPARK_CLASS_ARCHIVE": "false",
               "SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS": " ".join(filter(None, (
                   settings.spark_driver_java_options, f"-XX:ArchiveClassesAtExit={staged}",
                   "-Xlog:cds=error,cds+dynamic=error"))),  # its notes on skipped classes
               "SHOPSTREAM_DATA_DIR": str(Path(tmp) / "data")}
        done = subprocess.run([sys.executable, "-m", "pipelines.infra.class_archive", tmp],
                              env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0 or not staged.is_file() or staged.stat().st_size == 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise ClassArchiveError(f"the archive's workload exited {done.returncode} and "
                                    f"wrote {'no' if not staged.is_file() else 'an empty'} "
                                    f"archive: {tail[:600]}")
        os.replace(staged, path)
    for stale in path.parent.glob("spark-*.jsa"):
        if stale != path:
            stale.unlink(missing_ok=True)  # another JVM's or jars' of this environment: stale
    return path


def _workload(workdir: Path) -> None:
    """What a driver does first, so that its classes are in the archive: a session with
    the project's settings, a batch job (JSON, timestamps, an aggregation, Parquet) and a
    stateful streaming query on the RocksDB state store; then the JVM is let go and
    waited for, since it writes the archive as it exits."""
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    from pipelines.spark import spark_session

    spark = spark_session(Settings(), app_name="shopstream-class-archive")
    events = spark.createDataFrame(
        [(f'{{"user_id": "u{i % 7}", "event_time": "2026-01-01T00:00:{i % 60:02d}Z"}}',)
         for i in range(200)], "value string")
    parsed = events.select(F.from_json("value", "user_id string, event_time string").alias("e")).select(
        "e.user_id", F.to_timestamp("e.event_time").alias("event_time"))
    out = str(workdir / "parquet")
    (parsed.groupBy("user_id", F.window("event_time", "1 minute"))
     .agg(F.count("*").alias("n"), F.collect_list("event_time").alias("times"))
     .write.mode("overwrite").parquet(out))
    spark.read.parquet(out).count()
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 100).load()
              .withWatermark("timestamp", "10 seconds")
              .dropDuplicates(["value", "timestamp"])
              .groupBy(F.window("timestamp", "5 seconds")).agg(F.count("*").alias("n"))
              .writeStream.outputMode("update").format("memory").queryName("archive_workload")
              .option("checkpointLocation", str(workdir / "checkpoint"))
              .trigger(processingTime="1 second").start())
    stream.awaitTermination(8)  # a few micro-batches: state written, committed, read back
    stream.stop()
    proc = SparkContext._gateway.proc  # type: ignore[union-attr]
    spark.stop()
    proc.stdin.close()  # the JVM exits on end of input (pyspark's gateway), writing the archive
    if proc.wait(timeout=600) != 0:  # killed or failed while writing it: not to be used
        sys.exit(f"the JVM exited {proc.returncode} while writing the archive")


if __name__ == "__main__":
    _workload(Path(sys.argv[1]))
