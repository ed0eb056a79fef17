import pytest

from lmi_trt.config import ConfigError, LmiConfig, load_config
from lmi_trt.engines import HostFacts, choose_engine
from lmi_trt.stages import settle


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
    # Refused by the configuration itself (issue 14): accepted, then failing in the engine choice, it ended
    # in a traceback and exit 1.
    with pytest.raises(ConfigError, match=r"option.rolling_batch='disable' is DJL's request-at-a-time mode"):
        load_config(overrides={"option.rolling_batch": "disable"}, env={"HF_MODEL_ID": "m"})


def test_batch_defaults_follow_djl_for_trtllm():
    assert settle(LmiConfig(), "trtllm").max_rolling_batch_size == 256
    assert settle(LmiConfig(), "torch").max_rolling_batch_size == 32
    assert settle(LmiConfig(max_rolling_batch_size=7), "torch").max_rolling_batch_size == 7
