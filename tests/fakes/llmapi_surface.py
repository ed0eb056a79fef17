"""Plain listing of TensorRT-LLM's LLM API (PyTorch backend) surface that the fake and lmi_trt may use.

Data only, parsed with ``ast.literal_eval`` (never imported). Read from NVIDIA/TensorRT-LLM sources
through the public-code index. The index keeps file versions by crawl commit, not by release tag, so
each entry says which copy it was read from:

* ``LLM-1.x``  tensorrt_llm/llmapi/llm.py @4c05a74891e4df8066f08ed4ce14b0972abe4e25 (BaseLLM/_TorchLLM/
  ``class LLM(_TorchLLM)``, ``scheduling_params``/``cache_salt``, no ``priority``: the 1.0/1.1 line);
* ``LLM-new``  tensorrt_llm/llmapi/llm.py, a later unlabeled copy (``priority``, ``trace_headers``,
  ``conversation_params``; still with ``_TrtLLM``): the 1.2 line;
* ``STATS``    the ``get_stats``/``get_stats_async`` bodies of tensorrt_llm/llmapi/llm.py (two copies, same text);
* ``ARGS``     tensorrt_llm/llmapi/llm_args.py (``SchedulerConfig`` read in three copies: the newest adds
  ``waiting_queue_policy``; ``KvCacheConfig``/``CudaGraphConfig`` from the 1.2-era copy);
* ``SP``       tensorrt_llm/sampling_params.py @a98a9061d72f6fd39f5d055ebdd2c6878a100e2c (~1.1–1.2);
* ``RES``      tensorrt_llm/executor/result.py @005bc848893f575ec14b45d6b13139360d67c790 (CompletionOutput,
  ``_handle_sequence``: finish reasons, stop-word stripping, cumulative ``token_ids``/``logprobs``);
* ``UTILS``    tensorrt_llm/executor/utils.py @015884d6f9c477bf3c3928c61f5b5a143c7630c5
(``RequestError(RuntimeError)``);
* ``INIT``     tensorrt_llm/llmapi/__init__.py ``__all__``: a 1.x copy (with ``TrtLlmArgs``) and a main copy
  (no ``BuildConfig``/``TrtLlmArgs``; ``AsyncLLM`` added);
* ``SERVE``    tensorrt_llm/serve/openai_server.py copies: ``generate_async(inputs=, sampling_params=,
  streaming=, ...)``, ``asyncio.create_task(self.await_disconnected(raw_request, promise))`` then
  ``promise.abort()``; ``RequestError`` → HTTP 400; ``get_stats_async`` feeds ``/metrics``;
  tensorrt_llm/serve/postprocess_handlers.py ``create_logprobs``: an entry is a float or ``dict[int, Logprob]``.

Release facts that are not in one file:

* TensorRT-engine removal: PRs 15918 ("Remove python modules ... for legacy TensorRT backend") and 16369
  ("Remove C++ modules for legacy TRT backend": "The nanobind ``Executor`` class no longer exists") merged
  on main after 1.2; the fake calls that release ``1.3.0`` (the first one without the Executor binding).
* Log probs on the PyTorch backend: PR 6097 "Topk logprobs for TRT backend and top1 logprob for PyT backend"
  (in 1.0.0), PR 7756 "Return topk logprobs in torch backend" (merged 2025-09-24, reverted the same day by PR 7969,
  re-landed as PR 7976 on 2025-09-30, after the "Bump version to 1.2.0rc0" commit of 2025-09-29: 1.2.0+).
  PR 9374 ("Change PyT to always include sampled logprob") was closed unmerged, so a sampled token outside
  the top k may be missing from its step's dict: users must not rely on it being there.

Conventions as in ``trtllm_api_surface.py``: "ctor" is a list of overloads of parameter strings
("name", "name=DEFAULT", "*", "**kwargs"); pydantic models and slot dataclasses are keyword-only
construction ("notes" says so); "fields" lists field → default text; "releases" lists the fake's release
values an entry exists in; "source" names the copy it was read from.
"""

RELEASES = ["1.0.0", "1.1.0", "1.2.1", "1.3.0"]

