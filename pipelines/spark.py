"""The SparkSession, built from settings (master, memory, Kafka connector jars).

On a cluster, ``spark-submit`` supplies the master and the session picks it up;
locally the default is ``local[2]`` with few shuffle partitions, sized for a
2-core machine.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from pipelines.infra.class_archive import archive_option
from pipelines.infra.jvm_jar import shopstream_jar
from pipelines.settings import Settings

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

__all__ = ["spark_session", "uri_exists", "register_contract_fields", "driver_java_options", "gc_option",
           "jit_option", "inheriting", "detached", "scheduler_pool", "quiet_loggers", "STREAM_POOL",
           "BACKGROUND_POOL"]

STREAM_POOL = "stream"
"""Fair-scheduler pool of the streaming queries: first claim on every free task slot."""
BACKGROUND_POOL = "background"
"""Fair-scheduler pool of work beside the stream (feature snapshots): the slots left idle."""
_POOL_PROPERTY = "spark.scheduler.pool"

log = logging.getLogger(__name__)


_COLLECTOR_FLAG = re.compile(r"-XX:\+Use\w+GC\b")
"""A HotSpot flag choosing a collector: two of them are an error, so an operator's wins."""
_COLLECTORS = {"parallel": "-XX:+UseParallelGC", "g1": "-XX:+UseG1GC"}


def gc_option(settings: Settings, *, latency: bool = False) -> str:
    """The collector flag the project gives Spark's JVMs (``""``: the operator named one).

    ``latency``: the JVM is the Real-time query's driver, where a pause holds tiles that
    are due within a second; everything else runs for throughput (``Settings.spark_gc``).
    """
    if _COLLECTOR_FLAG.search(settings.spark_driver_java_options):
        return ""
    choice = settings.spark_gc
    if choice == "auto":
        choice = "g1" if latency else "parallel"
    return _COLLECTORS[choice]


HOTSPOT_HUGE_METHOD = 8_000
"""HotSpot's ``HugeMethodLimit`` (bytes of bytecode): with ``-XX:+DontCompileHugeMethods``,
its default, a longer method is never JIT-compiled and runs in the interpreter."""
_HUGE_METHODS_FLAG = re.compile(r"-XX:[+-]DontCompileHugeMethods\b")

CONCURRENT_OUTPUT_WRITERS = 4
"""``spark.sql.maxConcurrentOutputFileWriters``: a task writing a partitioned table (the raw
events by date and hour) keeps up to this many files open instead of sorting its rows by
partition first; a batch that spans more partitions has the rest sorted, as before."""

ARROW_UNBOUNDED_BYTES = 2**31 - 1
"""``spark.sql.execution.arrow.maxBytesPerBatch`` with no byte bound: Spark's Arrow writer
to Python checks a batch's size after each row unless the bound is exactly this."""


def jit_option(settings: Settings) -> str:
    """``-XX:-DontCompileHugeMethods`` when Spark may generate methods HotSpot would leave
    interpreted (``spark_codegen_huge_method_limit`` over 8,000 bytes); ``""`` otherwise, or
    when the operator's JVM options decide it.

    The validation stage's whole-stage method is about 13,000 bytes. Run as one method
    and compiled, it took about a fifth less CPU than Spark's per-operator code, which
    copies every row between its five projections (docs/streaming-performance.md).
    """
    if (settings.spark_codegen_huge_method_limit <= HOTSPOT_HUGE_METHOD
            or _HUGE_METHODS_FLAG.search(settings.spark_driver_java_options)):
        return ""
    return "-XX:-DontCompileHugeMethods"


def driver_java_options(settings: Settings, *, latency: bool = False) -> str:
    """The driver JVM's options: the project's (Derby's home under the data dir, the quiet
    log4j2 config, the collector of :func:`gc_option`, the JIT flag of :func:`jit_option`,
    the class archive of :func:`pipelines.infra.class_archive.archive_option`), then
    ``spark_driver_java_options`` (later flags win in HotSpot)."""
    return " ".join(filter(None, (
        "-Dderby.system.home=" + settings.data_path("derby"),
        "-Dlog4j2.configurationFile=" + str(files("pipelines").joinpath("spark-log4j2.properties")),
        f"-Dshopstream.kafkaAttempts={settings.stream_kafka_attempts}",  # named in its lines
        gc_option(settings, latency=latency),
        jit_option(settings),
        archive_option(settings),
        settings.spark_driver_java_options.strip(),
    )))


