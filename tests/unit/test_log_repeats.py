"""kafka-python's repeated lines while Kafka is away: the first of each kind, then a count."""

from __future__ import annotations

import logging

import pytest

from pipelines.log_repeats import CollapseRepeats


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name} {record.levelname} {record.getMessage()}")


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


@pytest.fixture
def lines(clock: list[float]):
    handler = _Lines()
    handler.addFilter(CollapseRepeats(("kafka",), period_s=30.0, clock=lambda: clock[0]))
    names = ["kafka.conn", "kafka.client_async", "kafkaesque", "pipelines.producer"]
    loggers = [logging.getLogger(n) for n in names]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    yield handler.lines
    for logger in loggers:
        logger.removeHandler(handler)
        logger.propagate = True


def test_the_first_of_each_kind_passes_then_one_a_period_with_the_count(
        lines: list[str], clock: list[float]) -> None:
    conn = logging.getLogger("kafka.conn")
    for second in range(0, 95, 5):  # an outage: a refused connection every 5 s for 90 s
        clock[0] = 1000.0 + second
        conn.error("%s: Connection failed: %s", f"<conn node_id=1 try={second}>", "111 ECONNREFUSED")
    assert lines == [
        "kafka.conn ERROR <conn node_id=1 try=0>: Connection failed: 111 ECONNREFUSED",
        "kafka.conn ERROR <conn node_id=1 try=30>: Connection failed: 111 ECONNREFUSED"
        " (5 more like this in the last 30 s)",
        "kafka.conn ERROR <conn node_id=1 try=60>: Connection failed: 111 ECONNREFUSED"
        " (5 more like this in the last 30 s)",
        "kafka.conn ERROR <conn node_id=1 try=90>: Connection failed: 111 ECONNREFUSED"
        " (5 more like this in the last 30 s)",
    ]


def test_kinds_are_told_apart_by_logger_level_and_template(lines: list[str]) -> None:
    logging.getLogger("kafka.conn").error("Connection failed: %s", "a")
    logging.getLogger("kafka.conn").warning("Connection failed: %s", "a")
    logging.getLogger("kafka.client_async").error("Connection failed: %s", "a")
    logging.getLogger("kafka.conn").error("No node available for metadata refresh")
    logging.getLogger("kafka.conn").error("Connection failed: %s", "b")  # the same kind again
    assert len(lines) == 4 and not any(line.endswith(": b") for line in lines)


def test_other_loggers_always_pass(lines: list[str]) -> None:
    for _ in range(3):
        logging.getLogger("pipelines.producer").warning("waiting for Kafka to acknowledge 5 records")
        logging.getLogger("kafkaesque").warning("not kafka-python's")
    assert len(lines) == 6


def test_a_kind_quiet_for_a_period_passes_without_a_count(lines: list[str], clock: list[float]) -> None:
    conn = logging.getLogger("kafka.conn")
    conn.warning("reconnected")
    clock[0] += 31
    conn.warning("reconnected")
    assert lines == ["kafka.conn WARNING reconnected"] * 2


def test_a_message_without_arguments_keeps_its_percent_signs(lines: list[str], clock: list[float]) -> None:
    conn = logging.getLogger("kafka.conn")
    conn.warning("100% of retries used")
    conn.warning("100% of retries used")
    clock[0] += 30
    conn.warning("100% of retries used")
    assert lines[-1] == "kafka.conn WARNING 100% of retries used (1 more like this in the last 30 s)"


def test_tracebacks_of_kafka_python_are_dropped_unless_asked_for(clock: list[float]) -> None:
    class _Records(logging.Handler):
        records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    logger = logging.getLogger("kafka.net.transport")
    for tracebacks in (False, True):
        handler = _Records()
        handler.records = []
        handler.addFilter(CollapseRepeats(("kafka",), clock=lambda: clock[0], tracebacks=tracebacks))
        logger.addHandler(handler)
        logger.propagate = False  # a filter of the root's handlers would see the same record
        try:
            try:
                raise ConnectionResetError(104, "Connection reset by peer")
            except ConnectionResetError:
                logger.exception("%s: Error receiving network data closing socket", "<transport>")
        finally:
            logger.removeHandler(handler)
            logger.propagate = True
        (record,) = handler.records
        assert (record.exc_info is not None) is tracebacks
