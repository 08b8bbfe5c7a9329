"""Security end to end: one redis-server with TLS (``rediss://``, a CA the test makes), an
ACL user with a password (the default user off), used by the three jobs as a user runs
them, each a real subprocess configured by ``SHOPSTREAM_*`` only:

* ``shopstream stream --available-now`` writes the features over TLS as the ACL user;
* ``shopstream train --model popularity`` trains on what the stream stored and its batch
  scoring publishes the model's lists and the live pointer over TLS;
* ``shopstream serve`` answers with the API key required (401 without it or with a
  wrong one), the published model live (ids that would reach outside their key
  namespace are tested on the fuzzing module's server: ``test_fuzz.py``);

then every file the run wrote (job output, server logs, metrics files, MLflow's store)
is searched for the Redis password and the API key: neither may appear, except in the
redis-server's own 0600 config that holds the password by necessity.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from features.online_keys import live_model_key, stream_progress_key
from pipelines.connections import redis_client
from pipelines.infra import RedisServer
from pipelines.settings import Settings
from tests.conftest import free_port
from tests.integration.test_stream import create_topic, produce, stream_settings, wave1
from tests.reliability.helpers import CliProcess, tail, topic_name, wait_for
from tests.tls import make_certificates

pytestmark = [pytest.mark.reliability, pytest.mark.integration]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

REDIS_PASSWORD = "s3cret-Redis-pw-4f1d9a"
API_KEY = "s3cret-api-key-77c2e0b1"
STARTUP_BOUND_S = 120.0


def _secure(make_settings: Callable[..., Settings], tmp_path: Path) -> tuple[Settings, RedisServer]:
    certs = make_certificates(tmp_path / "certs")
    topic = topic_name("secure", tmp_path)
    settings = stream_settings(
        make_settings, tmp_path, topic,
        redis_url=f"rediss://127.0.0.1:{free_port()}/0", redis_username="shopstream",
        redis_password=REDIS_PASSWORD, redis_tls_ca_cert=certs.ca_cert,
        redis_tls_cert=certs.cert, redis_tls_key=certs.key, run_dir=str(tmp_path / "run"),
        api_port=free_port(), api_key=API_KEY, redis_socket_timeout_ms=2000,
        serving_deadline_ms=3000, stream_max_offsets_per_trigger=2000,
    )
    server = RedisServer(settings)
    server.start()
    try:
        client = redis_client(settings, timeout_ms=3000)
        assert client.acl_whoami() == "shopstream"
        assert client.connection_pool.connection_class.__name__ == "SSLConnection"
        client.close()
    except BaseException:
        server.stop()
        raise
    return settings, server


def _scan_for_secrets(tmp_path: Path, server: RedisServer) -> int:
    """Every file under ``tmp_path`` but the server's config and data: no secret in any."""
    conf = server.home / "redis.conf"
    assert REDIS_PASSWORD in conf.read_text() and oct(conf.stat().st_mode & 0o777) == "0o600"
    leaks = []
    scanned = 0
    for path in tmp_path.rglob("*"):
        if not path.is_file() or path == conf or path.stat().st_size > 50 * 1024 * 1024:
            continue
        if server.home / "data" in path.parents:  # the Redis data files: not logs
            continue
        data = path.read_bytes()
        scanned += 1
        for secret in (REDIS_PASSWORD, API_KEY):
            if secret.encode() in data:
                leaks.append(f"{path.relative_to(tmp_path)}: {secret[:8]}...")
    assert not leaks, leaks
    return scanned


def test_stream_and_training_over_tls_as_an_acl_user_leak_no_secret(
    make_settings: Callable[..., Settings], kafka_broker: Any, tmp_path: Path,
) -> None:
    settings, server = _secure(make_settings, tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        client = redis_client(settings, timeout_ms=3000)
        create_topic(settings, settings.kafka_topic_events)
        produce(settings, wave1())

        stream = CliProcess(settings, ["stream", "--available-now"], logs / "stream.log")
        assert stream.wait(timeout=900) == 0, tail(logs / "stream.log")
        progress = client.hgetall(stream_progress_key())
        assert int(progress[b"total_on_time"]) > 1000
        assert client.dbsize() > 100

        train = CliProcess(settings, ["train", "--model", "popularity", "--no-features"],
                           logs / "train.log", COLUMNS="120")
        assert train.wait(timeout=900) == 0, tail(logs / "train.log")
        live = client.get(live_model_key())
        assert live is not None, tail(logs / "train.log")
        published = [k for k in client.scan_iter(match=f"*:{live.decode()}:*", count=1000)]
        assert published, "batch scoring wrote nothing"  # its lists, over TLS as the ACL user
        client.close()
    finally:
        server.stop()
    scanned = _scan_for_secrets(tmp_path, server)
    print(f"stream + train over rediss:// as an ACL user; scanned {scanned} files: no secret")
    assert scanned > 10


def test_api_over_tls_as_an_acl_user_with_its_key_leaks_no_secret(
    make_settings: Callable[..., Settings], tmp_path: Path,
) -> None:
    from tests.integration.test_serving_data import KNOWN_USER, seed_store

    settings, server = _secure(make_settings, tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    serve: CliProcess | None = None
    try:
        client = redis_client(settings, timeout_ms=3000)
        seed_store(client, settings)
        client.close()
        serve = CliProcess(settings, ["serve"], logs / "serve.log", cwd=tmp_path)
        base = f"http://127.0.0.1:{settings.api_port}"
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200,
                 timeout=STARTUP_BOUND_S, what="serve healthy", alive=serve.alive,
                 log=logs / "serve.log")
        with httpx.Client(base_url=base, timeout=10.0) as http:
            assert http.get("/v1/top-sellers").status_code == 401
            assert http.get("/v1/top-sellers", headers={"X-API-Key": API_KEY[:-1]}).status_code == 401
            ok = http.get("/v1/top-sellers", headers={"X-API-Key": API_KEY})
            assert ok.status_code == 200 and ok.json()["items"], ok.text
            recs = http.get(f"/v1/users/{KNOWN_USER}/recommendations",
                            headers={"X-API-Key": API_KEY}).json()
            assert recs["known_user"] is True and recs["degraded"] is False
    finally:
        if serve is not None:
            serve.kill(2)
            serve.stop()
        server.stop()
    _scan_for_secrets(tmp_path, server)