SURFACE = {
    # ------------------------------------------------------------------ tensorrt_llm.llmapi
    "tensorrt_llm.llmapi": {
        "__all__": [
            "LLM",
            "CompletionOutput",
            "RequestOutput",
            "SamplingParams",
            "GuidedDecodingParams",
            "KvCacheConfig",
            "CudaGraphConfig",
            "MoeConfig",
            "SchedulerConfig",
            "CapacitySchedulerPolicy",
            "ContextChunkingPolicy",
            "RequestError",
            "TorchLlmArgs",
            "NGramDecodingConfig",
            "DraftTargetDecodingConfig",
            "EagleDecodingConfig",
            "Eagle3DecodingConfig",
            "MTPDecodingConfig",
        ],
        "LLM": {
            "source": "LLM-1.x, LLM-new: tensorrt_llm/llmapi/llm.py class LLM(_TorchLLM)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [
                [
                    "model",
                    "tokenizer=None",
                    "tokenizer_mode='auto'",
                    "skip_tokenizer_init=False",
                    "trust_remote_code=False",
                    "tensor_parallel_size=1",
                    "dtype='auto'",
                    "revision=None",
                    "tokenizer_revision=None",
                    "**kwargs",
                ]
            ],
            "notes": "kwargs must be TorchLlmArgs fields (else ValueError 'LLM got invalid argument: <key>'); "
            "TrtLlmArgs-only keys raise ValueError pointing at tensorrt_llm._tensorrt_engine.LLM (1.x)",
            "methods": [
                "generate",
                "generate_async",
                "shutdown",
                "get_stats",
                "get_stats_async",
                "__enter__",
                "__exit__",
            ],
            "props_ro": ["tokenizer", "args"],
            "sigs": {
                "generate_async": [
                    # LLM-1.x (1.0.0, 1.1.0)
                    "(inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None, streaming=False, "
                    "kv_cache_retention_config=None, disaggregated_params=None, _postproc_params=None, "
                    "scheduling_params=None, cache_salt=None) -> RequestOutput",
                    # LLM-new (1.2.1, and main at the time it was read)
                    "(inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None, streaming=False, "
                    "kv_cache_retention_config=None, disaggregated_params=None, trace_headers=None, "
                    "_postproc_params=None, scheduling_params=None, conversation_params=None, cache_salt=None, "
                    "priority=0.5) -> RequestOutput",
                ],
                "shutdown": "() -> None",
                "get_stats": "(timeout=2) -> List[dict]",
                "get_stats_async": "(timeout=2) -> IterationResult",
            },
            "sigs_by_release": {"generate_async": {"1.0.0": 0, "1.1.0": 0, "1.2.1": 1, "1.3.0": 1}},
            "semantics": {
                "generate_async": "returns a RequestOutput at once (not a coroutine); needs a running event loop "
                "for async iteration; RequestError/ValueError/TypeError for bad input raise "
                "synchronously; RuntimeError('LLM is shutting down') once shut down",
                "max_num_tokens": "without enable_chunked_prefill, a prompt longer than max_num_tokens is refused "
                "synchronously (LLM-new _check_arguments)",
                "get_stats_async": "IterationResult: async iterable of per-iteration stats (JSON objects: iter, "
                "numActiveRequests, numQueuedRequests, maxNumActiveRequests, kvCacheStats"
                "{maxNumBlocks, freeNumBlocks, usedNumBlocks, tokensPerBlock}); iteration stops "
                "after `timeout` seconds without a new one (STATS, RES IterationResult); needs "
                "enable_iter_perf_stats=True",
                "shutdown": "safe to call twice; stops the executor and the MPI session it owns",
            },
        },
        "RequestOutput": {
            "source": "LLM-1.x, LLM-new: tensorrt_llm/llmapi/llm.py RequestOutput(DetokenizedGenerationResultBase, "
            "GenerationResult); built by _from_generation_result, never by its constructor",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "props_ro": ["request_id", "prompt", "prompt_token_ids", "outputs", "finished", "context_logits"],
            "methods": ["abort", "aborted", "result", "aresult", "__aiter__", "__anext__", "__await__"],
            "semantics": {
                "__anext__": "applies the next queued response and returns the same object; StopAsyncIteration "
                "once the final one was applied (RES GenerationResult)",
                "abort": "asks the executor to abort the request; it ends with finish_reason 'cancelled'",
                "errors": "an error response raises RequestError out of the iteration of that request only",
            },
        },
        "CompletionOutput": {
            "source": "RES: tensorrt_llm/executor/result.py @dataclass(slots=True) CompletionOutput",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [
                [
                    "index",
                    "text=''",
                    "token_ids=field(default_factory=list)",
                    "cumulative_logprob=None",
                    "logprobs=field(default_factory=list)",
                    "prompt_logprobs=field(default_factory=list)",
                    "finish_reason=None",
                    "stop_reason=None",
                    "generation_logits=None",
                    "disaggregated_params=None",
                ]
            ],
            "props_rw": [
                "index",
                "text",
                "token_ids",
                "cumulative_logprob",
                "logprobs",
                "prompt_logprobs",
                "finish_reason",
                "stop_reason",
                "generation_logits",
                "disaggregated_params",
            ],
            "props_ro": ["length", "text_diff", "token_ids_diff", "logprobs_diff"],
            "finish_reasons": ["stop", "length", "timeout", "cancelled"],
            "semantics": {
                "token_ids": "cumulative; token_ids_diff is what the last applied response added",
                "logprobs": "cumulative list, one entry per token: dict[int, Logprob] (PyTorch backend)",
                "finish_reason": "END_ID and STOP_WORDS → 'stop'; LENGTH → 'length'; TIMED_OUT → 'timeout'; "
                "CANCELLED → 'cancelled'",
                "stop_reason": "the stop string or stop token id that ended the sequence, else None; the stop "
                "tokens are cut from token_ids unless include_stop_str_in_output",
                "end_id": "not verified: whether the PyTorch backend keeps the end id in token_ids (the C++ "
                "Executor does not); lmi-trt drops a trailing end id either way",
            },
        },
        "GenerationResult": {
            "source": "RES: tensorrt_llm/executor/result.py GenerationResultBase / GenerationResult (the base of "
            "RequestOutput); keeps self.id and self.sampling_params",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "props_ro": ["request_id", "finished", "outputs"],
            "methods": ["abort", "aborted", "result", "aresult", "__aiter__", "__anext__", "__await__"],
        },
        "IterationResult": {
            "source": "RES: tensorrt_llm/executor/result.py IterationResult (what get_stats_async returns); "
            "set_timeout/mark_undone: called by tensorrt_llm/executor/executor.py aget_stats and "
            "_maybe_initialize_iteration_results (copy id 697825693, 1.1/1.2 line)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "methods": ["__aiter__", "__anext__", "set_timeout", "mark_undone"],
        },
        "Logprob": {
            "source": "tensorrt_llm/executor/result.py (NamedTuple-like dataclass Logprob(logprob, rank))",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [["logprob", "rank=None"]],
            "props_rw": ["logprob", "rank"],
            "semantics": {
                "top_k": "1.0.0: one entry per step (PR 6097: top-1 on PyTorch); 1.1.0+: the requested top k (PR 7756)",
            },
        },
        "RequestError": {
            "source": "UTILS: tensorrt_llm/executor/utils.py class RequestError(RuntimeError)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "bases": ["RuntimeError"],
        },
        "SamplingParams": {
            "source": "SP: tensorrt_llm/sampling_params.py @dataclass(slots=True, kw_only=True) SamplingParams",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only; __post_init__ validates (ValueError): top_p in [0,1], top_k >= 0, "
            "temperature >= 0, best_of >= n",
            "ctor": [
                [
                    "*",
                    "end_id=None",
                    "pad_id=None",
                    "max_tokens=32",
                    "bad=None",
                    "bad_token_ids=None",
                    "stop=None",
                    "stop_token_ids=None",
                    "include_stop_str_in_output=False",
                    "embedding_bias=None",
                    "logits_processor=None",
                    "apply_batched_logits_processor=False",
                    "n=1",
                    "best_of=None",
                    "use_beam_search=False",
                    "top_k=None",
                    "top_p=None",
                    "top_p_min=None",
                    "top_p_reset_ids=None",
                    "top_p_decay=None",
                    "seed=None",
                    "temperature=None",
                    "min_tokens=None",
                    "beam_search_diversity_rate=None",
                    "repetition_penalty=None",
                    "presence_penalty=None",
                    "frequency_penalty=None",
                    "length_penalty=None",
                    "early_stopping=None",
                    "no_repeat_ngram_size=None",
                    "min_p=None",
                    "beam_width_array=None",
                    "logprobs=None",
                    "prompt_logprobs=None",
                    "return_context_logits=False",
                    "return_generation_logits=False",
                    "exclude_input_from_output=True",
                    "return_encoder_output=False",
                    "return_perf_metrics=False",
                    "additional_model_outputs=None",
                    "lookahead_config=None",
                    "guided_decoding=None",
                    "ignore_eos=False",
                    "detokenize=True",
                    "add_special_tokens=True",
                    "truncate_prompt_tokens=None",
                    "skip_special_tokens=True",
                    "spaces_between_special_tokens=True",
                ]
            ],
            "props_rw": [
                "end_id",
                "pad_id",
                "max_tokens",
                "bad",
                "bad_token_ids",
                "stop",
                "stop_token_ids",
                "include_stop_str_in_output",
                "embedding_bias",
                "logits_processor",
                "apply_batched_logits_processor",
                "n",
                "best_of",
                "use_beam_search",
                "top_k",
                "top_p",
                "top_p_min",
                "top_p_reset_ids",
                "top_p_decay",
                "seed",
                "temperature",
                "min_tokens",
                "beam_search_diversity_rate",
                "repetition_penalty",
                "presence_penalty",
                "frequency_penalty",
                "length_penalty",
                "early_stopping",
                "no_repeat_ngram_size",
                "min_p",
                "beam_width_array",
                "logprobs",
                "prompt_logprobs",
                "return_context_logits",
                "return_generation_logits",
                "exclude_input_from_output",
                "return_encoder_output",
                "return_perf_metrics",
                "additional_model_outputs",
                "lookahead_config",
                "guided_decoding",
                "ignore_eos",
                "detokenize",
                "add_special_tokens",
                "truncate_prompt_tokens",
                "skip_special_tokens",
                "spaces_between_special_tokens",
            ],
            "static_methods": ["params_imply_greedy_decoding"],
            "semantics": {
                "greedy": "params_imply_greedy_decoding: temperature 0, or top_k 1, or top_p 0, or all of "
                "temperature/top_k/top_p unset; best_of > 1 with greedy is a ValueError",
                "stop_token_ids": "single token ids; multi-token stops come as `stop` strings, tokenized without "
                "special tokens",
                "bad_token_ids": "single token ids; multi-token bans come as `bad` strings",
                "end_id": "None → the tokenizer's eos_token_id; ignore_eos keeps generating past it",
                "logprobs": "an int: the top-k count per generated token (True → 1)",
                "beam": "use_beam_search=True with best_of=beam width, n=returned beams",
            },
        },
        "GuidedDecodingParams": {
            "source": "SP: tensorrt_llm/sampling_params.py @dataclass(slots=True, kw_only=True)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only",
            "ctor": [["*", "json=None", "regex=None", "grammar=None", "json_object=False", "structural_tag=None"]],
            "props_rw": ["json", "regex", "grammar", "json_object", "structural_tag"],
        },
        "KvCacheConfig": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class KvCacheConfig(StrictBaseModel, PybindMirror)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only (pydantic, unknown keys rejected)",
            "ctor": [
                [
                    "*",
                    "enable_block_reuse=True",
                    "max_tokens=None",
                    "max_attention_window=None",
                    "sink_token_length=None",
                    "free_gpu_memory_fraction=0.9",
                    "host_cache_size=None",
                    "onboard_blocks=True",
                    "cross_kv_cache_fraction=None",
                    "secondary_offload_min_priority=None",
                    "event_buffer_max_size=0",
                    "enable_partial_reuse=True",
                    "copy_on_partial_reuse=True",
                    "use_uvm=False",
                    "dtype='auto'",
                    "tokens_per_block=32",
                ]
            ],
            "props_rw": [
                "enable_block_reuse",
                "max_tokens",
                "max_attention_window",
                "sink_token_length",
                "free_gpu_memory_fraction",
                "host_cache_size",
                "onboard_blocks",
                "cross_kv_cache_fraction",
                "secondary_offload_min_priority",
                "event_buffer_max_size",
                "enable_partial_reuse",
                "copy_on_partial_reuse",
                "use_uvm",
                "dtype",
                "tokens_per_block",
            ],
            "semantics": {"max_tokens": "the KV pool is min(max_tokens, free_gpu_memory_fraction of free memory)"},
        },
        "CudaGraphConfig": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class CudaGraphConfig(StrictBaseModel)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only (pydantic); batch_sizes given → sorted, max_batch_size = max(batch_sizes); neither "
            "→ max_batch_size 128 and generated sizes; TorchLlmArgs.cuda_graph_config=None disables graphs",
            "ctor": [["*", "batch_sizes=None", "max_batch_size=0", "enable_padding=False"]],
            "props_rw": ["batch_sizes", "max_batch_size", "enable_padding"],
        },
        "MoeConfig": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class MoeConfig(StrictBaseModel) (1.0, 1.1, 1.2 and main "
            "copies); exported by tensorrt_llm.llmapi (examples/llm-api/quickstart_advanced.py imports it from there)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only (pydantic); backend is a Literal of the release's MoE backends (default CUTLASS, "
            "AUTO from 1.2); max_num_tokens, load_balancer and later fields not modelled",
            "ctor": [["*", "backend='CUTLASS'"]],
            "props_rw": ["backend"],
        },
        "SchedulerConfig": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class SchedulerConfig(StrictBaseModel, PybindMirror)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only (pydantic)",
            "ctor": [
                [
                    "*",
                    "capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT",
                    "context_chunking_policy=None",
                    "dynamic_batch_config=None",
                    "waiting_queue_policy=WaitingQueuePolicy.FCFS  # newest copy only",
                ]
            ],
            "props_rw": ["capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config"],
        },
        "CapacitySchedulerPolicy": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class CapacitySchedulerPolicy(StrEnum)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "members": ["MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"],
        },
        "ContextChunkingPolicy": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class ContextChunkingPolicy(StrEnum)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "members": ["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"],
        },
        "LoadFormat": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py class LoadFormat(Enum); TorchLlmArgs.load_format takes "
            "a member or its name in any case (convert_load_format)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "members": ["AUTO", "DUMMY"],
            "notes": "VISION_ONLY (1.1 on) not modelled: lmi_trt sends auto or dummy",
        },
        "TorchLlmArgs": {
            "source": "ARGS: tensorrt_llm/llmapi/llm_args.py TorchLlmArgs(BaseLlmArgs); the LLM keywords lmi_trt maps",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only (pydantic); explicit None for max_batch_size/max_input_len/max_beam_width/"
            "max_num_tokens is reset to the default",
            # Fields only some releases have; elsewhere LLM(...) raises "LLM got invalid argument: <key>".
            # 1.0: llm_args.py of the 1.0 line (both enable_* fields, no sampler_type; the 1.0.0 docs'
            # features/sampling.md: "Enable the enable_trtllm_sampler option"); sampler_type: PR 6831 (merged
            # 2025-08-16, main at 1.1.0rc1), enable_mixed_sampler removed by PR 7294; main: PR 18232 removed the
            # TRTLLMSampler, sampler_type 'auto'/'TorchSampler' accepted and ignored, 'TRTLLMSampler' rejected
            # (docs 1.3.0rc26 features/sampling.md).
            "releases_of": {
                "enable_mixed_sampler": ["1.0.0"],
                "enable_trtllm_sampler": ["1.0.0"],
                "sampler_type": ["1.1.0", "1.2.1", "1.3.0"],
            },
            "ctor": [
                [
                    "*",
                    "model",
                    "tokenizer=None",
                    "tokenizer_mode='auto'",
                    "skip_tokenizer_init=False",
                    "trust_remote_code=False",
                    "tensor_parallel_size=1",
                    "dtype='auto'",
                    "revision=None",
                    "tokenizer_revision=None",
                    "pipeline_parallel_size=1",
                    "context_parallel_size=1",
                    "gpus_per_node=None",
                    "moe_tensor_parallel_size=None",
                    "moe_expert_parallel_size=None",
                    "enable_attention_dp=False",
                    "load_format=LoadFormat.AUTO",
                    "enable_lora=False",
                    "lora_config=None",
                    "kv_cache_config=KvCacheConfig()",
                    "enable_chunked_prefill=False",
                    "guided_decoding_backend=None",
                    "iter_stats_max_iterations=None",
                    "request_stats_max_iterations=None",
                    "scheduler_config=SchedulerConfig()",
                    "max_batch_size=2048",
                    "max_input_len=1024",
                    "max_seq_len=None",
                    "max_beam_width=1",
                    "max_num_tokens=8192",
                    "gather_generation_logits=False",
                    "num_postprocess_workers=0",
                    "postprocess_tokenizer_dir=None",
                    "reasoning_parser=None",
                    "return_perf_metrics=False",
                    "cuda_graph_config=CudaGraphConfig()",
                    "disable_overlap_scheduler=False",
                    "moe_config=MoeConfig()",
                    "attn_backend='TRTLLM'",
                    # sampler keys by release: "releases_of"
                    "enable_mixed_sampler=False  # 1.0 only",
                    "enable_trtllm_sampler=False  # 1.0 only",
                    "sampler_type='auto'  # 1.1 and later only",
                    "enable_iter_perf_stats=False",
                    "enable_iter_req_stats=False",
                    "print_iter_log=False",
                    "torch_compile_config=None",
                    "stream_interval=1",
                    "max_stats_len=1000",
                    "speculative_config=None",
                ]
            ],
        },
        # ---------------------------------------------------------------- speculative configs (SPEC)
        # tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig and subclasses, read in the 1.0 copy (id 1520735490 in
        # the index: enable_mixed_sampler), the 1.1 copy (1090804222: sampler_type, TRITON), the 1.2-dated copy
        # (7019226376: MoE AUTO, Eagle3DecodingConfig, speculative_model with the speculative_model_dir alias) and
        # main (55143598664). Only the fields lmi_trt sets are listed; the fake stores the draft model as
        # speculative_model_dir, which every copy accepts (PR 10099 kept it as an alias).
        "DecodingBaseConfig": {
            "source": "SPEC: class DecodingBaseConfig(StrictBaseModel); max_concurrency from the 1.1 copy on",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "keyword-only (pydantic, unknown keys rejected)",
            "ctor": [
                [
                    "*",
                    "max_draft_len=None",
                    "speculative_model_dir=None",
                    "max_concurrency=None",
                    "allow_advanced_sampling=False  # only from PR 9885 (1.2-dated copy)",
                ]
            ],
            "methods": ["supports_backend"],
        },
        "NGramDecodingConfig": {
            "source": "SPEC: class NGramDecodingConfig(DecodingBaseConfig); supports_backend: backend == 'pytorch'",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "notes": "max_matching_ngram_size defaults to 0 in the 1.0/1.1 copies (asserted > 0), 2 later",
            "ctor": [
                [
                    "*",
                    "max_draft_len=None",
                    "speculative_model_dir=None",
                    "max_concurrency=None",
                    "allow_advanced_sampling=False  # only from PR 9885 (1.2-dated copy)",
                    "max_matching_ngram_size=2",
                    "is_keep_all=True",
                    "is_use_oldest=True",
                    "is_public_pool=True",
                ]
            ],
            "methods": ["supports_backend"],
            "props_ro": ["decoding_type"],
        },
        "DraftTargetDecodingConfig": {
            "source": "SPEC: class DraftTargetDecodingConfig(DecodingBaseConfig); 'speculative_model must be "
            "specified for DraftTarget'",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [
                [
                    "*",
                    "max_draft_len=None",
                    "speculative_model_dir=None",
                    "max_concurrency=None",
                    "allow_advanced_sampling=False  # only from PR 9885 (1.2-dated copy)",
                ]
            ],
            "methods": ["supports_backend"],
            "props_ro": ["decoding_type"],
        },
        "EagleDecodingConfig": {
            "source": "SPEC: class EagleDecodingConfig(DecodingBaseConfig); 'Draft model must be provided for EAGLE'",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [
                [
                    "*",
                    "max_draft_len=None",
                    "speculative_model_dir=None",
                    "max_concurrency=None",
                    "allow_advanced_sampling=False  # only from PR 9885 (1.2-dated copy)",
                    "eagle3_one_model=True",
                ]
            ],
            "methods": ["supports_backend"],
            "props_ro": ["decoding_type"],
        },
        "Eagle3DecodingConfig": {
            "source": "SPEC: class Eagle3DecodingConfig(EagleDecodingConfig) (1.2-dated and main copies)",
            "releases": ["1.2.1", "1.3.0"],
            "ctor": [
                [
                    "*",
                    "max_draft_len=None",
                    "speculative_model_dir=None",
                    "max_concurrency=None",
                    "allow_advanced_sampling=False  # only from PR 9885 (1.2-dated copy)",
                    "eagle3_one_model=True",
                ]
            ],
            "methods": ["supports_backend"],
            "props_ro": ["decoding_type"],
        },
        "MTPDecodingConfig": {
            "source": "SPEC: class MTPDecodingConfig(DecodingBaseConfig); max_draft_len set from "
            "num_nextn_predict_layers",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [
                [
                    "*",
                    "max_draft_len=None",
                    "speculative_model_dir=None",
                    "max_concurrency=None",
                    "allow_advanced_sampling=False  # only from PR 9885 (1.2-dated copy)",
                    "num_nextn_predict_layers=1",
                    "use_mtp_vanilla=False",
                ]
            ],
            "methods": ["supports_backend"],
            "props_ro": ["decoding_type"],
        },
        # ------------------------------------------------------------------ LoRA (not in tensorrt_llm.llmapi's
        # __all__ up to 1.0; llmapi/__init__.py copies ids 187165971 and 3832452477 export LoRARequest, none exports
        # LoraConfig): imported from where docs/source/features/lora.md imports them
        "LoraConfig": {
            "source": "tensorrt_llm/lora_helper.py @dataclass class LoraConfig(DictConversion) (read_file id "
            "53470212518, undated); tensorrt_llm/lora_manager.py imports it from there (id 1059464385); the docs "
            "(docs/source/features/lora.md @050db34b) build it with lora_dir, max_lora_rank, max_loras, max_cpu_loras, "
            "lora_target_modules, trtllm_modules_to_hf_modules; _torch/pyexecutor/_util.py (1.1 line, id 843526953) "
            "reads lora_dir, lora_target_modules, trtllm_modules_to_hf_modules, max_lora_rank, max_loras, "
            "max_cpu_loras, missing_qkv_modules. Listed: the fields common to every copy read (a swap_gate_up_proj "
            "dataclass, id 53470212518; a lora_weights_converters dataclass, id 2545972156; pydantic copies with "
            "swap_gate_up_proj_lora_b_weight, ids 388674781 and 56112947133): which release holds which was not dated",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [
                [
                    "lora_dir=field(default_factory=list)",
                    "lora_ckpt_source='hf'",
                    "max_lora_rank=64",
                    "lora_target_modules=field(default_factory=list)",
                    "trtllm_modules_to_hf_modules=field(default_factory=dict)",
                    "max_loras=None",
                    "max_cpu_loras=None",
                ]
            ],
            "props_rw": [
                "lora_dir",
                "lora_ckpt_source",
                "max_lora_rank",
                "lora_target_modules",
                "trtllm_modules_to_hf_modules",
                "max_loras",
                "max_cpu_loras",
            ],
            "props_ro": ["missing_qkv_modules"],
        },
        "LoRARequest": {
            "source": "tensorrt_llm/executor/request.py @dataclass(slots=True) class LoRARequest (the 1.x copy with "
            "SchedulingParams and lora_ckpt_source, find_string id 36422276; the pre-1.0 copy @08c33130 lacks "
            "lora_ckpt_source); __post_init__ raises ValueError for a lora_path that does not exist. trtllm-serve "
            "takes it from the request body (openai_server.py: generate_async(..., lora_request=request.lora_request), "
            "copy @00057725; examples/serve/openai_completion_client_for_lora.py: lora_name, lora_int_id, lora_path)",
            "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"],
            "ctor": [["lora_name", "lora_int_id", "lora_path=''", "lora_ckpt_source='hf'"]],
            "props_rw": ["lora_name", "lora_int_id", "lora_path", "lora_ckpt_source"],
            "props_ro": ["adapter_id", "name", "path", "ckpt_source"],
        },
    },
    # ------------------------------------------------------------------ module layout (real paths)
    "modules": {
        "tensorrt_llm": {"exports": ["LLM", "SamplingParams"], "releases": ["1.0.0", "1.1.0", "1.2.1", "1.3.0"]},
        "tensorrt_llm.llmapi.llm": {"exports": ["LLM", "RequestOutput"]},
        "tensorrt_llm.llmapi.llm_args": {
            "exports": [
                "KvCacheConfig",
                "CudaGraphConfig",
                "MoeConfig",
                "SchedulerConfig",
                "CapacitySchedulerPolicy",
                "ContextChunkingPolicy",
                "LoadFormat",
                "TorchLlmArgs",
                "DecodingBaseConfig",
                "NGramDecodingConfig",
                "DraftTargetDecodingConfig",
                "EagleDecodingConfig",
                "Eagle3DecodingConfig",
                "MTPDecodingConfig",
            ],
        },
        "tensorrt_llm.sampling_params": {"exports": ["SamplingParams", "GuidedDecodingParams"]},
        "tensorrt_llm.executor": {"exports": ["CompletionOutput", "GenerationResult", "RequestError"]},
        "tensorrt_llm.executor.result": {
            "exports": ["CompletionOutput", "Logprob", "GenerationResult", "IterationResult"],
        },
        "tensorrt_llm.executor.utils": {"exports": ["RequestError"]},
        "tensorrt_llm.lora_helper": {
            "exports": [
                "LoraConfig",
                "get_default_trtllm_modules_to_hf_modules",
                "get_missing_qkv_modules_from_lora_modules",
            ]
        },
        "tensorrt_llm.lora_manager": {"exports": ["LoraConfig"]},
        "tensorrt_llm.executor.request": {"exports": ["LoRARequest"]},
        "tensorrt_llm.bindings.executor": {
            "exports": ["Executor"],
            "releases": ["1.0.0", "1.1.0", "1.2.1"],
            "note": "Executor removed after 1.2 (PRs 15918, 16369)",
        },
        "tensorrt_llm._tensorrt_engine": {
            "exports": ["LLM"],
            "releases": ["1.0.0", "1.1.0", "1.2.1"],
            "note": "the TensorRT-engine LLM since 1.0; removed with PR 15918",
        },
    },
    # ------------------------------------------------------------------ who already names the backend choice
    "backend_choice": {
        "trtllm-serve": "--backend pytorch|tensorrt|_autodeploy (default pytorch since 1.0; 'trt' is an alias "
        "of tensorrt; 0.18 docs: 'Set to pytorch for pytorch path. Default is cpp path')",
        "LLM": "LLM(backend=...) is a deprecated TorchLlmArgs field; BaseLLM picks TorchLlmArgs for 'pytorch', "
        "_autodeploy's args for '_autodeploy', TrtLlmArgs otherwise (LLM-1.x)",
        "djl-serving": "option.backend (None or 'pytorch') in djl_python/properties_manager/trt_properties.py "
        "(TensorRtLlmProperties.backend → LLM(backend=...)); wlm/LmiUtils.java skips the engine "
        "build when option.backend=pytorch",
        "lmi-trt": "option.backend = auto | pytorch | tensorrt (DJL's key, trtllm-serve's values)",
    },
}