def spark_session(settings: Settings, app_name: str = "shopstream", *, kafka: bool = True,
                  latency: bool = False) -> SparkSession:
    """Get or create the session; ``kafka`` adds Spark's Kafka connector jars.

    ``latency``: the session runs the Real-time query (its JVMs get a collector with short
    pauses, :func:`gc_option`). JVM options only take effect when this creates the JVM.
    """
    import sys

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.default.parallelism", str(settings.spark_shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        # Python workers run this interpreter (the venv with redis, feast, ...), not
        # whatever ``python3`` is first on PATH
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.codegen.hugeMethodLimit", str(settings.spark_codegen_huge_method_limit))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # off by default: see Settings.spark_dataframe_debugging (a static conf)
        .config("spark.python.sql.dataFrameDebugging.enabled",
                str(settings.spark_dataframe_debugging).lower())
        # pools (pipelines/spark-fairscheduler.xml): a snapshot written beside the
        # stream must not hold the task slots the next micro-batch needs
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file",
                str(files("pipelines").joinpath("spark-fairscheduler.xml")))
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        # a commit writes the batch's changes, not a snapshot of the store: the dedup
        # state's commit, on the path of every micro-batch, took 90-180 ms with it against
        # 200-350 ms without at 1,000 events/s (snapshots are made in the background;
        # Real-time Mode turns it on by itself, and an existing checkpoint can switch)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # no micro-batch without input: Spark runs one after input stops, only to move the
        # dedup's watermark and evict. Here that batch changes nothing (the clock is the
        # events' own), yet it pays the eviction's pass over every state row and a batch's
        # fixed cost: 0.5-0.7 s with a small state, 1.5-1.9 s at 4.8M ids. The next batch
        # with input evicts instead.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # Arrow batches to Python bounded by their rows alone (maxRecordsPerBatch, 10,000
        # by default): under a byte bound (Spark's default 64 MB) the writer sizes the
        # whole batch after every row it adds (each vector's value count and buffers),
        # 58 % of the online path's Arrow writing in a profile of the drain. Int.MaxValue
        # is the value for which Spark skips that check (BatchedPythonArrowInput).
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(ARROW_UNBOUNDED_BYTES))
        # the raw events sink writes each date/hour partition with a writer of its own
        # instead of sorting the batch by them first: the same files and rows, 12 of 14
        # alternating 1M-event writes took less CPU (0.12 s of about 2.2)
        .config("spark.sql.maxConcurrentOutputFileWriters", str(CONCURRENT_OUTPUT_WRITERS))
        .config("spark.sql.warehouse.dir", settings.data_path("spark-warehouse"))
        .config("spark.driver.extraJavaOptions", driver_java_options(settings, latency=latency))
    )
    # a cluster's executors do the heavy work: the same collector and JIT flag there
    executor = " ".join(filter(None, (gc_option(settings, latency=latency), jit_option(settings))))
    if executor:
        builder = builder.config("spark.executor.extraJavaOptions", executor)
    jars: list[Path] = []
    if kafka:
        from pipelines.infra.jars import spark_kafka_jars

        jars.extend(spark_kafka_jars(settings).jars)
    contract = shopstream_jar(settings)
    if contract is not None:
        jars.append(contract)
    if jars:
        builder = builder.config("spark.jars", ",".join(str(p) for p in jars))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(settings.spark_log_level)
    if contract is not None:
        register_contract_fields(session)
    return session


def uri_exists(spark: SparkSession, uri: str) -> bool:
    """Whether a file or folder exists, on any file system the session reaches (local,
    ``hdfs://``, ``s3a://``): asked before a read, so a missing store is an error of ours,
    not Spark's ``PATH_NOT_FOUND`` with a stack trace logged first."""
    path = getattr(spark._jvm, "org.apache.hadoop.fs.Path")(uri)  # type: ignore[attr-defined]
    return bool(path.getFileSystem(spark._jsc.hadoopConfiguration()).exists(path))  # type: ignore[attr-defined]


