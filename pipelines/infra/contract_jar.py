"""The contract-fields jar: shopstream's one Java class, compiled here against pyspark's jars.

``jvm/ContractFields.java`` reads an event's fields for the validation in one pass
(see its comment and :func:`features.validation.with_verdict`). It is compiled with the
machine's ``javac`` into ``<cache_dir>/jars/contract-fields-<hash>.jar``; the hash is of
the source and the pyspark version, so an edit or an upgrade builds a new jar and an
unchanged one is found at once. Without a ``javac`` the jar is not built and the
validation reads the fields with Spark's own expressions instead (slower, same
verdicts); ``make setup`` installs one.
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

__all__ = ["CONTRACT_FIELDS_CLASS", "contract_fields_jar", "JarBuildError"]

log = logging.getLogger(__name__)

CONTRACT_FIELDS_CLASS = "shopstream.ContractFields"
_SOURCE = "infra/jvm/ContractFields.java"


class JarBuildError(RuntimeError):
    """``javac`` failed on the contract-fields source."""


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _source() -> bytes:
    return files("pipelines").joinpath(_SOURCE).read_bytes()


def _jar_path(cache_dir: Path, source: bytes) -> Path:
    import pyspark

    digest = hashlib.sha256(source + pyspark.__version__.encode()).hexdigest()[:16]
    return cache_dir / "jars" / f"contract-fields-{digest}.jar"


def contract_fields_jar(settings: Settings) -> Path | None:
    """The jar, built when missing; ``None`` (and a warning) when there is no ``javac``.

    Built in a temporary folder and moved into place, so processes that start at once
    (the Real-time job and its Parquet process) never read half a jar.
    """
    source = _source()
    jar = _jar_path(settings.cache_dir, source)
    if jar.is_file():
        return jar
    javac = _javac()
    if javac is None:
        log.warning("no javac on this machine (install a JDK, e.g. `make setup`): the "
                    "validation reads the events' fields with Spark's own expressions, "
                    "which takes about a third more of its CPU")
        return None
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        java = Path(tmp, "ContractFields.java")
        java.write_bytes(source)
        classes = Path(tmp, "classes")
        done = subprocess.run(
            [javac, "-nowarn", "--release", "17", "-d", str(classes),
             "-cp", f"{_pyspark_jars()}/*", str(java)],
            capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JarBuildError(f"javac failed on pipelines/{_SOURCE}:\n{done.stderr.strip()}")
        built = Path(tmp, jar.name)
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        os.replace(built, jar)
    log.info("built %s", jar)
    return jar
