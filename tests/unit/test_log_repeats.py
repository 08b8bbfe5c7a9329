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
    names = ["kafka", "kafkaesque", "pipelines.producer"]  # kafka.* propagate to "kafka"
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
    sender = logging.getLogger("kafka.conn")
    for second in range(0, 95, 5):  # a throttled broker: a line every 5 s for 90 s
        clock[0] = 1000.0 + second
        sender.warning("%s: %s throttled by broker (%d ms)", f"<conn node_id=1 try={second}>", "Produce", 120)
    assert lines == [
        "kafka.conn WARNING <conn node_id=1 try=0>: Produce throttled by broker (120 ms)",
        "kafka.conn WARNING <conn node_id=1 try=30>: Produce throttled by broker (120 ms)"
        " (5 more like this in the last 30 s)",
        "kafka.conn WARNING <conn node_id=1 try=60>: Produce throttled by broker (120 ms)"
        " (5 more like this in the last 30 s)",
        "kafka.conn WARNING <conn node_id=1 try=90>: Produce throttled by broker (120 ms)"
        " (5 more like this in the last 30 s)",
    ]


def test_kinds_are_told_apart_by_logger_level_and_template(lines: list[str]) -> None:
    logging.getLogger("kafka.conn").error("Connection failed: %s", "a")
    logging.getLogger("kafka.conn").warning("Connection failed: %s", "a")
    logging.getLogger("kafka.client_async").error("Connection failed: %s", "a")
    logging.getLogger("kafka.conn").error("Metadata refresh loop error: %s", "a")
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


def _outage(clock: list[float], seconds: int) -> None:
    """What kafka-python 3 logged, a consumer and a producer on a stopped broker (the lines
    of an outage, as measured): nine kinds at its start, then retries every few seconds."""
    transport = logging.getLogger("kafka.net.transport")
    transport.error("%s: socket disconnected", "<KafkaTCPTransport [127.0.0.1:9092<-4836]>")
    logging.getLogger("kafka.net.connection").error(
        "%s: Connection lost: %s", "<KafkaConnection node_id=1 (disconnected)>",
        "KafkaConnectionError: socket disconnected")
    start = clock[0]
    while clock[0] - start < seconds:
        logging.getLogger("kafka.net.manager").error("Connection failed: %s",
                                                     "KafkaConnectionError: 111 ECONNREFUSED")
        logging.getLogger("kafka.cluster").warning("No node available for metadata refresh - backoff/retry")
        logging.getLogger("kafka.consumer.fetcher").error("Fetch to node %s failed: %s", 1,
                                                          "KafkaConnectionError: 111 ECONNREFUSED")
        clock[0] += 2


def test_an_outage_is_one_line_in_our_words_quoting_kafka_python(lines: list[str], clock: list[float]) -> None:
    _outage(clock, 65)
    outage = [line for line in lines if "Kafka connection" in line]
    assert outage[0] == (
        "kafka.net.connection ERROR Kafka connection failed (kafka-python: <KafkaConnection node_id=1 "
        "(disconnected)>: Connection lost: KafkaConnectionError: socket disconnected); kafka-python "
        "reconnects on its own, and its lines about it are counted here, one line every 30 s at most")
    # then one line a period: 3 lines every 2 s (the one shown is not counted)
    assert outage[1:] == [
        f"kafka.net.manager ERROR Kafka connection still failing: {held} more kafka-python lines like this in "
        "the last 30 s (the last: Connection failed: KafkaConnectionError: 111 ECONNREFUSED)"
        for held in (15 * 3, 15 * 3 - 1)]
    # the transport's line says nothing of a cause: a kind of its own, shown as it was
    assert lines == ["kafka.net.transport ERROR <KafkaTCPTransport [127.0.0.1:9092<-4836]>: "
                     "socket disconnected", *outage]


def test_the_next_outage_begins_with_the_first_line_again(lines: list[str], clock: list[float]) -> None:
    manager = logging.getLogger("kafka.net.manager")
    manager.error("Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED")
    clock[0] += 600  # Kafka came back; ten minutes later it is gone again
    manager.error("Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED")
    assert [line.split(" (")[0] for line in lines] == ["kafka.net.manager ERROR Kafka connection failed"] * 2


def test_other_errors_keep_their_kinds_and_words(lines: list[str]) -> None:
    """A refused login or an unknown topic is not an outage: it must not hide behind one."""
    _outage([0.0], 10)
    lines.clear()
    logging.getLogger("kafka.net.connection").error("%s: SaslHandshake failed: %s", "<conn>",
                                                    "UnsupportedSaslMechanismError")
    logging.getLogger("kafka.cluster").error("Topic %s not found in cluster metadata", "clicks")
    assert lines == ["kafka.net.connection ERROR <conn>: SaslHandshake failed: UnsupportedSaslMechanismError",
                     "kafka.cluster ERROR Topic clicks not found in cluster metadata"]


def test_verbose_keeps_each_kind_in_kafka_python_words(clock: list[float]) -> None:
    handler = _Lines()
    handler.addFilter(CollapseRepeats(("kafka",), clock=lambda: clock[0], one_outage_kind=False))
    logger = logging.getLogger("kafka.net.manager")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED")
        logger.error("Bootstrap connection to %s failed: %s", "bootstrap-0", "KafkaConnectionError")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert handler.lines == ["kafka.net.manager ERROR Connection failed: KafkaConnectionError: 111 ECONNREFUSED",
                             "kafka.net.manager ERROR Bootstrap connection to bootstrap-0 failed: KafkaConnectionError"]


def test_a_record_whose_arguments_do_not_fit_its_template_passes_the_filter() -> None:
    """The filter reads the text of every kafka-python record; one that cannot be formatted
    must reach the handler (whose own error handling reports it), not raise in kafka-python's
    thread."""
    record = logging.LogRecord("kafka.conn", logging.ERROR, __file__, 1, "Connection failed: %s %s",
                               ("ECONNREFUSED",), None)
    assert CollapseRepeats(("kafka",)).filter(record) is True
    assert record.msg == "Connection failed: %s %s"  # not an outage line: its text is unknown
