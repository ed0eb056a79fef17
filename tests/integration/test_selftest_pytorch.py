"""``lmi-trt selftest`` on TensorRT-LLM's PyTorch backend (the Executor path's selftest is in
test_trtllm_engine.py): on 1.x a Hugging Face checkpoint goes to the LLM API, as serve sends it."""

from __future__ import annotations

import pytest
from trtllm_testing import fake_tensorrt_llm


@pytest.mark.parametrize("release", ["1.2.1", "1.3.0"])
def test_selftest_serves_through_the_llm_api_where_serve_would(release, tmp_path, monkeypatch):
    """On 1.x a Hugging Face checkpoint goes to the PyTorch backend (the only one after 1.2, where the
    Executor is gone): selftest follows serve there, through LlmApiEngine, one request and one stream."""
    import lmi_trt.engines.trtllm as engine_module
    import lmi_trt.selftest as selftest

    monkeypatch.setenv("LMI_TRT_FAKE_RELEASE", release)
    monkeypatch.setattr(engine_module, "cuda_available", lambda: True)  # the GPU probe both backends share
    with fake_tensorrt_llm():  # imported afresh: it impersonates LMI_TRT_FAKE_RELEASE
        lines: list[str] = []
        assert selftest.run_selftest(tmp_path, out=lines.append), lines
    assert lines[0].startswith("PASS  TensorRT-LLM backend for a Hugging Face checkpoint: pytorch")
    assert [line.split()[0] for line in lines[:-1]] == ["PASS"] * 6 and lines[-1] == "selftest PASSED"
    assert any("the LLM API (PyTorch backend)" in line for line in lines) and "one stream" in lines[-2]
