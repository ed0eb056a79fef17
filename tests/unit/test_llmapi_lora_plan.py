"""LoRA on the LLM API engine as pure functions, per release: option.enable_lora / max_loras / max_lora_rank /
max_cpu_loras as the release's ``LoraConfig`` (built by the fake's class, whose fields are the listing's,
tests/fakes/llmapi_surface.py), CUDA graphs beside adapters, and what is refused, naming the key and the release."""

from __future__ import annotations

import inspect

import pytest
from packaging.version import Version
from test_fake_surface import load_assignments
from trtllm_testing import FAKES, fake_tensorrt_llm

from lmi_trt.config import LmiConfig
from lmi_trt.engines.llmapi import (
    LORA_MODULES,
    checkpoint_quantization,
    llm_configs,
    llm_plan,
    release_capabilities,
)
from lmi_trt.engines.trtllm import TrtllmConfigError
from lmi_trt.stages import llmapi_settings, settle

SURFACE = load_assignments(FAKES / "llmapi_surface.py")["SURFACE"]["tensorrt_llm.llmapi"]
# 1.3.0rc1 and rc2: either side of PR 8279 (CUDA graphs beside LoRA), so the engine and the fake must agree
RELEASES = ["1.0.0", "1.1.0", "1.2.1", "1.3.0rc1", "1.3.0rc2"]


def plan(release: str, **options):
    return llm_plan(llmapi_settings(settle(LmiConfig(enable_lora=True, **options), "trtllm")), Version(release))


@pytest.mark.parametrize("release", RELEASES)
def test_djl_keys_become_the_releases_lora_config(release):
    planned = plan(release, max_loras=3, max_lora_rank=8, max_cpu_loras=6)
    assert planned.lora_config == {
        "lora_dir": [],
        "max_lora_rank": 8,
        "max_loras": 3,
        "max_cpu_loras": 6,
        "lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"],
    }
    assert planned.origins["lora_config.max_loras"] == "option.max_loras"
    # the listed LoraConfig takes every keyword; the fake's class (the listing's) builds it
    listed = {p.split("=")[0] for p in SURFACE["LoraConfig"]["ctor"][0]}
    assert set(planned.lora_config) <= listed
    with fake_tensorrt_llm(release):
        import tensorrt_llm.llmapi

        built = llm_configs(tensorrt_llm.llmapi, planned, release)["lora_config"]
        assert type(built).__module__ == "tensorrt_llm.lora_helper" and built.max_lora_rank == 8
    assert set(LORA_MODULES) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.parametrize("release", RELEASES)
def test_cuda_graphs_are_off_beside_adapters_before_13rc2_and_a_request_for_them_is_refused(release):
    planned = plan(release)
    before_13 = Version(release) < Version("1.3.0rc2")  # PR 8279, merged after the 1.3.0rc1 bump
    assert (planned.cuda_graph_config is None) == before_13
    if before_13:
        assert "PR 5480" in planned.origins["cuda_graph_config"]
        with pytest.raises(TrtllmConfigError, match=rf"option.use_cuda_graph=true .*TensorRT-LLM {release}"):
            plan(release, use_cuda_graph=True)
    else:
        assert plan(release, use_cuda_graph=True).cuda_graph_config == {}
    assert plan(release, use_cuda_graph=False).cuda_graph_config is None


@pytest.mark.parametrize("release", RELEASES)
def test_a_lora_config_field_the_release_lacks_or_no_lora_config_at_all_is_a_start_up_error(release, monkeypatch):
    import dataclasses
    import sys

    planned = plan(release)
    with fake_tensorrt_llm(release):
        import tensorrt_llm.llmapi

        # swap_gate_up_proj: in one copy of the real class only (lora_helper.py id 53470212518), not in the others
        # (ids 2545972156, 388674781, 56112947133)
        extra = dataclasses.replace(planned, lora_config={**planned.lora_config, "swap_gate_up_proj": False})
        with pytest.raises(TrtllmConfigError, match=rf"option.enable_lora=true: TensorRT-LLM {release} refuses"):
            llm_configs(tensorrt_llm.llmapi, extra, release)
        # a release where neither path holds LoraConfig: named, not a bare ImportError
        monkeypatch.setitem(sys.modules, "tensorrt_llm.lora_helper", None)
        with pytest.raises(TrtllmConfigError, match=rf"option.enable_lora=true: TensorRT-LLM {release} has no Lora"):
            llm_configs(tensorrt_llm.llmapi, planned, release)


