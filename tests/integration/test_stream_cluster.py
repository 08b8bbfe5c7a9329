"""The streaming job on a Spark standalone cluster (master + one worker on this machine).

Executors are separate JVMs with their own Python workers, the project's code is
shipped to them as a zip, and every path is a URI: the same data set as the
local test must give the same stores.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings
from tests.conftest import free_port
from tests.integration.test_stream import (
    REPO,
    _env,
    check_stores,
    create_topic,
    expected_outcome,
    produce,
    stream_settings,
    wave1,
    wave2,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def cluster(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[Any]:
    from pipelines.infra.spark_standalone import SparkStandalone

    settings = make_settings(run_dir=str(tmp_path / "run"), spark_standalone_port=free_port(),
                             spark_standalone_ui_port=free_port())
    standalone = SparkStandalone(settings)
    standalone.start()
    yield standalone
    standalone.stop()


def test_stream_on_a_standalone_cluster_gives_the_same_results(
    make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any, spark: Any,
    cluster: Any, tmp_path: Path,
) -> None:
    topic = f"cluster.{tmp_path.name[-20:]}".replace("_", "-")
    data_uri = (tmp_path / "data").resolve().as_uri()  # file:///..., as s3a://... would be
    settings = stream_settings(make_settings, tmp_path, topic, data_dir=data_uri)
    create_topic(settings, topic)
    first = wave1()
    produce(settings, first)
    env = _env(settings)
    env["SHOPSTREAM_SPARK_MASTER"] = cluster.master_url
    log_path = tmp_path / "stream.log"

    def run() -> None:
        with open(log_path, "ab") as log:
            done = subprocess.run(
                [sys.executable, "-m", "pipelines.cli", "stream", "--available-now"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900, check=False)
        assert done.returncode == 0, log_path.read_text()[-3000:]

    run()
    second = wave2(first)
    produce(settings, second)
    run()

    apps = list((Path(cluster.home) / "work").glob("app-*"))
    assert apps, "no executor ran on the standalone worker"
    check_stores(spark, settings, expected_outcome(first + second))
