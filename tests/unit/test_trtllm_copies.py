"""Several TensorRT-LLM copies on one host: orchestrator-mode Executors, each with its GPUs."""

from __future__ import annotations

from trtllm_testing import fake_tensorrt_llm

from lmi_trt.launch import plan_launch, trtllm_copy_settings


def _facts(trt):
    return trt.EngineFacts(
        layout="llmapi",
        version="1.0.0",
        name="llama",
        dtype="float16",
        tp_size=2,
        pp_size=1,
        max_batch_size=8,
        max_input_len=64,
        max_seq_len=128,
        max_num_tokens=None,
        max_beam_width=1,
        paged_kv_cache=True,
        use_paged_context_fmha=True,
        remove_input_padding=True,
        tokens_per_block=64,
        multi_block_mode=None,
        gather_generation_logits=False,
        quant_algo=None,
        kv_cache_quant_algo=None,
    )


def test_four_gpus_tp2_run_two_orchestrator_copies_on_their_own_devices():
    plan = plan_launch(2, 1, 4, "trtllm")
    assert plan.trtllm_mode == "orchestrator" and [list(c) for c in plan.copies] == [[0, 1], [2, 3]]
    with fake_tensorrt_llm("1.0.0") as tllm:
        import lmi_trt.engines.trtllm as trt

        tle = tllm.bindings.executor
        for placement, devices in zip(plan.placements(), ([0, 1], [2, 3])):
            settings = trtllm_copy_settings(trt.TrtllmSettings(tensor_parallel_degree=2), placement)
            config, _ = trt.build_executor_config(tle, settings, _facts(trt))
            parallel = config.parallel_config
            assert parallel.communication_mode == tle.CommunicationMode.ORCHESTRATOR
            assert list(parallel.device_ids) == devices
            assert parallel.orchestrator_config.is_orchestrator
            assert parallel.orchestrator_config.worker_executable_path.endswith("bin/executorWorker")


def test_one_copy_stays_in_leader_mode_without_device_pinning():
    with fake_tensorrt_llm("1.0.0") as tllm:
        import lmi_trt.engines.trtllm as trt

        tle = tllm.bindings.executor
        config, _ = trt.build_executor_config(tle, trt.TrtllmSettings(tensor_parallel_degree=2), _facts(trt))
        assert config.parallel_config.communication_mode == tle.CommunicationMode.LEADER
        assert config.parallel_config.device_ids is None
        assert config.parallel_config.orchestrator_config is None
