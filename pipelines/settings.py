"""The one place where shopstream reads its configuration.

Every host, port, path, topic and secret comes from here: environment variables
prefixed ``SHOPSTREAM_`` (and an optional ``.env`` file in the working
directory). Build a :class:`Settings` once at the edge (CLI, test fixture,
notebook) and pass it down; nothing else reads ``os.environ``.

Secrets are :class:`pydantic.SecretStr`, so they print as ``**********`` in
reprs, logs and ``shopstream status``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "HostPort", "parse_host_port"]

ENV_PREFIX = "SHOPSTREAM_"


class HostPort(tuple[str, int]):
    """A ``(host, port)`` pair parsed from ``host:port``."""

    @property
    def host(self) -> str:
        return self[0]

    @property
    def port(self) -> int:
        return self[1]


def parse_host_port(text: str) -> HostPort:
    """Parse ``host:port`` (IPv6 as ``[::1]:9092``) into a :class:`HostPort`."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected host:port, got {text!r}")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"expected host:port with a port in 1..65535, got {text!r}")
    return HostPort((host, int(port_text)))


class Settings(BaseSettings):
    """shopstream's settings; see the README's "Settings" table for every field."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    # --- storage -------------------------------------------------------
    data_dir: str = ".shopstream"
    """Root of the offline store, checkpoints, MLflow store and local server data.
    A local path or a URI (``s3a://bucket/prefix``) for the Spark-written parts."""
    cache_dir: Path = Path.home() / ".cache" / "shopstream"
    """Where resolved JVM jars are cached between clones (never committed)."""
    run_dir: str | None = None
    """Where local servers keep pid files, configs, logs and data (default: ``<data_dir>/run``)."""

    # --- Kafka ---------------------------------------------------------
    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    kafka_topic_events: str = "clickstream.events.v1"
    kafka_topic_partitions: int = Field(default=4, ge=1, le=1024)
    kafka_topic_rt_tiles: str = "shopstream.rt-tiles.v1"
    """Real-time Mode's full tiles, from the Spark query to the Redis feed (created on start)."""
    kafka_security_protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (managed Kafka: SASL_SSL)."""
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_controller_port: int = Field(default=9093, ge=1, le=65535)
    """Controller listener of the embedded KRaft broker (local only): a port of its own, not the
    broker's port in ``kafka_bootstrap_servers`` (``infra up`` refuses one port for both)."""
    kafka_version: str = "4.1.1"
    """Apache Kafka release of the embedded broker's jars."""
    kafka_heap: str = "512m"

    # --- Redis ---------------------------------------------------------
    redis_url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` (TLS); a password in the URL also works."""
    redis_password: SecretStr | None = None
    redis_username: str | None = None
    """ACL user; with no username the password authenticates the default user."""
    redis_tls_ca_cert: Path | None = None
    redis_tls_cert: Path | None = None
    redis_tls_key: Path | None = None
    redis_socket_timeout_ms: int = Field(default=50, ge=1, le=60_000)
    redis_server_bin: str = "redis-server"
    redis_aof_rewrite_min_mb: int = Field(default=1024, ge=1)
    """The local ``redis-server``'s ``auto-aof-rewrite-min-size`` (MB): its append-only
    file is rewritten once it has doubled and is at least this large. The stream rewrites
    the same keys over and over, so the file grows fast (5.3 MB/s in Real-time Mode at
    2,000 events/s, in the bench) while the data stays small (22.5 MB): with Redis's 64 MB,
    a rewrite (a fork writing the whole data set, 0.4-1.9 s of a core) started every
    7.5-13 s, 0.13 of a core on a machine the online path needs whole.
    The AOF on disk may grow to this size before it is rewritten. Managed Redis
    (ElastiCache) keeps its own persistence: this only configures the server the project
    starts."""

    # --- Spark ---------------------------------------------------------
    spark_master: str = "local[2]"
    spark_shuffle_partitions: int = Field(default=2, ge=1)
    spark_driver_memory: str = "4g"
    """The driver JVM's heap (``spark.driver.memory``; with ``local[N]`` also the executors').
    The stream holds each micro-batch in it once for its sinks: a batch at the default cap
    (``stream_max_offsets_per_trigger``) did not fit the storage share of a 2 GB heap, went
    to disk in part and was read back by every sink, and 3M drains ran about a fifth
    slower than with 4 GB (docs/streaming-performance.md, "The batch's copy on disk"). A
    batch that spills says so in its line and in a WARNING. A live stream's small batches
    use little of it; the JVM grows its heap only as far as it needs."""
    spark_driver_java_options: str = ""
    """More JVM options for the driver (``spark.driver.extraJavaOptions``, after the
    project's own), e.g. GC or JIT flags."""
    spark_class_archive: bool = True
    """Start Spark's driver JVMs with the class-data-sharing archive ``make setup`` builds
    (:mod:`pipelines.infra.class_archive`): a driver and its first queries started in 16
    rather than 22-26 s here. Off, or without the archive, they load every class as usual."""
    spark_gc: Literal["auto", "parallel", "g1"] = "auto"
    """The garbage collector of Spark's JVMs (the driver, and the executors on a cluster).
    ``auto``: Parallel for throughput work (the micro-batch stream, the Real-time job's
    Parquet sinks' process, backfill, verify), G1 for the Real-time query's driver, whose
    tiles are due within a second. With Parallel the micro-batch stream drained a 400k
    backlog 8-17 % faster than with G1, the JVM's default, in alternating runs
    (docs/streaming-performance.md); its pauses there were at most 0.25 s. A collector named in
    ``spark_driver_java_options`` wins: the project then adds none."""
    spark_codegen_huge_method_limit: int = Field(default=65_535, ge=1, le=65_535)
    """``spark.sql.codegen.hugeMethodLimit``: a whole-stage-generated method longer than
    this (bytecode) runs Spark's per-operator code instead. Above 8,000 bytes the project
    also gives Spark's JVMs ``-XX:-DontCompileHugeMethods``: HotSpot otherwise never
    JIT-compiles such a method, and the validation stage's is about 13,000 bytes (at
    Spark's default without the flag it ran interpreted, 40 % of the stream's JVM
    samples). Compiled as one method it takes about a fifth less CPU than the
    per-operator code that 8,000 gives (which copies every row between five
    projections). HotSpot's C1 compiles it; C2 refuses it, and where C1's profiling tier
    failed on it first, it ran interpreted all the same (docs/streaming-performance.md,
    "The validation stage in the interpreter"). Set 8,000 to get the per-operator code
    back and leave HotSpot's default alone."""
    spark_kafka_connector_version: str | None = None
    """Version of ``spark-sql-kafka-0-10``; default: the installed pyspark's, falling back
    to the newest release that Maven Central has when that one is not published yet."""
    spark_log_level: str = "WARN"
    spark_dataframe_debugging: bool = False
    """PySpark's call-site capture for error messages (``spark.python.sql.dataFrameDebugging.enabled``).
    On, every DataFrame function call (``F.col``, ``select``...) makes several more JVM
    round trips and walks the Python stack: about 0.8 ms more each here (``F.col``:
    1.4 ms against 0.6 ms), and a micro-batch builds a few hundred. Turn it on to debug a plan; errors then name the Python line."""

    # --- features ------------------------------------------------------
    feature_slide_seconds: int = Field(default=60, ge=1)
    """Tile size and snapshot cadence of the sliding windows."""
    feature_allowed_lateness_seconds: int = Field(default=600, ge=0)
    """Events older than the stream's max event time minus this are quarantined as late."""
    feature_top_n: int = Field(default=100, ge=1, le=10_000)
    feature_last_items_n: int = Field(default=10, ge=1, le=100)
    online_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=60)

    # --- backfill / feast ----------------------------------------------
    backfill_step_seconds: int = Field(default=3600, ge=1)
    """Cadence of the backfill's as-of times (one feature snapshot per step between --since
    and --until). ``feature_slide_seconds`` snapshots every tile: exact but costly over months."""

    # --- streaming -----------------------------------------------------
    stream_trigger_seconds: float = Field(default=1.0, ge=0)
    stream_max_offsets_per_trigger: int = Field(default=1_000_000, ge=1)
    """The most records one micro-batch reads (Spark's ``maxOffsetsPerTrigger``): the
    backpressure that bounds a batch's memory and time while the job catches up.
    Every batch rewrites the features of each user and item it touched, and those grow
    more slowly than the batch, so larger batches catch up faster: 500k drained 22-52 %
    faster than 200k here (more with a small store), and 1M 7-12 % faster than 500k
    (alternating drains in one driver: 50.9-52.3k against 46.5-47.4k events/s on 3M of
    the bench's store, 31.7-32.1k against 29.5k on 2M of a 1M-user store), at 15-20 s a
    batch, held in memory with the default ``spark_driver_memory`` (4 GB;
    docs/streaming-performance.md, "The batch's size", "A million records a batch" and
    "The batch's copy on disk"). A live stream's batches are as small as its trigger
    interval makes them; this only caps them."""
    stream_starting_offsets: str = "earliest"
    stream_kafka_attempts: int = Field(default=3, ge=1)
    """How many times the stream asks Kafka for its offsets before the query stops with
    the last error (Spark's ``fetchOffset.numRetries``). With
    ``stream_kafka_timeout_seconds`` it sets how long the job rides out a Kafka outage:
    about attempts x (timeout + 1 s), 3 minutes with the defaults (Spark's). A stopped
    job resumes from its checkpoint when started again."""
    stream_kafka_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long one attempt waits for Kafka (``default.api.timeout.ms`` of the source's
    admin client)."""
    checkpoint_dir: str | None = None
    """Default ``<data_dir>/checkpoints``; URI-capable."""
    stream_dedup: Literal["bucketed", "spark"] = "bucketed"
    """Which operator keeps the micro-batch stream's dedup state
    (:mod:`pipelines.streaming.dedup`). ``bucketed``: shopstream's (a Java class in its
    jar, built with the machine's ``javac``); its state expires a minute of event time at
    a time, and a batch reads only what is due. ``spark``: Spark's
    ``dropDuplicatesWithinWatermark``, which reads every remembered id every batch. Both
    drop the same copies. A checkpoint keeps the operator it was started with."""
    stream_dedup_retention_seconds: int = Field(default=900, ge=1)
    """How long (processing time) an event is remembered for deduplication: a copy read
    by a batch less than this after the first is dropped. The state holds about
    rate x this ids. With ``stream_dedup=spark`` every micro-batch reads all of them
    (0.23-0.5 us of task time each: docs/streaming-performance.md, "The dedup at a
    steady state"), so at full speed 300 s held the job near 50k events/s and 900 s
    would hold it nearer 35k; the ``bucketed`` operator reads only what expires."""
    stream_mode: Literal["microbatch", "realtime"] = "microbatch"
    """``realtime``: the online path runs as a second query in Spark's Real-time Mode
    while the micro-batch query keeps feeding the Parquet sinks."""
    stream_realtime_checkpoint_seconds: int = Field(default=600, ge=5)
    """Real-time Mode batch duration (its epoch): how often it checkpoints. Not a latency,
    but each boundary holds the tiles back: the query sends none for 2.4-3.6 s on 2 cores
    (the epoch's tasks end, the next epoch is planned, 0.7-1.2 s once warm, and its tasks
    start), then the feed drains the burst. At 1,000 events/s, 1-5 probes per boundary
    took over 1 s. So a boundary every 300 s put 1.3-1.7 % of the time over 1 s, more
    than a p99 allows; 600 s halves that. The price: a stop, or a crash, replays the input
    since the last boundary, so a restart catches up on up to this much input."""
    stream_realtime_offline_trigger_seconds: float = Field(default=30.0, ge=0)
    """Real-time Mode: the trigger interval of the micro-batch query that keeps feeding the
    Parquet sinks (raw events, quarantine) while the Real-time query serves the online
    features. The offline store needs no second-level freshness, and every micro-batch
    has a fixed cost (planning, a Parquet file per partition, checkpoint and state store
    commits) taken from the cores the Real-time query and its feeds run on: at 1,000
    events/s on 2 cores, 1 s took the JVM to about 1 core, 10 s to about 0.45. At 2,000
    events/s the sinks' process alone took 0.26-0.27 cores with 10 s and 0.15-0.16 with
    30 s (two pairs of runs): about 1.6 CPU-s a batch, whatever its size."""
    stream_realtime_offline_nice: int = Field(default=19, ge=0, le=19)
    """Real-time Mode: the micro-batch query that feeds the Parquet sinks runs as a process of
    its own (``shopstream stream --offline-only``) this much lower in CPU priority (``nice``),
    so its bursts (2-5 s of both cores every trigger at 1,000 events/s) no longer delay the
    online path: p99 freshness 3.0 -> 0.83 s side by side (``pipelines.streaming.offline_process``).
    19, the lowest, since 2026-11-27: at 10 its JVM still took 0.7-0.9 of a core in every
    burst and the tile feed's lag reached 1-1.6 s in them (two runs of 100 probes at 1,000
    events/s: p99 1.02 and 0.89 s, max 1.06 and 1.55 s); at 19, p99 0.40 and 0.73 s, max
    0.52 and 0.81 s, and its batches still took 3-6 s of each 10 s trigger. It starts at
    the driver's priority and is niced once its query has caught up with the topic (its
    JVM's start and its backlog would take minutes at +19 on a full machine). 0: the same
    priority."""
    stream_realtime_offline_stall_seconds: float = Field(default=300.0, ge=0)
    """Real-time Mode: how long the niced Parquet sinks' process may go without catching up
    with the topic (a batch that read all there was in no longer than its trigger, or an
    idle report: every trigger at most, see ``stream_realtime_offline_trigger_seconds``)
    before the driver gives it its own priority, not ``stream_realtime_offline_nice``, for
    the rest of the run: in place where it may lower a nice value (``CAP_SYS_NICE``), else
    by restarting it. On the slowest machines seen, at 1,000 and 2,000 events/s, a process
    niced from its start had not started its query after 300 s, while Kafka's retention
    ran on (``pipelines.streaming.offline_process``). Keep it several triggers long (and
    longer than a catch-up batch takes); 0: never."""
    stream_realtime_user_cache_tiles: int = Field(default=600_000, ge=0)
    """Real-time Mode: user tiles the tile feed keeps decoded in memory (about 2 KB each),
    so a touched user is not read back from Redis. Size it for the users active in a
    day: beyond it the least recently touched users are read again on their next touch
    (``rt_user_loads`` in ``shopstream status`` then grows about as fast as touches)."""
    stream_realtime_feeds: int = Field(default=2, ge=1, le=64)
    """Real-time Mode: how many tile feeds apply the query's tiles to Redis, each on its
    share of the tile topic's partitions (``p % feeds``; at most that many: the default
    is cut to a topic with fewer, a value set explicitly must fit): the first in the
    driver, with the sales totals and the top lists, the others each a process of its
    own (``pipelines.streaming.feed_process``), so the feed's Python work is no longer
    one thread's. Each keeps the running sums of its own users and items. One feed at
    2,000 events/s on 2 cores: probes p50 0.38 s, p99 1.66 s, and on a slow hour 5-9 s
    behind (one thread took 0.58-0.61 of a core and was still short); two, side by
    side in the same hour: p50 0.12 s, p99 1.26 s, 0.35 of a core each
    (docs/streaming-performance.md, "Two feeds")."""
    stream_realtime_gc_freeze_seconds: float = Field(default=10.0, ge=0)
    """Real-time Mode: how often the tile feed moves what survived a young garbage
    collection out of the cyclic collector's reach (``gc.freeze``), so its full collections
    no longer walk the cached tiles with the GIL held (1-1.6 s pauses at 1,000 events/s
    before; ``pipelines.streaming.heap``). 0: never (CPython's default behaviour)."""
    stream_realtime_gc_young_threshold: int = Field(default=20_000, ge=0)
    """Real-time Mode: CPython's young-generation collection threshold while the tile feed
    runs (``gc.set_threshold``; CPython's default is 700). The feed decodes a dozen
    objects per tile row, so at 700 the cyclic collector took a third of a drain's time,
    in full collections of up to 0.4 s (``pipelines.streaming.heap.YoungThreshold``).
    0: leave CPython's threshold alone."""
    stream_realtime_shape: Literal["tiles", "roles"] = "roles"
    """Real-time Mode: what the query sends its feeds. ``roles`` (the default): each valid,
    deduplicated event once per role, with its source offset, which the feeds fold into
    the same tiles (``pipelines.streaming.folding``): no aggregation in the query, whose
    JVM took 0.13 cores at 1,500 events/s against 0.50 with it
    (``benchmarks/realtime_query.py``), for about 10 us more of the feeds' Python a role
    row; freshness p99 0.25 s against 0.36 s at 2,000 events/s, run back to back
    (docs/streaming-performance.md). ``tiles``: full tiles, from one streaming aggregation
    (``features.tiles.keyed_tiles``). Each shape has its own tile topic (``roles``: ``<kafka_topic_rt_tiles>.roles``)
    and query checkpoint: a switch starts a query afresh (from
    ``stream_starting_offsets``), so make it with an empty online store."""
    stream_realtime_tiles_linger_ms: int = Field(default=5, ge=0)
    """Real-time Mode: how long the query's Kafka sink lets a batch of tiles fill before
    sending it (the producer's ``linger.ms``; its ``batch.size`` still sends a full batch
    at once). At 0 each tile went to the broker in a request of its own as soon as it
    came out: at 2,000 events/s (4,000-5,000 tiles/s) the broker took 20-21 % of a core
    and the query's JVM 41-45 %; at 5 ms, 8 % and 35 %, and the feed's lag stayed at
    0.1 s (2 cores, 60 s windows after 100 s; 20 ms was no cheaper). It adds at most
    this much to a tile's way to Redis."""
    stream_check_key: bool = True
    """The contract's key rule: a record's Kafka key must be present and equal its
    ``user_id``, else it is quarantined (``missing_key`` / ``key_mismatch``). Off: the key
    is only the partitioner's input and is not checked."""
    stream_redis_outage_seconds: float = Field(default=120.0, ge=0)
    """How long a micro-batch keeps retrying its online writes while Redis is unreachable
    (a restart, a failover) before the job fails; the writes are idempotent per batch,
    so a retry after a partial write changes nothing twice. 0: fail at once."""
    stream_stop_grace_seconds: float = Field(default=120.0, ge=0)
    """On a stop (SIGTERM/SIGINT, ``--until-idle``, ``--timeout``): how long the running
    micro-batch may take to finish before the query is stopped in the middle of it (safe:
    the checkpoint replays it on restart, it is only work done twice). Under a process
    manager keep it below its grace period before SIGKILL (Kubernetes'
    ``terminationGracePeriodSeconds``, 30 s by default; systemd's ``TimeoutStopSec``)."""
    stream_batch_log_retain: int = Field(default=100, ge=2)
    """Per-batch clock files kept under the checkpoint (older ones are deleted)."""
    stream_metrics_textfile: str | None = None
    """Prometheus textfile (node-exporter format); default ``<data_dir>/stream/shopstream_stream.prom``
    for a local data dir, none otherwise."""
    spark_standalone_port: int = Field(default=7077, ge=1, le=65535)
    """Master port of the local Spark standalone cluster (``pipelines.infra.spark_standalone``)."""
    spark_standalone_ui_port: int = Field(default=8080, ge=1, le=65535)
    """Master web UI port (its ``/json`` endpoint tells when the worker has registered)."""
    spark_standalone_worker_cores: int = Field(default=2, ge=1)
    spark_standalone_worker_memory: str = "1500m"

    # --- MLflow / training --------------------------------------------
    mlflow_tracking_uri: str | None = None
    """Default: a SQLite store under the data dir."""
    mlflow_experiment: str = "shopstream"
    model_name: str = "shopstream-recommender"

    # --- training ------------------------------------------------------
    train_event_weights: dict[str, float] = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}
    """Implicit-feedback weight of one event per event type; a (user, item) cell is
    ``log1p`` of the summed weights. JSON in the environment: ``{"view": 1, ...}``."""
    train_split: str = Field(default="time", pattern="^(time|user_random)$")
    """``time``: train on the past, test on the following period; ``user_random``: hold out
    a random share of each user's interactions."""
    train_test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    """Share of interactions (the most recent ones for the time split) held out for testing;
    the validation split is carved from the training part the same way."""
    train_test_days: float | None = Field(default=None, gt=0.0)
    """Time split only: the test period is the last N days instead of a share of rows."""
    train_eval_ks: list[int] = [5, 10, 20]
    """Cut-offs k for precision/recall/NDCG/MAP/hit rate/coverage@k."""
    train_gate_metric: str = "ndcg@10"
    """Metric that ranks models and gates promotion to ``champion`` (``name@k``)."""
    train_promotion_margin: float = Field(default=0.0, ge=0.0)
    """A challenger becomes champion only if its gate metric exceeds the champion's, measured
    on the same test split, by more than this relative margin (0.02 = 2 % better)."""
    train_score_top_n: int = Field(default=100, ge=1, le=1000)
    """Recommendations per user (and similar items per item) written to Redis by batch scoring."""
    train_score_chunk: int = Field(default=1000, ge=1)
    """Users (or items) per pipelined Redis round trip while batch scoring."""
    train_seed: int = 42
    """Seed for the random split, model initialisation and sampling."""
    train_feature_service: str = "ranking_v1"
    """Feast feature service the learning-to-rank model reads its features from."""

    # --- serving -------------------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    api_workers: int = Field(default=1, ge=1, le=64)
    api_key: SecretStr | None = None
    """When set, every API route but /healthz needs header ``X-API-Key``."""
    api_access_log: bool = False
    """uvicorn's per-request access log; off by default because it costs latency."""
    api_limit_concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight per worker beyond which uvicorn answers 503 (none: unlimited)."""
    api_keep_alive_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How long an idle keep-alive connection stays open before the server closes it
    (uvicorn's ``timeout_keep_alive``). Behind a load balancer that reuses its connections
    (an AWS ALB keeps them 60 s idle), set it above the balancer's idle timeout: otherwise
    the balancer now and then sends a request on a connection the server is closing, and
    its client gets a 502."""
    serving_deadline_ms: int = Field(default=200, ge=5, le=60_000)
    """Budget for all Redis work of one API request; past it the API answers degraded or 503.
    Each single Redis read is also bounded by ``redis_socket_timeout_ms``."""
    serving_redis_connect_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    """Connect timeout of the serving Redis pool (the pipelines' clients wait longer)."""
    serving_redis_max_connections: int = Field(default=32, ge=1, le=10_000)
    """Size of each serving process's Redis connection pool."""
    serving_breaker_failures: int = Field(default=3, ge=1, le=1000)
    """Consecutive failed Redis round trips after which serving stops trying for a while
    (a single slow reply only degrades its own request)."""
    serving_breaker_cooldown_ms: int = Field(default=500, ge=0, le=600_000)
    """Once that many failed in a row, answer from memory for this long before trying again."""
    serving_refresh_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Cadence of the API's background refresh of the last-known global top sellers."""
    serving_fallback_window: str = Field(default="24h", pattern=r"^(1h|24h)$")
    """Window of the top sellers served to cold-start users and when Redis is down."""
    serving_fallback_size: int = Field(default=100, ge=1, le=1000)
    """Items of each last-known top-sellers list kept in memory for degraded answers."""
    serving_candidates: int = Field(default=50, ge=1, le=10_000)
    """Model candidates read per recommendation request before re-ranking (the best of the
    ``train_score_top_n`` that batch scoring writes; fewer is faster)."""
    serving_category_boost: float = Field(default=0.5, ge=0, le=10)
    """Re-ranking: relative boost of a candidate whose category the user was active in
    during the last hour (0 disables)."""
    serving_trending_share: float = Field(default=0.2, ge=0, le=1)
    """Re-ranking: share of the answer given to items trending in the user's region."""
    serving_trending_window: str = Field(default="1h", pattern=r"^(1h|24h)$")
    """Window of the trending list mixed into recommendations."""
    serving_item_cache_size: int = Field(default=200_000, ge=0)
    """Item -> category entries cached in process (categories change rarely)."""
    serving_item_cache_ttl_seconds: float = Field(default=600.0, ge=0)
    """How long a cached item -> category entry is trusted."""

    # --- replay --------------------------------------------------------
    shared_data_dir: Path = Path("../shared/data")
    """Folder of the real data sets that ``shopstream replay`` presets read (relative to the
    working directory, i.e. the repo root, unless absolute)."""

    # --- validators ----------------------------------------------------
    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        for part in value.split(","):
            parse_host_port(part)
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must start with redis://, rediss:// or unix://")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("needs a host, e.g. redis://127.0.0.1:6379/0")
        return value

    @field_validator("kafka_security_protocol")
    @classmethod
    def _check_protocol(cls, value: str) -> str:
        allowed = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        if value.upper() not in allowed:
            raise ValueError(f"must be one of {sorted(allowed)}")
        return value.upper()

    @model_validator(mode="after")
    def _check_sasl(self) -> Settings:
        if self.kafka_security_protocol.startswith("SASL") and not self.kafka_sasl_mechanism:
            raise ValueError("kafka_sasl_mechanism is required with a SASL security protocol")
        return self

    # --- derived values ------------------------------------------------
    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a child process (the ``shopstream`` CLI, a second Spark
        driver) that must run with these settings: ``base`` (default: this process's
        environment) without any ``SHOPSTREAM_*`` variable, plus every setting given
        explicitly, secrets included, since the child connects like the parent. Never log it.
        """
        import json
        import os

        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(ENV_PREFIX)}
        for name in sorted(self.model_fields_set):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, dict | list):
                value = json.dumps(value)
            env[ENV_PREFIX + name.upper()] = str(value)
        return env

    @property
    def is_local_data_dir(self) -> bool:
        return "://" not in self.data_dir or self.data_dir.startswith("file://")

    def data_path(self, *parts: str) -> str:
        """A path (or URI) under the data dir, for Spark and pyarrow alike."""
        base = self.data_dir.rstrip("/")
        if self.is_local_data_dir:
            base = str(Path(base.removeprefix("file://")).expanduser().resolve())
        return "/".join([base, *parts])

    @property
    def run_path(self) -> Path:
        """Local folder for server processes (always a local path)."""
        return Path(self.run_dir).expanduser().resolve() if self.run_dir else Path(
            self.data_path("run")
        )

    @property
    def checkpoint_path(self) -> str:
        return self.checkpoint_dir or self.data_path("checkpoints")

    @property
    def offline_path(self) -> str:
        """Root of the Parquet offline store (raw events, quarantine, snapshots)."""
        return self.data_path("offline")

    @property
    def tracking_uri(self) -> str:
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        return "sqlite:///" + self.data_path("mlflow", "mlflow.db")

    @property
    def mlflow_artifact_root(self) -> str:
        return self.data_path("mlflow", "artifacts")

    @cached_property
    def kafka_bootstrap(self) -> list[HostPort]:
        return [parse_host_port(p) for p in self.kafka_bootstrap_servers.split(",")]

    @property
    def redis_address(self) -> HostPort:
        parts = urlsplit(self.redis_url)
        return HostPort((parts.hostname or "127.0.0.1", parts.port or 6379))

    @property
    def redis_db(self) -> int:
        path = urlsplit(self.redis_url).path.strip("/")
        return int(path) if path.isdigit() else 0

    @property
    def redis_tls(self) -> bool:
        return urlsplit(self.redis_url).scheme == "rediss"

    def redis_secret(self) -> str | None:
        """The Redis password from the setting or from the URL, never logged."""
        if self.redis_password is not None:
            return self.redis_password.get_secret_value()
        return urlsplit(self.redis_url).password

    @property
    def redis_url_redacted(self) -> str:
        """The Redis URL with any password masked, for logs and status."""
        parts = urlsplit(self.redis_url)
        if parts.password is None:
            return self.redis_url
        netloc = f"{parts.username or ''}:***@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def kafka_client_config(self) -> dict[str, object]:
        """Security options shared by kafka-python producers, consumers and admin clients."""
        cfg: dict[str, object] = {
            "bootstrap_servers": self.kafka_bootstrap_servers.split(","),
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            cfg["sasl_mechanism"] = self.kafka_sasl_mechanism
            cfg["sasl_plain_username"] = self.kafka_sasl_username
            if self.kafka_sasl_password is not None:
                cfg["sasl_plain_password"] = self.kafka_sasl_password.get_secret_value()
        return cfg

    @property
    def kafka_outage_seconds(self) -> float:
        """How long the stream rides out a Kafka outage: Spark's source makes
        ``stream_kafka_attempts`` attempts of ``stream_kafka_timeout_seconds`` (and a second
        between them); the Real-time tile feed waits as long."""
        return self.stream_kafka_attempts * (self.stream_kafka_timeout_seconds + 1.0)

    def spark_kafka_source_options(self) -> dict[str, str]:
        """:meth:`spark_kafka_options` plus how long the stream's source waits out an outage."""
        timeout_ms = int(self.stream_kafka_timeout_seconds * 1000)
        return {
            **self.spark_kafka_options(),
            "fetchOffset.numRetries": str(self.stream_kafka_attempts),
            "kafka.default.api.timeout.ms": str(timeout_ms),
            # the admin client refuses a call timeout below one request's (30 s by default)
            "kafka.request.timeout.ms": str(min(timeout_ms, 30_000)),
        }

    def spark_kafka_options(self) -> dict[str, str]:
        """Options for Spark's native ``kafka`` source and sink."""
        opts = {
            "kafka.bootstrap.servers": self.kafka_bootstrap_servers,
            "kafka.security.protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            opts["kafka.sasl.mechanism"] = self.kafka_sasl_mechanism
            if self.kafka_sasl_password is not None:
                user = self.kafka_sasl_username or ""
                pw = self.kafka_sasl_password.get_secret_value()
                module = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule"
                    if self.kafka_sasl_mechanism.upper().startswith("SCRAM")
                    else "org.apache.kafka.common.security.plain.PlainLoginModule"
                )
                opts["kafka.sasl.jaas.config"] = (
                    f'{module} required username="{user}" password="{pw}";'
                )
        return opts
