"""Serving metrics: per-instance numbers in Prometheus' text format."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from serving.metrics import ServingMetrics


def _samples(metrics: ServingMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_latency_histogram_is_cumulative_per_route_template() -> None:
    m = ServingMetrics()
    m.observe("/v1/users/{user_id}/recommendations", "GET", 200, 0.0007)
    m.observe("/v1/users/{user_id}/recommendations", "GET", 200, 0.001)  # on a bucket bound
    m.observe("/v1/users/{user_id}/recommendations", "GET", 200, 0.003)
    samples = _samples(m)
    labels = (("method", "GET"), ("route", "/v1/users/{user_id}/recommendations"), ("status", "200"))

    def bucket(le: str) -> float:
        return samples[("shopstream_api_request_duration_seconds_bucket", tuple(sorted((*labels, ("le", le)))))]

    assert bucket("0.0005") == 0 and bucket("0.001") == 2 and bucket("0.005") == 3 and bucket("+Inf") == 3
    assert samples[("shopstream_api_request_duration_seconds_count", labels)] == 3
    assert abs(samples[("shopstream_api_request_duration_seconds_sum", labels)] - 0.0047) < 1e-12


def test_errors_fallbacks_and_redis_state() -> None:
    m = ServingMetrics()
    m.observe("/v1/top-sellers", "GET", 503, 0.2)
    m.observe("/v1/top-sellers", "GET", 200, 0.001)
    m.fallback("cold_start")
    m.fallback("cold_start")
    m.redis_error("timeout")
    m.set_redis_up(False)
    samples = _samples(m)
    assert samples[("shopstream_api_errors_total", (("route", "/v1/top-sellers"), ("status", "503")))] == 1
    assert samples[("shopstream_serving_fallbacks_total", (("reason", "cold_start"),))] == 2
    assert samples[("shopstream_serving_redis_errors_total", (("kind", "timeout"),))] == 1
    assert samples[("shopstream_serving_redis_up", ())] == 0


def test_two_instances_do_not_share_numbers() -> None:
    a, b = ServingMetrics(), ServingMetrics()
    a.fallback("degraded")
    assert ("shopstream_serving_fallbacks_total", (("reason", "degraded"),)) not in _samples(b)


def _value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_workers_sharing_a_folder_answer_the_sum(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from serving.metrics import ServingMetrics

    route = "/v1/users/{user_id}/recommendations"
    count = f'shopstream_api_request_duration_seconds_count{{method="GET",route="{route}",status="200"}}'
    me = ServingMetrics(share_dir=tmp_path)
    other = ServingMetrics(share_dir=tmp_path)
    other._pid = 2**22 + 12345  # another worker (no such process: it exited)
    for _ in range(3):
        me.observe(route, "GET", 200, 0.0004)
    other.observe(route, "GET", 200, 0.003)
    other.fallback("cold_start")
    other.set_redis_up(False)
    other.publish()
    text = me.render().decode()
    assert _value(text, count) == 4  # 3 here + 1 published by the other worker
    assert _value(text, 'shopstream_serving_fallbacks_total{reason="cold_start"}') == 1
    # the exited worker's counts stay; its gauge does not (only live workers' redis_up)
    assert _value(text, "shopstream_serving_redis_up") == 1.0
    assert _value(text, "shopstream_api_workers") == 1
    assert json.loads((tmp_path / f"{me._pid}.json").read_text())["pid"] == me._pid


def test_a_single_worker_reports_itself_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from serving.metrics import ServingMetrics

    alone = ServingMetrics()
    alone.observe("/healthz", "GET", 200, 0.0001)
    alone.publish()  # no folder: nothing written
    assert list(tmp_path.iterdir()) == []
    assert _value(alone.render().decode(), "shopstream_api_workers") == 1
