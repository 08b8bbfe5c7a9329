"""What ``shopstream infra up`` says when a server cannot start: a port another program
holds (refused before anything starts), and a server that exits during its start-up (its
own reason, from its log). Real sockets and files; no server is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.infra import KafkaBroker, RedisServer
from pipelines.infra.kafka_broker import _java_error
from pipelines.infra.process import StartupError, wait_until
from pipelines.settings import Settings
from tests.conftest import free_port


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(_env_file=None, run_dir=str(tmp_path / "run"),  # type: ignore[arg-type]
                    data_dir=str(tmp_path / "data"), **overrides)


def test_redis_refuses_a_port_another_program_holds(tmp_path: Path, listening: int) -> None:
    server = RedisServer(_settings(tmp_path, redis_url=f"redis://127.0.0.1:{listening}/0"))
    with pytest.raises(StartupError) as refused:
        server.start()
    assert str(refused.value) == (
        f"cannot start redis-server: something else already listens on 127.0.0.1:{listening} "
        "(not a server this run dir started); stop it, or set SHOPSTREAM_REDIS_URL to a free port")
    assert server.process.pid is None and not (tmp_path / "run" / "redis" / "redis.conf").exists()


@pytest.mark.parametrize("held", ["listener", "controller"])
def test_kafka_refuses_a_port_another_program_holds(tmp_path: Path, listening: int,
                                                    held: str) -> None:
    """Its listener's port was held by a web server: 32 s of client timeouts, then "exited
    during startup"."""
    ports = {"listener": free_port(), "controller": free_port(), held: listening}
    broker = KafkaBroker(_settings(tmp_path,
                                   kafka_bootstrap_servers=f"127.0.0.1:{ports['listener']}",
                                   kafka_controller_port=ports["controller"]))
    with pytest.raises(StartupError) as refused:
        broker.start()
    setting = ("SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS" if held == "listener"
               else "SHOPSTREAM_KAFKA_CONTROLLER_PORT")
    assert f"already listens on 127.0.0.1:{listening} " in str(refused.value)
    assert str(refused.value).endswith(f"set {setting} to a free port")
    assert broker.process.pid is None


def test_kafka_refuses_one_port_for_its_listener_and_its_controller(tmp_path: Path) -> None:
    """CI once gave both the same free port: Kafka's storage tool failed, and the message kept
    only the tail of its stack trace."""
    port = free_port()
    broker = KafkaBroker(_settings(tmp_path, kafka_bootstrap_servers=f"127.0.0.1:{port}",
                                   kafka_controller_port=port))
    with pytest.raises(StartupError) as refused:
        broker.start()
    assert str(refused.value) == (
        f"cannot start the Kafka broker: SHOPSTREAM_KAFKA_CONTROLLER_PORT ({port}) is the port "
        f"of SHOPSTREAM_KAFKA_BOOTSTRAP_SERVERS (127.0.0.1:{port}); the broker's controller "
        "needs a port of its own")
    assert broker.process.pid is None and not broker.data_dir.exists()


def test_a_failed_kafka_tool_is_reported_by_its_exception_not_its_stack_frames() -> None:
    stderr = (
        'Exception in thread "main" java.lang.IllegalArgumentException: requirement failed: If '
        "you have two listeners on the same port then one needs to be IPv4 and the other IPv6, "
        "listeners: PLAINTEXT://127.0.0.1:29411,CONTROLLER://127.0.0.1:29411, port: 29411\n"
        + "".join(f"\tat kafka.utils.CoreUtils$.frame{i}(CoreUtils.scala:{i})\n"
                  for i in range(40))
        + "\t... 5 more\n")
    said = _java_error(stderr)
    assert said.startswith('Exception in thread "main" java.lang.IllegalArgumentException: '
                           "requirement failed: If you have two listeners on the same port")
    assert "CoreUtils" not in said


def test_free_port_never_hands_out_a_port_twice() -> None:
    """The kernel gives one free port to two binds in a row now and then (814 repeats in
    5,000 binds here): a broker given one port for its two listeners cannot start."""
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)


def test_a_server_that_exits_during_startup_gives_its_own_reason(tmp_path: Path) -> None:
    log = tmp_path / "redis.log"
    log.write_text(
        "11496:M 01 Dec 2026 06:13:27.223 * monotonic clock: POSIX clock_gettime\n"
        "11496:M 01 Dec 2026 06:13:27.224 # Warning: Could not create server TCP listening "
        "socket 127.0.0.1:16379: bind: Address already in use\n"
        "11496:M 01 Dec 2026 06:13:27.224 # Failed listening on port 16379 (TCP), aborting.\n")
    with pytest.raises(StartupError) as exited:
        wait_until(lambda: False, timeout=30, what="redis-server on 127.0.0.1:16379",
                   alive=lambda: False, log_file=log)
    assert str(exited.value) == (
        "redis-server on 127.0.0.1:16379 exited during startup (11496:M 01 Dec 2026 "
        "06:13:27.224 # Warning: Could not create server TCP listening socket "
        f"127.0.0.1:16379: bind: Address already in use); see {log}")
    log.write_text("starting\nFATAL: invalid value for parameter tls-port\nbye\n")
    with pytest.raises(StartupError, match=r"exited during startup \(FATAL: invalid value for "
                                           r"parameter tls-port\); see "):
        wait_until(lambda: False, timeout=30, what="x", alive=lambda: False, log_file=log)
    before = log.stat().st_size  # an earlier run's complaint is not this one's
    with open(log, "a") as more:
        more.write("starting again\nbye\n")
    with pytest.raises(StartupError) as again:
        wait_until(lambda: False, timeout=30, what="x", alive=lambda: False, log_file=log,
                   log_from=before)
    assert str(again.value) == f"x exited during startup; see {log}"
    log.write_text("starting\nbye\n")  # nothing said: the log is named, nothing made up
    with pytest.raises(StartupError) as quiet:
        wait_until(lambda: False, timeout=30, what="x", alive=lambda: False, log_file=log)
    assert str(quiet.value) == f"x exited during startup; see {log}"
