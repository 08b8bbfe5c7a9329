"""Settings: one typed object, validated, with secrets that never print."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipelines.settings import Settings, parse_host_port


def test_settings_reads_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9094,10.0.0.2:9094")
    monkeypatch.setenv("SHOPSTREAM_REDIS_URL", "rediss://cache.example:6380/2")
    s = Settings(_env_file=None)
    assert [hp.port for hp in s.kafka_bootstrap] == [9094, 9094]
    assert s.redis_tls and s.redis_db == 2 and s.redis_address.port == 6380


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kafka_bootstrap_servers", "no-port"),
        ("redis_url", "http://x:1"),
        ("api_port", 70000),
        ("api_keep_alive_seconds", 0),
        ("kafka_security_protocol", "SASL_SSL"),  # without a mechanism
    ],
)
def test_settings_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(_env_file=None, **{field: value})
    assert info.value.errors()


def test_settings_secrets_never_print() -> None:
    s = Settings(_env_file=None, redis_password="hunter2", api_key="k-123",
                 redis_url="redis://:urlpass@127.0.0.1:6379/0")
    text = repr(s) + str(s.model_dump())
    assert "hunter2" not in text and "k-123" not in text
    assert "urlpass" not in s.redis_url_redacted
    assert s.redis_secret() == "hunter2"


def test_parse_host_port_ipv6() -> None:
    assert parse_host_port("[::1]:9092") == ("::1", 9092)
    with pytest.raises(ValueError):
        parse_host_port("host:0")


def test_driver_java_options_come_after_the_projects_own(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """An operator's JVM flags reach the driver, after the project's (HotSpot: the last wins)."""
    from pipelines.infra import class_archive
    from pipelines.spark import driver_java_options

    monkeypatch.setattr(class_archive, "archive_dir", lambda: tmp_path)  # no archive built there
    monkeypatch.setenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS", " -XX:TieredStopAtLevel=1 -Xss4m ")
    options = driver_java_options(Settings(_env_file=None, data_dir="/srv/shop")).split(" ")
    assert options[0] == "-Dderby.system.home=/srv/shop/derby"
    assert options[1].startswith("-Dlog4j2.configurationFile=")
    assert options[2] == "-Dshopstream.kafkaAttempts=3"
    assert options[3:] == ["-XX:+UseParallelGC", "-XX:-DontCompileHugeMethods",
                           "-XX:TieredStopAtLevel=1", "-Xss4m"]
    monkeypatch.delenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS")
    assert len(driver_java_options(Settings(_env_file=None)).split(" ")) == 5


def test_drivers_start_with_the_class_archive_once_it_is_built(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """The archive's option appears once the file is there, before the operator's flags; off
    by the setting, or when the operator's flags decide class sharing themselves."""
    from pipelines.infra import class_archive
    from pipelines.infra.class_archive import archive_option, archive_path
    from pipelines.spark import driver_java_options

    monkeypatch.setattr(class_archive, "archive_dir", lambda: tmp_path / "var")
    s = Settings(_env_file=None)
    path = archive_path()
    assert path is not None and path.parent == tmp_path / "var" and path.suffix == ".jsa"
    assert archive_option(s) == ""  # not built: drivers start as before
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert archive_option(s) == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS", "-Xss4m")
    assert driver_java_options(Settings(_env_file=None)).split(" ")[-2:] == [
        f"-XX:SharedArchiveFile={path}", "-Xss4m"]
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/opt/mine.jsa", "-XX:ArchiveClassesAtExit=/tmp/a.jsa"):
        monkeypatch.setenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS", own)
        assert archive_option(Settings(_env_file=None)) == "", own
    monkeypatch.delenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS")
    monkeypatch.setenv("SHOPSTREAM_SPARK_CLASS_ARCHIVE", "false")
    assert archive_option(Settings(_env_file=None)) == ""


def test_the_class_archive_is_named_for_its_jvm_and_lives_in_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another JVM (``JAVA_HOME``), or the same one rebuilt in place, gets an archive of its
    own, never one made by this one; each environment (a checkout's ``.venv``) has its own."""
    import os
    import shutil
    import sys

    from pipelines.infra.class_archive import archive_path

    assert shutil.which("java") is not None
    monkeypatch.delenv("JAVA_HOME", raising=False)
    here = archive_path()
    assert here is not None and here.is_relative_to(sys.prefix)
    other = tmp_path / "other-jdk"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "java").write_text("")
    monkeypatch.setenv("JAVA_HOME", str(other))
    before = archive_path()
    assert before not in (None, here)
    (other / "lib" / "server").mkdir(parents=True)
    (other / "lib" / "server" / "libjvm.so").write_text("a JVM upgraded in place")
    os.utime(other / "lib" / "server" / "libjvm.so", ns=(1, 1))
    assert archive_path() not in (None, here, before)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "missing"))
    assert archive_path() is None


