import pytest

from lmi_trt.engines import HostFacts, choose_engine, default_batch_size
from lmi_trt.engines.base import EngineError


@pytest.mark.parametrize(
    "rolling_batch,host,kind,why",
    [
        ("auto", HostFacts(True, 2), "trtllm", "2 GPU"),
        ("auto", HostFacts(False, 8), "torch", "tensorrt_llm is not installed"),
        ("auto", HostFacts(True, 0), "torch", "no GPU is visible"),
        ("auto", HostFacts(False, 0), "torch", "not installed and no GPU"),
        ("torch", HostFacts(True, 8), "torch", "option.rolling_batch=torch"),
        ("trtllm", HostFacts(False, 0), "trtllm", "option.rolling_batch=trtllm"),
        ("synthetic", HostFacts(False, 0), "synthetic", "synthetic"),
    ],
)
def test_choose_engine_says_why(rolling_batch, host, kind, why):
    got, reason = choose_engine(rolling_batch, host)
    assert got == kind
    assert why in reason


def test_disable_is_a_clear_error():
    with pytest.raises(EngineError, match="option.rolling_batch=disable"):
        choose_engine("disable", HostFacts(True, 1))


def test_batch_defaults_follow_djl_for_trtllm():
    assert default_batch_size("trtllm", None) == 256
    assert default_batch_size("torch", None) == 32
    assert default_batch_size("torch", 7) == 7
