"""Every accepted option is honoured by the engine that serves, or refused at startup naming the key
(issue 14: ``option.max_num_sequences`` was silently ignored by torch; ``option.kv_cache_host_memory_bytes``
was parsed and read by nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmi_trt import stages
from lmi_trt.config import REGISTRY, LmiConfig, StartupError, key_of
from lmi_trt.engines.registry import ENTRIES, PYTORCH, TENSORRT, TORCH, EngineEntry

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_trt"


def _runs(served: EngineEntry, **given) -> LmiConfig:
    config = stages.settle(LmiConfig(**given), served.engine)
    return config.model_copy(update={"backend": served.backend}) if served.backend else config


def _scoped() -> set[str]:
    """Fields some entry's settings (or compile job) read: each is honoured or refused per entry."""
    return {name for e in ENTRIES for name in stages.honoured(e, _runs(e))} & set(LmiConfig.model_fields)


@pytest.mark.parametrize("served", ENTRIES, ids=lambda e: e.label)
def test_each_engine_scoped_option_is_honoured_or_refused_naming_the_key(served):
    """Options × entries: an engine-scoped option the user sets is either read by this entry's settings,
    or a StartupError naming its key — never accepted and dropped."""
    used = stages.honoured(served, _runs(served))
    for name in sorted(_scoped() - set(stages.HONOURED_ELSEWHERE)):
        config = _runs(served, **{name: LmiConfig.model_fields[name].default})  # set = given, even if default
        if name in used:
            stages.refuse_ignored(served, config)  # honoured: no error
            continue
        with pytest.raises(StartupError) as err:
            stages.refuse_ignored(served, config)
        assert (
            err.value.key == key_of(name)
            and served.engine in str(err.value)
            and "serve with an engine that does" in str(err.value)
        )


def test_the_issues_examples():
    # max_num_sequences: honoured by every engine (it caps the batch in flight).
    for served in ENTRIES:
        assert "max_num_sequences" in stages.honoured(served, _runs(served))
    # A TensorRT-LLM knob on the torch engine, a torch knob on TensorRT-LLM, a build knob on the pytorch backend.
    for served, given, key in [
        (TORCH, {"batch_scheduler_policy": "guaranteed_no_evict"}, "option.batch_scheduler_policy"),
        (TENSORRT, {"torch_batching": "static"}, "option.torch_batching"),
        (PYTORCH, {"use_fused_mlp": True}, "option.use_fused_mlp"),
    ]:
        with pytest.raises(StartupError, match=re.escape(key)):
            stages.refuse_ignored(served, _runs(served, **given))
    # Defaults the user did not set are never refused.
    for served in ENTRIES:
        stages.refuse_ignored(served, _runs(served))


def test_every_option_is_read_by_some_stage():
    """A field no module but the configuration's (keys.py declares, config.py parses) reads is an option parsed but
    ignored: give it a use, or declare it in keys.IGNORED_KEYS with the reason (logged whenever it is set)."""
    sources = [p.read_text() for p in PACKAGE.rglob("*.py") if p.name not in ("config.py", "keys.py")]
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
    quantized = _runs(PYTORCH, quantize="fp8", calib_size=8, calib_dataset="calib.txt")
    stages.refuse_ignored(PYTORCH, quantized)
    assert set(stages.QUANTIZE_OPTIONS) <= stages.honoured(PYTORCH, quantized)
    with pytest.raises(StartupError, match="option.use_fused_mlp"):
        stages.refuse_ignored(PYTORCH, _runs(PYTORCH, quantize="fp8", use_fused_mlp=True))
    with pytest.raises(StartupError, match="option.calib_size"):
        stages.refuse_ignored(PYTORCH, _runs(PYTORCH, calib_size=8))
    job = stages.quantize_job(quantized)
    options = job.options
    assert (options.quantize.value, options.calib_size, options.calib_dataset) == ("fp8", 8, Path("calib.txt"))
