"""The Prometheus text registry behind every daemon's `GET /metrics`."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest

from core.metrics import CONTENT_TYPE, Metric, Registry, scrape, serve_metrics
from tests.promtool import check_metrics


def test_render_writes_help_and_type_before_each_family_in_registration_order() -> None:
    registry = Registry()
    registry.counter("b_requests_total", "Requests served.").inc(3)
    registry.gauge("a_queue_depth", "Jobs waiting.").set(7)
    assert registry.render() == (
        "# HELP b_requests_total Requests served.\n"
        "# TYPE b_requests_total counter\n"
        "b_requests_total 3\n"
        "# HELP a_queue_depth Jobs waiting.\n"
        "# TYPE a_queue_depth gauge\n"
        "a_queue_depth 7\n"
    )


def test_a_family_with_no_samples_renders_zero() -> None:
    registry = Registry()
    registry.counter("idle_total", "Nothing happened yet.")
    assert registry.render().splitlines()[-1] == "idle_total 0"


def test_labelled_samples_are_sorted_by_label_and_keys_are_sorted_within_a_sample() -> None:
    registry = Registry()
    requests = registry.counter("requests_total", "Requests by endpoint and status.")
    requests.inc(status="404", endpoint="/versions")
    requests.inc(endpoint="/health", status="200")
    requests.inc(2, status="200", endpoint="/versions")
    samples = [line for line in registry.render().splitlines() if not line.startswith("#")]
    assert samples == [
        'requests_total{endpoint="/health",status="200"} 1',
        'requests_total{endpoint="/versions",status="200"} 2',
        'requests_total{endpoint="/versions",status="404"} 1',
    ]
    assert requests.value(status="200", endpoint="/versions") == 2
    assert requests.value(endpoint="/nowhere", status="200") == 0


def test_label_values_are_escaped() -> None:
    registry = Registry()
    registry.counter("odd_total", "Odd labels.").inc(path='a\\b"c\nd')
    assert registry.render().splitlines()[-1] == 'odd_total{path="a\\\\b\\"c\\nd"} 1'


def test_values_render_as_integers_when_whole_and_as_floats_or_infinities_otherwise() -> None:
    registry = Registry()
    gauge = registry.gauge("g", "A gauge.")
    gauge.set(2.0, kind="whole")
    gauge.set(0.25, kind="fraction")
    gauge.set(float("inf"), kind="up")
    gauge.set(float("-inf"), kind="down")
    gauge.set(-3, kind="negative")
    samples = dict(line.rsplit(" ", 1) for line in registry.render().splitlines() if not line.startswith("#"))
    assert samples == {
        'g{kind="down"}': "-Inf",
        'g{kind="fraction"}': "0.25",
        'g{kind="negative"}': "-3",
        'g{kind="up"}': "+Inf",
        'g{kind="whole"}': "2",
    }


def test_promtool_parses_and_passes_a_page_of_every_odd_value_and_text_and_scrape_reads_it_back() -> None:
    registry = Registry()
    registry.counter("odd_total", 'Help with a \\ backslash, a "quote"\nand a second line.').inc(2, path='/v1/"x"\n\\ü')
    gauge = registry.gauge("odd_value", "Values at the edges of float64.")
    for kind, value in [("nan", float("nan")), ("up", float("inf")), ("down", float("-inf")), ("huge", 1e300)]:
        gauge.set(value, kind=kind)
    gauge.set(2.0**53, kind="inexact")
    gauge.set(5e-324, kind="tiny")
    gauge.set(-(2.0**52), kind="exact")
    registry.gauge("no_samples", "A family nothing was set in.")
    page = registry.render()
    check_metrics(page)
    assert 'odd_value{kind="nan"} NaN' in page and 'odd_value{kind="exact"} -4503599627370496' in page
    assert 'odd_value{kind="inexact"} 9007199254740992.0' in page and 'odd_value{kind="huge"} 1e+300' in page

    async def served() -> dict[str, float]:
        runner, url = await serve_metrics(registry, "127.0.0.1", 0)
        try:
            return await asyncio.to_thread(scrape, url)
        finally:
            await runner.cleanup()

    samples = asyncio.run(served())
    assert math.isnan(samples['odd_value{kind="nan"}']) and samples['odd_value{kind="tiny"}'] == 5e-324
    assert samples['odd_value{kind="down"}'] == float("-inf") and samples["no_samples"] == 0


@pytest.mark.parametrize("name", ["", "9lives", "has-dash", "has space", "ü_total"])
def test_a_name_prometheus_cannot_read_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a Prometheus metric name"):
        Registry().gauge(name, "Bad name.")


def test_callback_gauge_is_read_at_render_time() -> None:
    registry = Registry()
    queue: list[int] = []
    depth = registry.gauge("queue_depth", "Jobs waiting.", lambda: len(queue))
    assert registry.render().splitlines()[-1] == "queue_depth 0"
    queue += [1, 2, 3]
    assert registry.render().splitlines()[-1] == "queue_depth 3"
    assert depth.value() == 3


def test_gauge_can_be_set_and_moved_both_ways() -> None:
    gauge = Registry().gauge("temperature", "Degrees.")
    gauge.set(10)
    gauge.inc(-4)
    gauge.inc(0.5)
    assert gauge.value() == 6.5


def test_counter_refuses_to_decrease_or_be_set() -> None:
    counter = Registry().counter("bytes_total", "Bytes.")
    counter.inc(5)
    with pytest.raises(ValueError, match="cannot decrease"):
        counter.inc(-1)
    with pytest.raises(ValueError, match="only gauges"):
        counter.set(0)
    assert counter.value() == 5


def test_duplicate_metric_names_are_refused_whatever_their_kind() -> None:
    registry = Registry()
    registry.counter("jobs_total", "Jobs.")
    with pytest.raises(ValueError, match="already registered"):
        registry.counter("jobs_total", "Jobs again.")
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("jobs_total", "Jobs as a gauge.")
    assert registry.render().count("# TYPE jobs_total") == 1


def test_metric_kind_must_be_counter_or_gauge() -> None:
    with pytest.raises(ValueError, match="counter or gauge"):
        Metric("h", "histogram", "Not supported.")


def test_serve_metrics_answers_the_registry_on_a_free_port() -> None:
    async def scenario() -> str:
        registry = Registry()
        registry.counter("served_total", "Requests served.").inc(2)
        runner, url = await serve_metrics(registry, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                assert response.status == 200 and response.headers["Content-Type"] == CONTENT_TYPE
                return await response.text()
        finally:
            await runner.cleanup()

    assert "served_total 2" in asyncio.run(scenario()).splitlines()
