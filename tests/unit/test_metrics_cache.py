"""/metrics' KV-cache and speculative-decoding figures from an engine's EngineStats.extra: usage, the
cache's configuration and the counters under vLLM's names (vllm/v1/metrics/loggers.py,
vllm/v1/spec_decode/metrics.py), with the lmi_ prefix."""

from __future__ import annotations

from lmi_trt.engines.base import EngineStats
from lmi_trt.engines.replicas import merged_extra
from lmi_trt.serving.metrics import Metrics


def rendered(extra: dict[str, float]) -> str:
    metrics = Metrics("m")
    metrics.attach_live(lambda: 0, lambda: EngineStats(extra=extra))
    return metrics.render().decode()


def test_kv_cache_figures_and_counters():
    extra = {
        "kv_cache_max_blocks": 10.0,
        "kv_cache_used_blocks": 4.0,
        "kv_cache_block_size": 16.0,
        "num_preemptions": 2.0,
        "prefix_cache_queries": 64.0,
        "prefix_cache_hits": 48.0,
    }
    text = rendered(extra)
    assert 'lmi_kv_cache_usage_perc{model_name="m"} 0.4' in text
    assert 'lmi_cache_config_info{block_size="16",model_name="m",num_gpu_blocks="10"} 1.0' in text
    assert "# TYPE lmi_num_preemptions_total counter" in text
    for name, value in [("num_preemptions", 2.0), ("prefix_cache_queries", 64.0), ("prefix_cache_hits", 48.0)]:
        assert f'lmi_{name}_total{{model_name="m"}} {value}' in text
        assert f"lmi_engine_{name} " not in text  # counters, not also gauges
    assert "lmi_engine_kv_cache_used_blocks 4.0" in text


def test_engines_without_a_kv_cache_export_none_of_it():
    text = rendered({"sampled_rows": 3.0})
    assert "lmi_kv_cache_usage_perc" not in text and "lmi_cache_config_info" not in text
    assert "lmi_num_preemptions" not in text and "lmi_engine_sampled_rows 3.0" in text


def test_speculation_figures_on_metrics_under_vllms_names():
    extra = {
        "spec_decode_num_drafts": 10.0,
        "spec_decode_num_draft_tokens": 40.0,
        "spec_decode_num_accepted_tokens": 30.0,
        "spec_decode_num_accepted_tokens_per_pos_0": 10.0,
        "spec_decode_num_accepted_tokens_per_pos_1": 9.0,
        "spec_decode_num_accepted_tokens_per_pos_2": 7.0,
        "spec_decode_num_accepted_tokens_per_pos_3": 4.0,
    }
    text = rendered(extra)
    for name, value in [("num_drafts", 10.0), ("num_draft_tokens", 40.0), ("num_accepted_tokens", 30.0)]:
        assert f'lmi_spec_decode_{name}_total{{model_name="m"}} {value}' in text
    assert 'lmi_spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 9.0' in text
    assert 'lmi_spec_decode_draft_acceptance_rate{model_name="m"} 0.75' in text
    assert "lmi_engine_spec_decode" not in text  # counters, not also gauges
    # Several model copies add theirs up.
    both = merged_extra([EngineStats(extra=extra), EngineStats(extra=extra)])
    assert both["spec_decode_num_accepted_tokens_per_pos_3"] == 8.0 and both["spec_decode_num_drafts"] == 20.0
