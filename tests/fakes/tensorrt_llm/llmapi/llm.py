"""Fake ``tensorrt_llm.llmapi.llm`` (real file: tensorrt_llm/llmapi/llm.py): ``LLM`` (the PyTorch backend's
``_TorchLLM``) and ``RequestOutput``.

Kept from the real one: the constructor's keywords and order; ``**kwargs`` must be ``TorchLlmArgs`` fields of
the release (1.x names the TensorRT-engine LLM for TrtLlmArgs-only keys; llm_args.py for the sampler keys);
``generate_async`` returns at once (input errors raise synchronously: a prompt over ``max_num_tokens`` without
chunked prefill).
``SamplingParams._setup`` (end/pad id from the tokenizer, stop/bad strings tokenized) runs only for a request
without ``end_id``: tensorrt_llm/llmapi/llm.py ``BaseLLM._prepare_sampling_params``,
``if sampling_params.end_id is None: ... sampling_params._setup(...)`` (the 1.1-line copy 4c05a748 and the newest
copy read). Stop/bad strings sent with an ``end_id`` are therefore never tokenized, and the worker's
``_enqueue_request`` (executor/base_worker.py, worker.py: ``bad_words=...._get_bad_words(), stop_words=
...._get_stop_words()``, any exception re-raised as ``RequestError``) fails that request: here, a ``RequestError``
out of its iteration.
Stats only with ``enable_iter_perf_stats``, and only once a request was submitted: before the first one
``get_stats_async`` prints "Iteration statistics are not available yet..." and yields nothing
(tensorrt_llm/executor/executor.py ``aget_stats`` while ``_iter_stats_result`` is None; it is created by the
first ``generate_async``, ``_maybe_initialize_iteration_results``). ``shutdown`` twice is fine. Releases come
from the fake's version: the LLM API PyTorch backend is the default from 1.0 (0.x is refused here: its ``LLM``
built TensorRT engines). Which sampler runs and what it honours: ``_llm_runtime``.
Simplification: one process, world size 1 (the real one spawns MPI workers for TP×PP > 1).
"""

from __future__ import annotations

from pathlib import Path

from tensorrt_llm import _state
from tensorrt_llm._grammar import guide_of
from tensorrt_llm._llm_runtime import LlmRuntime, _Seq, _Strategy
from tensorrt_llm.executor.result import GenerationResult, IterationResult, _Response
from tensorrt_llm.llmapi.llm_args import _TRT_ONLY_KEYS, TorchLlmArgs, _field_in_release
from tensorrt_llm.sampling_params import SamplingParams

# generate_async keywords that came with the 1.2 line (LLM-new); earlier releases reject them.
_NEWER_KEYWORDS = {"trace_headers": None, "conversation_params": None, "priority": 0.5}


def _model_configs(folder: Path):
    """The checkpoint's config and generation config as the LLM loads them (ModelLoader.load_hf_model_config /
    load_hf_generation_config; None where it has none). Plain namespaces: ``_setup`` reads ``model_type`` and
    ``eos_token_id`` only, and a config transformers cannot load (a remote-code model) still has those."""
    import json
    from types import SimpleNamespace

    def read(name: str):
        path = folder / name
        return SimpleNamespace(**json.loads(path.read_text())) if path.is_file() else None

    config, generation = read("config.json"), read("generation_config.json")
    if generation is not None and not hasattr(generation, "eos_token_id"):
        generation.eos_token_id = None
    return config, generation


class RequestOutput(GenerationResult):
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("RequestOutput is created by LLM.generate_async, not directly")

    @classmethod
    def _from_generation(cls, request_id: int, prompt_token_ids: list[int], sampling_params, streaming, executor):
        self = cls.__new__(cls)
        GenerationResult.__init__(self, request_id, sampling_params, streaming, executor)
        self._prompt_token_ids = prompt_token_ids
        return self

    @property
    def prompt(self) -> str | None:
        return None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def context_logits(self):
        return None


