"""Prometheus metrics for the serving layer, on a registry per application.

Nothing here runs per token: the core reports once per request (first token, end), the HTTP
middleware once per response, and engine gauges are read from ``engine.stats()`` at scrape
time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from lmi_trt.engines.base import ACCEPTED_PER_POSITION, EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets, names and the model_name label follow what vLLM and TensorRT-LLM export, so their
# dashboards read these with the prefix swapped (vllm: → lmi_, trtllm_ → lmi_):
# vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger) and NVIDIA/TensorRT-LLM
# tensorrt_llm/metrics/collector.py (MetricsCollector, "Adapted from" vLLM's).
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
MODEL = "model_name"
LORA = "lora_name"
# finished_reason in vLLM's words (vllm/v1/engine/__init__.py FinishReason: stop, length, abort);
# a failed generation is "error".
_FINISHED_REASON = {
    "eos_token": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "cancelled": "abort",
    "error": "error",
}


# Engine figures that only grow (EngineStats.extra keys), exported as counters under vLLM's names
# (vllm/v1/metrics/loggers.py: vllm:num_preemptions, vllm:prefix_cache_queries and
# vllm:prefix_cache_hits, the last two counted in prompt tokens; vllm/v1/spec_decode/metrics.py
# SpecDecodingProm: vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens and
# _num_accepted_tokens_per_pos{position}).
_ENGINE_COUNTERS = {
    "num_preemptions": "Requests preempted (their KV blocks taken back; they resume by recomputing)",
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache",
    "prefix_cache_hits": "Prompt tokens found in the prefix cache (not computed again)",
    "spec_decode_num_drafts": "Speculative decoding drafts verified (one request's draft tokens in one step)",
    "spec_decode_num_draft_tokens": "Draft tokens verified",
    "spec_decode_num_accepted_tokens": "Draft tokens accepted",
}


class _LiveGauges(Collector):
    """Gauges computed on scrape, so the request path never touches them."""

    def __init__(
        self, model_name: str, in_system: Callable[[], int], engine_stats: Callable[[], EngineStats | None]
    ) -> None:
        self._model_name = model_name
        self._in_system = in_system
        self._engine_stats = engine_stats

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=[MODEL])
        g.add_metric([self._model_name], value)
        return g

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "lmi_requests_in_system", "Generation requests admitted and not finished", value=self._in_system()
        )
        stats = self._engine_stats()
        if stats is None:
            return
        yield self._gauge("lmi_num_requests_running", "Requests the engine is generating for", stats.active_requests)
        yield self._gauge("lmi_num_requests_waiting", "Requests waiting for an engine slot", stats.queued_requests)
        used, total = stats.extra.get("kv_cache_used_blocks"), stats.extra.get("kv_cache_max_blocks")
        if used is not None and total:  # engines that report their KV cache (TensorRT-LLM's KvCacheStats)
            yield self._gauge("lmi_kv_cache_usage_perc", "KV-cache usage, 1 = full", used / total)
        block_size = stats.extra.get("kv_cache_block_size")
        if block_size is not None and total:  # vLLM's cache_config_info: a gauge of 1 whose labels describe the cache
            info = GaugeMetricFamily(
                "lmi_cache_config_info", "The KV cache's configuration", labels=[MODEL, "block_size", "num_gpu_blocks"]
            )
            info.add_metric([self._model_name, str(int(block_size)), str(int(total))], 1)
            yield info
        for key, doc in _ENGINE_COUNTERS.items():
            if key in stats.extra:
                counter = CounterMetricFamily(f"lmi_{key}", doc, labels=[MODEL])
                counter.add_metric([self._model_name], stats.extra[key])
                yield counter
        yield from self._speculation(stats.extra)
        yield GaugeMetricFamily(
            "lmi_engine_active_requests", "Requests the engine is generating for", value=stats.active_requests
        )
        yield GaugeMetricFamily(
            "lmi_engine_queue_depth", "Requests waiting for an engine slot", value=stats.queued_requests
        )
        yield GaugeMetricFamily("lmi_engine_max_batch_size", "Engine batch capacity", value=stats.max_batch_size)
        for key, value in sorted(stats.extra.items()):
            if key not in _ENGINE_COUNTERS and not key.startswith(ACCEPTED_PER_POSITION):
                yield GaugeMetricFamily(f"lmi_engine_{key}", f"Engine statistic {key}", value=value)

    def _speculation(self, extra: dict[str, float]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Drafts accepted per draft position (vLLM's counter, labelled ``position``) and the share of
        draft tokens accepted so far (vLLM 0.x's gauge vllm:spec_decode_draft_acceptance_rate; v1 leaves
        the ratio to PromQL: rate(accepted) / rate(draft tokens))."""
        positions = sorted(
            (int(k.removeprefix(ACCEPTED_PER_POSITION)), v)
            for k, v in extra.items()
            if k.startswith(ACCEPTED_PER_POSITION)
        )
        if positions:
            counter = CounterMetricFamily(
                "lmi_spec_decode_num_accepted_tokens_per_pos",
                "Draft tokens accepted at each draft position",
                labels=[MODEL, "position"],
            )
            for position, value in positions:
                counter.add_metric([self._model_name, str(position)], value)
            yield counter
        drafted = extra.get("spec_decode_num_draft_tokens")
        if drafted:
            yield self._gauge(
                "lmi_spec_decode_draft_acceptance_rate",
                "Share of draft tokens accepted since start (1 = every draft token kept)",
                extra["spec_decode_num_accepted_tokens"] / drafted,
            )