def test_the_pytorch_backend_takes_ranks_and_cache_sizes_beyond_the_torch_engines():
    """LoraConfig.max_lora_rank defaults to 64 and the cache sizes are plain ints (lora_helper.py, every copy read):
    the keys' parsers bound only from below (their second number is the error message's example)."""
    from lmi_trt.config import load_config

    keys = {"option.model_id": "/models/m", "option.enable_lora": "true", "option.max_lora_rank": "64"}
    config = load_config(overrides={**keys, "option.max_loras": "32", "option.max_cpu_loras": "64"})
    planned = llm_plan(llmapi_settings(settle(config, "trtllm")), Version("1.2.1"))
    assert {k: planned.lora_config[k] for k in ("max_lora_rank", "max_loras", "max_cpu_loras")} == {
        "max_lora_rank": 64,
        "max_loras": 32,
        "max_cpu_loras": 64,
    }


@pytest.mark.parametrize("release", RELEASES)
def test_a_quantized_checkpoint_beside_adapters_is_refused_on_10(release):
    """PR 7014 (FP8 activations in the LoRA forward) landed after the 1.1.0rc0 bump: unverified on 1.0."""
    fp8 = checkpoint_quantization({}, {"quantization": {"quant_algo": "FP8"}})
    assert fp8 == "hf_quant_config.json quant_algo=FP8"
    assert checkpoint_quantization({"quantization_config": {"quant_method": "fp8"}}, {}) is not None
    assert checkpoint_quantization({}, {}) is None
    settings = llmapi_settings(settle(LmiConfig(enable_lora=True), "trtllm"))
    if Version(release) < Version("1.1.0"):
        with pytest.raises(
            TrtllmConfigError, match=rf"option.enable_lora=true with a quantized checkpoint .*{release}"
        ):
            llm_plan(settings, Version(release), quantization=fp8)
        assert llm_plan(settings, Version(release)).lora_config is not None  # unquantized: served
    else:
        assert llm_plan(settings, Version(release), quantization=fp8).lora_config is not None


def test_what_the_release_would_not_do_beside_adapters_is_refused_naming_the_key():
    with pytest.raises(TrtllmConfigError, match=r"option.max_cpu_loras=2 is below option.max_loras=4"):
        plan("1.2.1", max_cpu_loras=2)
    spec = {"decoding_type": "NGram", "max_draft_len": 2, "max_matching_ngram_size": 2}
    with pytest.raises(TrtllmConfigError, match=r"option.enable_lora=true with speculative decoding \(ngram\)"):
        plan("1.2.1", speculative_config=spec)
    assert llm_plan(llmapi_settings(settle(LmiConfig(), "trtllm")), Version("1.2.1")).lora_config is None


def test_capabilities_honour_lora_only_with_enable_lora():
    on = release_capabilities("1.2.1", "TorchSampler", 32000, [2], lora=(3, 8))
    assert on.lora.honoured and on.lora.most == 3
    off = release_capabilities("1.2.1", "TorchSampler", 32000, [2])
    assert not off.lora.honoured and "option.enable_lora=true" in off.lora.reason


def test_lora_requests_are_built_as_listed():
    listed = [p.split("=")[0] for p in SURFACE["LoRARequest"]["ctor"][0]]
    assert listed[:3] == ["lora_name", "lora_int_id", "lora_path"]  # the engine passes those three by position
    with fake_tensorrt_llm("1.2.1"):
        from tensorrt_llm.executor.request import LoRARequest

        assert list(inspect.signature(LoRARequest).parameters)[:3] == listed[:3]
        with pytest.raises(ValueError, match="does not exist"):
            LoRARequest("a", 1, "/nonexistent/adapter")
