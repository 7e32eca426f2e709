"""Counters and gauges rendered in the Prometheus text format, for every daemon's `GET /metrics`, and a reader.

A deliberately small registry: metric families with optional labels, updated from one event loop (or
under the GIL from threads: each update is a single dict operation), rendered on request.
"""

from __future__ import annotations

import math
import re
import urllib.request
from collections.abc import Callable

from aiohttp import web

LabelKey = tuple[tuple[str, str], ...]
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _escape(value: str) -> str:
    """A label value as the text format writes it: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    """A HELP text as the text format writes it: backslash and line feed escaped (quotes stay)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_labels(labels: LabelKey) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _format_value(value: float) -> str:
    """A sample value: `NaN`, `+Inf` and `-Inf` as the format spells them, whole numbers without a fraction while
    they are exact (below 2**53), anything else as Python's shortest round-tripping repr."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


class Metric:
    """One metric family: `counter` (only `inc`) or `gauge` (`set`, `inc`, or a callback read at render time)."""

    def __init__(self, name: str, kind: str, help_text: str, read: Callable[[], float] | None = None) -> None:
        if kind not in ("counter", "gauge"):
            raise ValueError(f"metric kind must be counter or gauge, got {kind!r}")
        self.name, self.kind, self.help = name, kind, help_text
        self._values: dict[LabelKey, float] = {}
        self._read = read

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if self.kind == "counter" and amount < 0:
            raise ValueError(f"counter {self.name} cannot decrease")
        key = tuple(sorted(labels.items()))
        self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        if self.kind != "gauge":
            raise ValueError(f"{self.name} is a counter; only gauges can be set")
        self._values[tuple(sorted(labels.items()))] = value

    def value(self, **labels: str) -> float:
        if self._read is not None:
            return self._read()
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        if self._read is not None:
            lines.append(f"{self.name} {_format_value(self._read())}")
        else:
            values = self._values or {(): 0.0}
            lines += [f"{self.name}{_format_labels(k)} {_format_value(v)}" for k, v in sorted(values.items())]
        return lines


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def counter(self, name: str, help_text: str) -> Metric:
        return self._add(Metric(name, "counter", help_text))

    def gauge(self, name: str, help_text: str, read: Callable[[], float] | None = None) -> Metric:
        return self._add(Metric(name, "gauge", help_text, read))

    def _add(self, metric: Metric) -> Metric:
        if not METRIC_NAME.fullmatch(metric.name):
            raise ValueError(f"{metric.name!r} is not a Prometheus metric name")
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        return "\n".join(line for m in self._metrics.values() for line in m.render()) + "\n"


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the Prometheus text format, as scrapers ask for it


def metrics_response(registry: Registry) -> web.Response:
    """The answer to `GET /metrics`: the registry rendered now."""
    return web.Response(body=registry.render().encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})


async def serve_metrics(registry: Registry, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serves `GET /metrics` for a daemon that has no HTTP server of its own, on `port` (0: any free one).

    Returns the runner (call `cleanup()` to stop) and the URL it answers on.
    """

    async def metrics(_: web.Request) -> web.Response:
        return metrics_response(registry)

    from core.serving import serve  # core.serving is aiohttp's; the metrics registry alone needs none of it

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    served = await serve(app, host, port, name="metrics")
    return served.runner, f"http://{host}:{served.port}/metrics"


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """Reads one of our daemons' `/metrics` pages: `{'name{labels}': value}` for every sample line.

    Blocking (urllib); for tools that watch a daemon from outside (`prime-devnet up`), not for the daemons.
    """
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read(4 * 1024 * 1024).decode("utf-8", "replace")
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            samples[name] = float(value)
        except ValueError:
            continue  # not a sample line: skip it rather than fail the whole page
    return samples