class Metrics:
    """``multiprocess_dir``: one of several front-end processes (option.api_server_count); its counters and
    histograms live in that folder (prometheus_client's multiprocess mode, chosen by PROMETHEUS_MULTIPROC_DIR,
    which the process that starts the front ends sets), and /metrics adds up every front end's, dead ones
    included, so a counter never goes back."""

    def __init__(self, model_name: str = "model", multiprocess_dir: str | None = None) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._view = r
        if multiprocess_dir is not None:
            self._view = CollectorRegistry()
            MultiProcessCollector(self._view, path=multiprocess_dir)
        self.requests = Counter(
            "lmi_http_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.request_latency = Histogram(
            "lmi_http_request_duration_seconds",
            "Time to the end of the response, streams included",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "lmi_requests_rejected", "Requests refused before generation, by status", ["status"], registry=r
        )
        # Per generation, on the shared stems (one model per server: the label is fixed).
        self.ttft = Histogram(
            "lmi_time_to_first_token_seconds",
            "Admission to first generated token",
            [MODEL],
            buckets=_TTFT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.time_per_output_token = Histogram(
            "lmi_time_per_output_token_seconds",
            "Mean time between a request's generated tokens after the first",
            [MODEL],
            buckets=_TPOT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.e2e_latency = Histogram(
            "lmi_e2e_request_latency_seconds",
            "Admission to the end of generation",
            [MODEL],
            buckets=_REQUEST_BUCKETS,
            registry=r,
        ).labels(model_name)
        # vLLM's request_queue_time_seconds (request-latency buckets there too): observed for the
        # engines that report when a request left their queue (EngineOutput.queue_time_s).
        self.queue_time = Histogram(
            "lmi_request_queue_time_seconds",
            "Time a request waited in the engine's queue",
            [MODEL],
            buckets=_REQUEST_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.generation_tokens = Counter("lmi_generation_tokens", "Tokens generated", [MODEL], registry=r).labels(
            model_name
        )
        self.prompt_tokens = Counter("lmi_prompt_tokens", "Prompt tokens admitted", [MODEL], registry=r).labels(
            model_name
        )
        self._success = Counter(
            "lmi_request_success", "Finished generations by finish reason", [MODEL, "finished_reason"], registry=r
        )
        # The same per LoRA adapter (label lora_name, vLLM's word for it in vllm:lora_requests_info); base-model
        # requests count in the totals above only.
        self._lora_success = Counter(
            "lmi_lora_request_success",
            "Finished generations with a LoRA adapter, by adapter and finish reason",
            [MODEL, LORA, "finished_reason"],
            registry=r,
        )
        self._lora_tokens = Counter(
            "lmi_lora_generation_tokens", "Tokens generated with a LoRA adapter, by adapter", [MODEL, LORA], registry=r
        )

    def finished(
        self, reason: str, generated: int, seconds: float, first_token_after: float | None, adapter: str | None = None
    ) -> None:
        """One generation ended (any reason): ``seconds`` since admission, the first token after
        ``first_token_after`` seconds (None when none came); ``adapter``: the LoRA adapter it used."""
        self._success.labels(self.model_name, _FINISHED_REASON.get(reason, reason)).inc()
        if adapter is not None:
            self._lora_success.labels(self.model_name, adapter, _FINISHED_REASON.get(reason, reason)).inc()
            self._lora_tokens.labels(self.model_name, adapter).inc(generated)
        self.generation_tokens.inc(generated)
        self.e2e_latency.observe(seconds)
        if first_token_after is not None and generated > 1:
            self.time_per_output_token.observe((seconds - first_token_after) / (generated - 1))

    def attach_live(self, in_system: Callable[[], int], engine_stats: Callable[[], EngineStats | None]) -> None:
        self._view.register(_LiveGauges(self.model_name, in_system, engine_stats))

    def render(self) -> bytes:
        return generate_latest(self._view)