class LLM:
    def __init__(
        self,
        model,
        tokenizer=None,
        tokenizer_mode="auto",
        skip_tokenizer_init=False,
        trust_remote_code=False,
        tensor_parallel_size=1,
        dtype="auto",
        revision=None,
        tokenizer_revision=None,
        **kwargs,
    ) -> None:
        if _state.series() < (1, 0):
            raise ImportError(f"fake tensorrt_llm {_state.version()}: the LLM API's PyTorch LLM exists from 1.0")
        self._executor = None
        for key in kwargs:
            if key in _TRT_ONLY_KEYS and _state.series() < (1, 3):
                raise ValueError(
                    f"{key} is not supported by the PyTorch backend. Please use "
                    "'from tensorrt_llm._tensorrt_engine import LLM' instead to use the TensorRT backend."
                )
            if key not in TorchLlmArgs.model_fields or not _field_in_release(key):
                raise ValueError(f"LLM got invalid argument: {key}")
        self.args = TorchLlmArgs(
            model=str(model),
            tokenizer=tokenizer,
            tokenizer_mode=tokenizer_mode,
            skip_tokenizer_init=skip_tokenizer_init,
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            revision=revision,
            tokenizer_revision=tokenizer_revision,
            **kwargs,
        )
        world = self.args.tensor_parallel_size * self.args.pipeline_parallel_size
        if world != 1:
            raise RuntimeError(
                f"fake tensorrt_llm runs one rank; tensor_parallel_size × pipeline_parallel_size = {world}"
            )
        folder = Path(self.args.model)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} is not a Hugging Face checkpoint folder (no config.json)")
        self._tokenizer = None
        if not skip_tokenizer_init:
            # BaseLlmArgs.validate_and_init_tokenizer → tokenizer_factory (tensorrt_llm/llmapi/tokenizer.py): a path
            # is loaded with use_fast = tokenizer_mode != 'slow'; a tokenizer object is used as it is (the real one
            # wraps it in TransformersTokenizer, which forwards encode/decode), nothing loaded from the folder.
            given = self.args.tokenizer
            if given is None or isinstance(given, (str, Path)):
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(
                    str(given or folder),
                    use_fast=self.args.tokenizer_mode != "slow",
                    trust_remote_code=self.args.trust_remote_code,
                )
            else:
                self._tokenizer = given
        if self.args.guided_decoding_backend is not None:
            if self._tokenizer is None:
                raise ValueError("guided decoding needs the tokenizer (skip_tokenizer_init=True)")
            if self.args.guided_decoding_backend != "xgrammar":
                raise NotImplementedError("fake tensorrt_llm: guided decoding through xgrammar only")
        # _TorchLLM._build_model: _try_load_hf_model_config / _try_load_generation_config, for SamplingParams._setup
        self._hf_config, self._generation_config = _model_configs(folder)
        self._executor = LlmRuntime(str(folder), self.args, self._tokenizer)
        self._next_id = 1
        self._submitted = False  # the real executor's _iter_stats_result exists from the first request on
        self._stats = IterationResult(self._executor.next_stats, None)

    @property
    def tokenizer(self):
        return self._tokenizer

    def generate_async(
        self,
        inputs,
        sampling_params=None,
        lora_request=None,
        prompt_adapter_request=None,
        streaming=False,
        kv_cache_retention_config=None,
        disaggregated_params=None,
        trace_headers=None,
        _postproc_params=None,
        scheduling_params=None,
        conversation_params=None,
        cache_salt=None,
        priority=0.5,
    ) -> RequestOutput:
        if _state.series() < (1, 2):
            given = {"trace_headers": trace_headers, "conversation_params": conversation_params, "priority": priority}
            for name, default in _NEWER_KEYWORDS.items():
                if given[name] != default:
                    raise TypeError(f"generate_async() got an unexpected keyword argument '{name}'")
        if self._executor is None:
            raise RuntimeError("LLM is shutting down")
        if lora_request is not None and self.args.lora_config is None:
            # what the real LLM does with an adapter it was not built for was not read: the fake refuses
            raise ValueError("lora_request needs the LLM built with lora_config")
        prompt = self._prompt_ids(inputs)
        sp = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"The sampling_params must be type SamplingParams or None, but got {type(sp)}")
        if sp.end_id is None:
            if self._tokenizer is None:
                raise ValueError(
                    "tokenizer is required to reset end_id if it is None, or you can explicitly specify the end_id "
                    "for sampling_params"
                )
            sp._setup(
                self._tokenizer, *(() if _state.series() < (1, 1) else (self._hf_config, self._generation_config))
            )
        self._check_arguments(prompt, sp)
        result = RequestOutput._from_generation(self._next_id, prompt, sp, streaming, self._executor)
        self._next_id += 1
        self._submitted = True
        self._stats.mark_undone()  # _maybe_initialize_iteration_results: more stats expected
        try:  # what the worker's _enqueue_request and the sampler read; a failure fails this request only
            # the worker's executor Request takes sp._get_sampling_config(): the C++ SamplingConfig's checks
            # (tensorrt_llm/sampling_params.py, the 1.x copy read; executor/base_worker.py _enqueue_request)
            sp._get_sampling_config()
            bad_words, stop_words = sp._get_bad_words(), sp._get_stop_words()
            # the PyTorch _check_arguments has no beam check (it returns after max_num_tokens): the executor checks
            # the beam width when it takes the request (_llm_runtime._beam_width_problem)
            strategy = _Strategy.of(sp, self._executor.sampler, mixed=self.args.enable_mixed_sampler)
        except Exception as exc:  # noqa: BLE001 — the worker re-raises any of them as RequestError
            result._enqueue(_Response([], None, None, None, True, error=str(exc)))
            return result
        self._executor.submit(
            _Seq(
                result=result,
                prompt=prompt,
                max_tokens=sp.max_tokens,
                end_id=-1 if sp.ignore_eos else sp.end_id,
                sampling=strategy,
                bad_words=bad_words if strategy.bans else [],
                # main drops every stop word of an ignore_eos request (executor/base_worker.py `stop_words=[] if
                # request.sampling_params.ignore_eos else ...`, the newest copy read); 1.0–1.1 copies keep them, 1.2
                # was not read (the fake keeps them there)
                stop_words=[] if sp.ignore_eos and _state.series() >= (1, 3) else stop_words,
                top_logprobs=sp.logprobs or 0,
                # Prompt log probs on the PyTorch backend from 1.1 (PR 7580).
                prompt_logprobs=(sp.prompt_logprobs or 0) if _state.series() >= (1, 1) else 0,
                embedding_bias=sp.embedding_bias if strategy.bias else None,
                lora=lora_request,
                streaming=streaming,
                beam_width=sp.best_of if sp.use_beam_search else 1,
                length_penalty=sp.length_penalty,
                early_stopping=sp.early_stopping,
                guide=guide_of(sp.guided_decoding) if sp.guided_decoding is not None else None,
            )
        )
        return result

    def _prompt_ids(self, inputs) -> list[int]:
        if isinstance(inputs, dict) and "prompt_token_ids" in inputs:
            inputs = inputs["prompt_token_ids"]
        if isinstance(inputs, str):
            if self._tokenizer is None:
                raise ValueError("a text prompt needs the tokenizer (skip_tokenizer_init=True)")
            return self._tokenizer.encode(inputs)
        if isinstance(inputs, list) and all(isinstance(t, int) for t in inputs):
            return list(inputs)
        raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")

    def _check_arguments(self, prompt: list[int], sp: SamplingParams) -> None:
        args = self.args
        if sp.guided_decoding is not None and args.guided_decoding_backend is None:
            # What the real LLM does here was not read; the fake refuses rather than silently not guiding.
            raise ValueError("guided_decoding needs the LLM built with guided_decoding_backend")
        if not args.enable_chunked_prefill and args.max_num_tokens and len(prompt) > args.max_num_tokens:
            raise ValueError(
                f"The sum of prompt length ({len(prompt)}) and query length (0) should not exceed "
                f"max_num_tokens ({args.max_num_tokens})"
            )

    def get_stats_async(self, timeout=2) -> IterationResult:
        if not self._submitted:
            print(
                "Iteration statistics are not available yet. To collect runtime statistics, please call "
                "get_stats_async() in async coroutine or the /metrics endpoint (if you're using trtllm-serve) AFTER "
                "prompts have been submitted.",
                flush=True,
            )
            return IterationResult(lambda: None, 0)
        self._stats.set_timeout(timeout)
        return self._stats

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> bool:
        self.shutdown()
        return False
