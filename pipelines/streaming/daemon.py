"""The Python daemon for the streaming job's executors: pyspark's own, with the job's imports loaded.

Spark forks every Python worker from one daemon process per executor
(``spark.python.daemon.module``, default ``pyspark.daemon``). Spark 4.3 does not
keep every worker between jobs, and each new worker would import the online
writer again -- Feast's package alone takes about 4 s -- in the middle of a
micro-batch. Importing the heavy modules here, once, before the daemon starts
forking gives each worker a warm import cache (copy-on-write), so a new worker
costs milliseconds.

Used with ``--conf spark.python.daemon.module=pipelines.streaming.daemon``
(``shopstream stream`` sets it; on a cluster, pass it to ``spark-submit``).
"""

from __future__ import annotations

import redis  # noqa: F401
from pyspark.daemon import manager

# the modules the stream's executor functions import (no threads start here)
import features.feast_layout  # noqa: F401
import pipelines.online_writer  # noqa: F401
import pipelines.stream_state  # noqa: F401
import pipelines.streaming.pyfeatures  # noqa: F401

if __name__ == "__main__":
    manager()
