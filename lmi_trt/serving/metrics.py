"""Prometheus metrics for the serving layer, on a registry per application.

Nothing here runs per token: the core reports once per request (first token, end), the HTTP
middleware once per response, and engine gauges are read from ``engine.stats()`` at scrape
time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from lmi_trt.engines.base import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _LiveGauges(Collector):
    """Gauges computed on scrape, so the request path never touches them."""

    def __init__(self, in_system: Callable[[], int], engine_stats: Callable[[], EngineStats | None]) -> None:
        self._in_system = in_system
        self._engine_stats = engine_stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "lmi_requests_in_system", "Generation requests admitted and not finished", value=self._in_system()
        )
        stats = self._engine_stats()
        if stats is None:
            return
        yield GaugeMetricFamily(
            "lmi_engine_active_requests", "Requests the engine is generating for", value=stats.active_requests
        )
        yield GaugeMetricFamily("lmi_engine_queue_depth", "Requests waiting for an engine slot", value=stats.queued_requests)
        yield GaugeMetricFamily("lmi_engine_max_batch_size", "Engine batch capacity", value=stats.max_batch_size)
        for key, value in sorted(stats.extra.items()):
            yield GaugeMetricFamily(f"lmi_engine_{key}", f"Engine statistic {key}", value=value)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("lmi_http_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.request_latency = Histogram(
            "lmi_http_request_duration_seconds", "Time to the end of the response, streams included",
            ["route"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            "lmi_time_to_first_token_seconds", "Admission to first generated token", buckets=_TTFT_BUCKETS, registry=r
        )
        self.generation_latency = Histogram(
            "lmi_generation_duration_seconds", "Admission to the end of generation", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.generated_tokens = Counter("lmi_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter("lmi_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.finished = Counter("lmi_generations_finished", "Finished generations by finish reason", ["reason"], registry=r)
        self.rejected = Counter("lmi_requests_rejected", "Requests refused before generation, by status", ["status"], registry=r)

    def attach_live(self, in_system: Callable[[], int], engine_stats: Callable[[], EngineStats | None]) -> None:
        self.registry.register(_LiveGauges(in_system, engine_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