def register_contract_fields(spark: SparkSession, class_name: str | None = None, *,
                             name: str | None = None, one_pass: bool = True) -> bool:
    """Register :data:`features.validation.CONTRACT_FIELDS_FUNCTION` in ``spark`` (the Java
    class of :mod:`pipelines.infra.jvm_jar`, given the contract's fields) and, from the
    same jar, :data:`features.validation.VALID_UTF8_FUNCTION`; the validation then reads
    the fields, and checks the bytes, with them. False, with a warning, when the
    session's JVM does not have the class (a session started before, without the jar):
    the validation then uses Spark's own expressions, to the same verdicts. A ``ValueError``
    when the class refuses the contract's rules (a check it does not know).

    ``name`` registers the contract-fields function under another name, and ``one_pass``
    false has it read every record with Spark's parser (the tests compare the two ways)."""
    from functools import reduce

    from py4j.protocol import Py4JError, Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException
    from pyspark.sql.types import BooleanType

    from features.validation import (
        CONTRACT_FIELDS_FUNCTION,
        VALID_UTF8_FUNCTION,
        contract_fields_arguments,
    )
    from pipelines.infra.jvm_jar import CONTRACT_FIELDS_CLASS, VALID_UTF8_CLASS

    class_name = class_name or CONTRACT_FIELDS_CLASS
    names, wants_text, wants_number, rules, struct = contract_fields_arguments()
    gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
    jvm = gateway.jvm

    def array(kind: Any, values: list[Any]) -> Any:
        out = gateway.new_array(kind, len(values))
        for i, v in enumerate(values):
            out[i] = v
        return out

    try:
        # py4j names a class it cannot find as a package, which cannot be called
        java_class = reduce(getattr, class_name.split("."), jvm)
        instance = java_class(array(jvm.java.lang.String, names), array(jvm.boolean, wants_text),
                              array(jvm.boolean, wants_number), rules, one_pass)
        valid_utf8 = reduce(getattr, VALID_UTF8_CLASS.split("."), jvm)()
    except (Py4JJavaError, CapturedException) as exc:
        # the class is there and refused what it was given (PySpark raises the Java
        # exceptions it knows as its own): a rule table it cannot read is a defect of this
        # version, not a session without the jar, so it is not hidden
        reason = (exc.java_exception.getMessage() if isinstance(exc, Py4JJavaError)
                  else str(exc))
        raise ValueError(f"the contract-fields class {class_name} refused the contract's "
                         f"rules: {reason}") from None
    except (Py4JError, TypeError) as exc:
        log.warning("the contract-fields class %s is not in this Spark session's JVM, or not "
                    "in this version (%s): the validation reads the fields with Spark's own "
                    "expressions", class_name, str(exc).partition("\n")[0])
        return False
    jsession = spark._jsparkSession  # type: ignore[attr-defined]
    java_class.register(jsession, name or CONTRACT_FIELDS_FUNCTION, instance,
                        jsession.parseDataType(struct.json()))
    jsession.udf().register(VALID_UTF8_FUNCTION, valid_utf8,
                            jsession.parseDataType(BooleanType().json()))
    return True


def inheriting(spark: SparkSession, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run in another thread with this thread's Spark local properties (job group,
    query id: stopping the query cancels its jobs), as ``pyspark.InheritableThread`` does."""
    jsc = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    properties = jsc.getLocalProperties().clone()

    def run(*args: Any, **kwargs: Any) -> Any:
        jsc.setLocalProperties(properties)
        return fn(*args, **kwargs)

    return run


@contextmanager
def scheduler_pool(spark: SparkSession, pool: str) -> Iterator[None]:
    """Jobs this thread submits inside the block run in the fair-scheduler pool ``pool``;
    so does every job of a streaming query started inside it (its thread inherits the
    property), for as long as the query runs."""
    sc = spark.sparkContext
    before = sc.getLocalProperty(_POOL_PROPERTY)
    sc.setLocalProperty(_POOL_PROPERTY, pool)
    try:
        yield
    finally:
        sc.setLocalProperty(_POOL_PROPERTY, before)  # type: ignore[arg-type]


def detached(spark: SparkSession, fn: Callable[..., Any], group: str,
             pool: str = BACKGROUND_POOL) -> Callable[..., Any]:
    """``fn`` run in another thread with Spark local properties of its own: a job group
    ``group``, the scheduler pool ``pool`` and nothing of the caller's. For work that
    outlives the streaming batch that started it: stopping the query cancels the jobs
    of the query's group, and those must finish instead (the caller waits for them)."""
    sc = spark.sparkContext
    jsc = sc._jsc.sc()  # type: ignore[union-attr]
    jvm = sc._jvm  # type: ignore[attr-defined]
    assert jvm is not None

    def run(*args: Any, **kwargs: Any) -> Any:
        jsc.setLocalProperties(jvm.java.util.Properties())
        sc.setJobGroup(group, group, interruptOnCancel=False)
        sc.setLocalProperty(_POOL_PROPERTY, pool)
        return fn(*args, **kwargs)

    return run


@contextmanager
def quiet_loggers(spark: SparkSession, names: tuple[str, ...]) -> Iterator[None]:
    """Spark's (log4j2) loggers ``names`` off for the block, then back to their levels.

    For errors Spark logs on a deliberate action, e.g. the stack traces of every task
    of a Real-time query it stops mid-epoch; the caller logs one line in their place.
    """
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    configurator = log4j.core.config.Configurator
    before = {name: log4j.LogManager.getLogger(name).getLevel() for name in names}
    for name in names:
        configurator.setLevel(name, log4j.Level.OFF)
    try:
        yield
    finally:
        for name, level in before.items():
            configurator.setLevel(name, level)