def test_huge_generated_methods_are_compiled_unless_spark_splits_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark may generate methods over HotSpot's 8,000-byte limit (its default limit is
    65,535): then the JVMs compile them. At 8,000 Spark splits them itself and HotSpot
    keeps its default; an operator's own choice of the flag is the only one."""
    from pipelines.spark import driver_java_options, jit_option

    assert jit_option(Settings(_env_file=None)) == "-XX:-DontCompileHugeMethods"
    monkeypatch.setenv("SHOPSTREAM_SPARK_CODEGEN_HUGE_METHOD_LIMIT", "8000")
    assert jit_option(Settings(_env_file=None)) == ""
    monkeypatch.delenv("SHOPSTREAM_SPARK_CODEGEN_HUGE_METHOD_LIMIT")
    monkeypatch.setenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS", "-XX:+DontCompileHugeMethods")
    own = Settings(_env_file=None)
    assert jit_option(own) == ""
    assert [f for f in driver_java_options(own).split(" ") if "HugeMethods" in f] == [
        "-XX:+DontCompileHugeMethods"]
    monkeypatch.setenv("SHOPSTREAM_SPARK_CODEGEN_HUGE_METHOD_LIMIT", "70000")
    with pytest.raises(ValueError, match="spark_codegen_huge_method_limit"):
        Settings(_env_file=None)


def test_the_collector_suits_the_job_and_yields_to_the_operators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Throughput jobs get the Parallel collector, the Real-time query's driver G1 (short
    pauses); the setting picks one for all, and a collector among the operator's own JVM
    flags is the only one (HotSpot refuses to start with two)."""
    from pipelines.spark import driver_java_options, gc_option

    s = Settings(_env_file=None)
    assert gc_option(s) == "-XX:+UseParallelGC"
    assert gc_option(s, latency=True) == "-XX:+UseG1GC"
    assert "-XX:+UseG1GC" in driver_java_options(s, latency=True).split(" ")
    monkeypatch.setenv("SHOPSTREAM_SPARK_GC", "g1")
    assert gc_option(Settings(_env_file=None)) == "-XX:+UseG1GC"
    monkeypatch.setenv("SHOPSTREAM_SPARK_GC", "parallel")
    assert gc_option(Settings(_env_file=None), latency=True) == "-XX:+UseParallelGC"
    monkeypatch.setenv("SHOPSTREAM_SPARK_DRIVER_JAVA_OPTIONS", "-Xss4m -XX:+UseZGC")
    own = Settings(_env_file=None)
    assert gc_option(own) == "" and gc_option(own, latency=True) == ""
    flags = driver_java_options(own).split(" ")
    assert [f for f in flags if f.endswith("GC")] == ["-XX:+UseZGC"]
    monkeypatch.setenv("SHOPSTREAM_SPARK_GC", "serial")
    with pytest.raises(ValueError, match="spark_gc"):
        Settings(_env_file=None)


def test_the_real_time_tile_sink_lingers_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Real-time query's producer batches its tiles for the linger the operator sets
    (5 ms by default), on the topic of the shape it sends (role rows by default), with the
    connection's own options."""
    from pipelines.streaming.realtime import tile_sink_options

    s = Settings(_env_file=None, kafka_topic_rt_tiles="t.tiles")
    options = tile_sink_options(s)
    assert options["kafka.linger.ms"] == "5" and options["topic"] == "t.tiles.roles"
    whole = tile_sink_options(s.model_copy(update={"stream_realtime_shape": "tiles"}))
    assert whole["topic"] == "t.tiles"
    assert options["kafka.bootstrap.servers"] == s.spark_kafka_options()["kafka.bootstrap.servers"]
    monkeypatch.setenv("SHOPSTREAM_STREAM_REALTIME_TILES_LINGER_MS", "0")
    assert tile_sink_options(Settings(_env_file=None))["kafka.linger.ms"] == "0"
    monkeypatch.setenv("SHOPSTREAM_STREAM_REALTIME_TILES_LINGER_MS", "-1")
    with pytest.raises(ValidationError, match="stream_realtime_tiles_linger_ms"):
        Settings(_env_file=None)


def test_the_stream_waits_out_kafka_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts and their timeout reach Spark's Kafka source; the admin client refuses a call
    timeout below one request's, so a short one shortens the request's too."""
    source = Settings(_env_file=None).spark_kafka_source_options()
    assert source["fetchOffset.numRetries"] == "3"
    assert source["kafka.default.api.timeout.ms"] == "60000"
    assert source["kafka.request.timeout.ms"] == "30000"
    monkeypatch.setenv("SHOPSTREAM_STREAM_KAFKA_ATTEMPTS", "5")
    monkeypatch.setenv("SHOPSTREAM_STREAM_KAFKA_TIMEOUT_SECONDS", "2.5")
    own = Settings(_env_file=None)
    source = own.spark_kafka_source_options()
    assert (source["fetchOffset.numRetries"], source["kafka.default.api.timeout.ms"],
            source["kafka.request.timeout.ms"]) == ("5", "2500", "2500")
    assert source["kafka.bootstrap.servers"] == own.kafka_bootstrap_servers
    monkeypatch.setenv("SHOPSTREAM_STREAM_KAFKA_ATTEMPTS", "0")
    with pytest.raises(ValueError, match="stream_kafka_attempts"):
        Settings(_env_file=None)
