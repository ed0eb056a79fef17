"""Every accepted option is honoured by the engine that serves, or refused at startup naming the key
(issue 14: ``option.max_num_sequences`` was silently ignored by torch; ``option.kv_cache_host_memory_bytes``
was parsed and read by nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmi_trt.config import REGISTRY, LmiConfig, StartupError, key_of
from lmi_trt.engines import registry

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_trt"


def _runs(kind: str, trt_backend: str | None, **given) -> LmiConfig:
    config = registry.settle(LmiConfig(**given), kind)
    return config.model_copy(update={"backend": trt_backend}) if trt_backend else config


def _scoped() -> set[str]:
    """Fields some engine's settings (or compile job) read: each is honoured or refused per engine."""
    return {
        name for kind, backend in registry.engine_backends() for name in registry.honoured(kind, _runs(kind, backend))
    } & set(LmiConfig.model_fields)


@pytest.mark.parametrize(("kind", "backend"), registry.engine_backends())
def test_each_engine_scoped_option_is_honoured_or_refused_naming_the_key(kind, backend):
    """Options × engines: an engine-scoped option the user sets is either read by this engine's settings,
    or a StartupError naming its key — never accepted and dropped."""
    used = registry.honoured(kind, _runs(kind, backend))
    for name in sorted(_scoped() - set(registry.HONOURED_ELSEWHERE)):
        config = _runs(kind, backend, **{name: LmiConfig.model_fields[name].default})  # set = given, even if default
        if name in used:
            registry.refuse_ignored(kind, config)  # honoured: no error
            continue
        with pytest.raises(StartupError) as err:
            registry.refuse_ignored(kind, config)
        assert (
            err.value.key == key_of(name)
            and kind in str(err.value)
            and "serve with an engine that does" in str(err.value)
        )


def test_the_issues_examples():
    # max_num_sequences: honoured by every engine (it caps the batch in flight).
    for kind, backend in registry.engine_backends():
        assert "max_num_sequences" in registry.honoured(kind, _runs(kind, backend))
    # A TensorRT-LLM knob on the torch engine, a torch knob on TensorRT-LLM, a build knob on the pytorch backend.
    for kind, backend, given, key in [
        ("torch", None, {"batch_scheduler_policy": "guaranteed_no_evict"}, "option.batch_scheduler_policy"),
        ("trtllm", "tensorrt", {"torch_batching": "static"}, "option.torch_batching"),
        ("trtllm", "pytorch", {"use_fused_mlp": True}, "option.use_fused_mlp"),
    ]:
        with pytest.raises(StartupError, match=re.escape(key)):
            registry.refuse_ignored(kind, _runs(kind, backend, **given))
    # Defaults the user did not set are never refused.
    for kind, backend in registry.engine_backends():
        registry.refuse_ignored(kind, _runs(kind, backend))


def test_every_option_is_read_by_some_stage():
    """A field no module outside config.py reads is an option parsed but ignored: give it a use, or declare
    it in config.IGNORED_KEYS with the reason (logged whenever it is set)."""
    sources = [p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "config.py"]
    explained = {s.attr for s in REGISTRY if s.attr and s.note}  # accepted for compatibility, noted when set
    unread = [
        name
        for name in LmiConfig.model_fields
        if name not in explained and not any(re.search(rf"\.{name}\b|[\"']{name}[\"']", text) for text in sources)
    ]
    assert unread == []


def test_quantization_on_the_pytorch_backend_reads_the_calibration_options_only():
    """option.quantize on the pytorch backend is a calibration stage (lmi_trt.compile.hf_quant): it honours the
    quantization and calibration keys and nothing of the engine build; without option.quantize they are refused."""
    quantized = _runs("trtllm", "pytorch", quantize="fp8", calib_size=8, calib_dataset="calib.txt")
    registry.refuse_ignored("trtllm", quantized)
    assert set(registry.QUANTIZE_OPTIONS) <= registry.honoured("trtllm", quantized)
    with pytest.raises(StartupError, match="option.use_fused_mlp"):
        registry.refuse_ignored("trtllm", _runs("trtllm", "pytorch", quantize="fp8", use_fused_mlp=True))
    with pytest.raises(StartupError, match="option.calib_size"):
        registry.refuse_ignored("trtllm", _runs("trtllm", "pytorch", calib_size=8))
    job = registry.quantize_job(quantized)
    assert (job.options.quantize.value, job.options.calib_size, job.options.calib_dataset) == ("fp8", 8, "calib.txt")
