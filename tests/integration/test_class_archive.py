"""Spark's driver JVMs start with the class-data-sharing archive ``make setup`` builds.

A real driver (``spark_session`` in a child process, as the CLI starts one) logs where
each class came from (``-Xlog:class+load``): with the archive Spark's own classes come
from it ("shared objects file (top)", the dynamic archive's layer), without it (the
setting off) from the jars.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.infra.class_archive import build_archive
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

DRIVER = ("from pipelines.settings import Settings\n"
          "from pipelines.spark import spark_session\n"
          "spark = spark_session(Settings(), kafka=False)\n"
          "print(spark.range(1000).selectExpr('id % 7 as k').groupBy('k').count().count())\n")


def _spark_classes(tmp_path: Path, name: str, **env: str) -> tuple[int, int]:
    """(Spark classes loaded from its jars or the archive, of them from the dynamic archive)
    by a driver's JVM; its lambdas and generated classes, defined at run time, are neither."""
    log = tmp_path / f"{name}.log"
    settings = Settings(_env_file=None)
    child = {**settings.child_env(), "SHOPSTREAM_DATA_DIR": str(tmp_path / name), **env,
             "SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS": f"-Xlog:class+load=info:file={log}"}
    done = subprocess.run([sys.executable, "-c", DRIVER], env=child, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("7"), done.stderr[-2000:]
    spark = [line for line in log.read_text().splitlines() if " org.apache.spark." in line
             and ("source: shared objects file" in line or ".jar" in line.rsplit("source: ", 1)[-1])]
    return len(spark), sum("source: shared objects file (top)" in line for line in spark)


def test_a_driver_loads_sparks_classes_from_the_archive(tmp_path: Path) -> None:
    archive = build_archive(Settings(_env_file=None))  # make setup built it; else now (~1.5 min)
    assert archive.is_file() and archive.stat().st_size > 10_000_000

    loaded, shared = _spark_classes(tmp_path, "with")
    assert loaded > 1000 and shared > 0.9 * loaded, (loaded, shared)

    loaded, shared = _spark_classes(tmp_path, "without", SHOPSTREAM_SPARK_CLASS_ARCHIVE="false")
    assert loaded > 1000 and shared == 0, (loaded, shared)
