"""JVM jars resolved from Maven Central by Maven, cached outside the repository.

Two sets: the embedded Kafka broker, and Spark's native Kafka connector
(``spark-sql-kafka-0-10``) plus the few jars it needs that pyspark does not ship.
Each set lands in ``<cache_dir>/jars/<name>-<version>/`` with a ``.complete``
marker, so a second call is instant and a half-finished download is retried.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from pipelines.settings import Settings

__all__ = ["JarSet", "kafka_broker_jars", "spark_kafka_jars", "JarResolutionError"]

log = logging.getLogger(__name__)

# Only these are added to Spark's classpath; everything else the connector depends on
# (Scala, Hadoop client, compression codecs) is already inside pyspark's jars folder.
SPARK_CONNECTOR_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)


class JarResolutionError(RuntimeError):
    """Maven could not resolve a jar set (no Maven, no network, unknown version)."""


@dataclass(frozen=True)
class JarSet:
    name: str
    version: str
    directory: Path

    @property
    def jars(self) -> list[Path]:
        return sorted(self.directory.glob("*.jar"))

    @property
    def classpath(self) -> str:
        return f"{self.directory}/*"


def _mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarResolutionError(
            "Maven (mvn) is not on PATH; install it (Debian: apt-get install maven) "
            "or run `make setup`, which does"
        )
    return mvn


def _copy_dependencies(pom: str, out: Path, props: dict[str, str], include: tuple[str, ...] = ()) -> None:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pom_path = Path(str(files("pipelines.infra").joinpath(pom)))
    cmd = [
        _mvn(), "-q", "-B", "-f", str(pom_path),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    cmd += [f"-D{k}={v}" for k, v in props.items()]
    if include:
        cmd.append("-DincludeArtifactIds=" + ",".join(include))
    log.info("resolving %s with Maven into %s", pom, out)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not list(tmp.glob("*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        raise JarResolutionError(f"Maven could not resolve {pom} {props}:\n{tail}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    (out / ".complete").write_text(" ".join(p.name for p in sorted(out.glob("*.jar"))))


def kafka_broker_jars(settings: Settings) -> JarSet:
    """The jars of an Apache Kafka broker of ``settings.kafka_version``."""
    out = settings.cache_dir / "jars" / f"kafka-broker-{settings.kafka_version}"
    if not (out / ".complete").exists():
        _copy_dependencies("kafka-broker.pom.xml", out, {"kafka.version": settings.kafka_version})
    return JarSet("kafka-broker", settings.kafka_version, out)


def _installed_pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def spark_kafka_jars(settings: Settings) -> JarSet:
    """Spark's Kafka connector for the Spark in use.

    The connector of exactly the installed pyspark's version is preferred. When
    Maven Central has not published that one yet (pyspark reaches PyPI first),
    the newest connector of the same major version that is not newer is used:
    the source and sink API it implements is stable across minor versions. The
    chosen version is logged and visible in ``shopstream infra status``.
    """
    wanted = settings.spark_kafka_connector_version or _installed_pyspark_version()
    cache = settings.cache_dir / "jars"
    for existing in sorted(cache.glob(f"spark-kafka-{wanted}*")):
        if (existing / ".complete").exists():
            return JarSet("spark-kafka", existing.name.removeprefix("spark-kafka-"), existing)
    out = cache / f"spark-kafka-{wanted}"
    try:
        _copy_dependencies(
            "spark-kafka.pom.xml", out, {"spark.connector.version": wanted}, SPARK_CONNECTOR_ARTIFACTS
        )
        return JarSet("spark-kafka", wanted, out)
    except JarResolutionError:
        if settings.spark_kafka_connector_version:
            raise
    resolved = _newest_published_connector(wanted)
    log.warning(
        "spark-sql-kafka-0-10 %s is not on Maven Central yet; using %s, the newest published "
        "release of Spark %s.x not newer than it", wanted, resolved, wanted.split(".")[0],
    )
    final = cache / f"spark-kafka-{wanted}-via-{resolved}"
    _copy_dependencies(
        "spark-kafka.pom.xml", final, {"spark.connector.version": resolved}, SPARK_CONNECTOR_ARTIFACTS
    )
    return JarSet("spark-kafka", f"{resolved} (for Spark {wanted})", final)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _newest_published_connector(wanted: str) -> str:
    """Read the connector's Maven metadata (fetched by Maven itself) and pick a release."""
    import re

    major = wanted.split(".")[0]
    # A version-range request makes Maven download the artifact's metadata into its
    # local repository; the request itself may fail (ranges pull in odd parents).
    subprocess.run(
        [_mvn(), "-q", "-B", "-f", str(files("pipelines.infra").joinpath("spark-kafka.pom.xml")),
         "dependency:resolve", f"-Dspark.connector.version=[{major}.0.0,{wanted}]"],
        capture_output=True, text=True, check=False,
    )
    local_repo = subprocess.run(
        [_mvn(), "-q", "-B", "help:evaluate", "-Dexpression=settings.localRepository", "-DforceStdout",
         "-Dstyle.color=never"],
        capture_output=True, text=True, check=False,
    ).stdout
    local_repo = re.sub(r"\x1b\[[0-9;]*m", "", local_repo).strip() or str(Path.home() / ".m2" / "repository")
    folder = Path(local_repo) / "org" / "apache" / "spark" / "spark-sql-kafka-0-10_2.13"
    versions: set[str] = set()
    for meta in folder.glob("maven-metadata-*.xml"):
        versions.update(re.findall(r"<version>(\d+\.\d+\.\d+)</version>", meta.read_text()))
    candidates = sorted(
        (v for v in versions if v.split(".")[0] == major and _version_key(v) <= _version_key(wanted)),
        key=_version_key,
    )
    if not candidates:
        raise JarResolutionError(f"no spark-sql-kafka-0-10 release of Spark {major}.x found on Maven Central")
    return candidates[-1]
