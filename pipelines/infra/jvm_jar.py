"""shopstream's jar: the project's Java classes, compiled here against pyspark's jars.

``jvm/*.java``: ``ContractFields`` reads an event's fields for the validation in one pass
(see its comment and :func:`features.validation.with_verdict`) and ``ValidUtf8`` checks
its bytes; ``EventDedup`` is the
stream's deduplication, whose state expires without being read whole
(:mod:`pipelines.streaming.dedup`); ``TileFold`` folds a micro-batch's role rows into its
tiles (:mod:`pipelines.streaming.tile_fold`). They are compiled with the machine's ``javac`` into
``<cache_dir>/jars/shopstream-jvm-<hash>.jar``; the hash is of the sources and the pyspark
version, so an edit or an upgrade builds a new jar and an unchanged one is found at once.
Without a ``javac`` the jar is not built: the validation then reads the fields with
Spark's own expressions (slower, same verdicts), the tiles are Spark's aggregation (slower,
the same rows), and the stream needs
``SHOPSTREAM_STREAM_DEDUP=spark`` (Spark's own dedup); ``make setup`` installs one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from importlib.resources import files
from pathlib import Path

from pipelines.settings import Settings

__all__ = ["CONTRACT_FIELDS_CLASS", "EVENT_DEDUP_CLASS", "TILE_FOLD_CLASS", "VALID_UTF8_CLASS",
           "shopstream_jar", "session_has_class", "JarBuildError"]

log = logging.getLogger(__name__)

CONTRACT_FIELDS_CLASS = "shopstream.ContractFields"
VALID_UTF8_CLASS = "shopstream.ValidUtf8"
EVENT_DEDUP_CLASS = "shopstream.EventDedup"
TILE_FOLD_CLASS = "shopstream.TileFold"
_SOURCES = "infra/jvm"


class JarBuildError(RuntimeError):
    """``javac`` failed on the project's Java sources."""


def session_has_class(spark: object, name: str) -> bool:
    """Whether the Spark session's JVM has the class ``name`` (one of shopstream's, when its
    jar was built): py4j names a class it cannot find as a package."""
    from functools import reduce

    from py4j.java_gateway import JavaClass

    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    return isinstance(reduce(getattr, name.split("."), jvm), JavaClass)


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _sources() -> dict[str, bytes]:
    """File name -> text of each Java source, in name order."""
    folder = files("pipelines").joinpath(_SOURCES)
    found = {entry.name: entry.read_bytes() for entry in folder.iterdir()
             if entry.name.endswith(".java")}
    return dict(sorted(found.items()))


def _jar_path(cache_dir: Path, sources: dict[str, bytes]) -> Path:
    import pyspark

    digest = hashlib.sha256(pyspark.__version__.encode())
    for name, text in sources.items():
        digest.update(b"\0" + name.encode() + b"\0" + text)
    return cache_dir / "jars" / f"shopstream-jvm-{digest.hexdigest()[:16]}.jar"


def shopstream_jar(settings: Settings) -> Path | None:
    """The jar, built when missing; ``None`` (and a warning) when there is no ``javac``.

    Built in a temporary folder and moved into place, so processes that start at once
    (the Real-time job and its Parquet process) never read half a jar.
    """
    sources = _sources()
    jar = _jar_path(settings.cache_dir, sources)
    if jar.is_file():
        return jar
    javac = _javac()
    if javac is None:
        log.warning("no javac on this machine (install a JDK, e.g. `make setup`): the "
                    "validation reads the events' fields with Spark's own expressions, "
                    "which takes about a third more of its CPU, and the stream runs only "
                    "with SHOPSTREAM_STREAM_DEDUP=spark")
        return None
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        paths = []
        for name, text in sources.items():
            paths.append(Path(tmp, name))
            paths[-1].write_bytes(text)
        classes = Path(tmp, "classes")
        done = subprocess.run(
            [javac, "-nowarn", "--release", "17", "-d", str(classes),
             "-cp", f"{_pyspark_jars()}/*", *map(str, paths)],
            capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JarBuildError(f"javac failed on pipelines/{_SOURCES}:\n{done.stderr.strip()}")
        built = Path(tmp, jar.name)
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        os.replace(built, jar)
    log.info("built %s", jar)
    return jar
