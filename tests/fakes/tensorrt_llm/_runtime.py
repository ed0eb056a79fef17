"""The fake Executor's inside (private): engine loading and an in-flight-batching step loop that
really generates through the Hugging Face checkpoint an engine file points at.

Semantics kept from TensorRT-LLM (NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/executor/executor.h,
tensorrt_llm/builder.py):
* requests join and leave the running batch at any step; at most ``max_batch_size`` run, the
  rest wait in arrival order;
* streaming results carry only the tokens new since the previous result (all generated tokens
  with ``return_all_generated_tokens``), but ``log_probs`` holds every log-prob generated so far:
  ``LlmRequest::createResult`` (cpp/tensorrt_llm/batch_manager/llmRequest.cpp) slices the tokens
  from the last sent position and copies the log-probs whole, and TensorRT-LLM's own
  ``tensorrt_llm/executor/result.py`` replaces (does not extend) its log-probs with each result's;
  non-streaming results carry prompt + output unless ``exclude_input_from_output``; the end id
  itself is not part of the output;
* a queued request is not dequeued while its beam width differs from the running requests' (the
  operating beam width): ``Executor::Impl::getLeaderNewReqWithIds``
  (cpp/tensorrt_llm/executor/executorImpl.cpp) stops at it, so it also holds back everything queued
  behind it until the running ones finish;
* the ``Executor`` constructor holds the GIL for the whole engine load (the binding releases it for
  none of it): the fake ends its load with a C call made through ``ctypes.PyDLL``, which keeps the
  GIL, for ``LMI_TRT_FAKE_ENGINE_LOAD_S`` seconds (default 0.2), or, with ``LMI_TRT_FAKE_ENGINE_LOAD_UNTIL``
  naming a FIFO, until a byte is written to it;
* sampling follows ``SamplingConfig``: greedy when ``top_k`` is 1, or when neither ``top_k`` nor
  ``top_p`` is set; otherwise temperature, top-k, top-p with a per-request generator (seed 0
  unless given); repetition/presence/frequency penalties, ``min_tokens``, bad and stop words;
* a request's ``embedding_bias`` ([vocab_size] float32) is added to the logits before sampling;
* guided decoding (``ExecutorConfig.guided_decoding_config``, 1.x): the request's grammar masks the logits
  before the token is chosen, through xgrammar (``_grammar``);
* run-time rejections (a prompt over the runtime's maximum input length: ``ExecutorImpl._runtime_max_input_len``)
  come back as error Responses for that request only; prompt + max_tokens over ``max_seq_len`` is clamped (TRT-LLM
  logs a warning);
* ``cancel_request``: 1.x sends a final result with ``FinishReason.CANCELLED`` that carries the
  tokens generated but not yet sent (streaming; all of them otherwise); 0.12 sends none;
* leader mode: rank 0 generates; other ranks' ``shutdown()`` blocks until the leader's.
* lookahead decoding (``ExecutorConfig.decoding_config`` with a ``LookaheadDecodingConfig`` (W, N, G)): the
  engine's ``max_draft_len`` must be at least ``calculate_speculative_resource()``'s draft tokens
  (trtGptModelInflightBatching.cpp, which then resizes the decoder to them) and the beam width must be 1
  (cpp/tensorrt_llm/layers/lookaheadDecodingLayer.cpp), or the Executor fails to start;
  each step verifies up to G candidate n-grams of N - 1 draft tokens in one pass and keeps the longest prefix the
  target model's greedy choice agrees with, plus the target's next token (at most N tokens a step: maxPathLen), so
  the output is the greedy one whatever the request's sampling says (the layer samples with maxTopK = 1);
  ``Result.decoding_iter``, where the release binds it, counts the steps (executor.h: fewer than the tokens when
  more than one is taken a step).
  Log-probs are not returned beside it ("outputLogProbs are not supported"): the fake fails such a request.
  Simplification: the real layer fills its n-gram pool from Jacobi iterations of a W-wide lookahead branch; the
  fake's pool is the sequence's own earlier n-grams (what the tests rely on is the verification, not the pool).
* draft tokens (a request's ``external_draft_tokens_config``, on a draft_tokens_external engine): the context step
  reads the prompt and the drafts in one pass and, at each position, chooses the token the request's SamplingConfig
  chooses there, keeping drafts while they equal it and ending with its own token, so a greedy request's output is
  the greedy one (cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp, acceptance by id without draft logits). The
  request is final after that one step, with the accepted drafts and the target's token, whatever its max_tokens:
  tests/bindings/test_executor_bindings.py ``test_request_perf_metrics_draft`` (a 1.x crawl copy) sends drafts
  [2, 4, 9, 10] with max_tokens 5 and gets a final result of [2, 4, 2] at iteration 0. Its finish reason is the
  decoder's (trtGptModelInflightBatching.cpp updateRequests, 1.2.0rc2: the request ends "if request has finished or if
  it is speculative decoding target model" with drafts), so NOT_FINISHED short of EOS, a stop word or the length;
  the caller must not take it for an end.
  More drafts than the engine's max_draft_len fail it (cpp/tensorrt_llm/batch_manager/llmRequest.cpp
  ``LlmRequest::validate``, 1.x copies, which runs before trtGptModelInflightBatching.cpp's verifyRequests: "Draft
  tokens length (%d) exceeds maximum draft tokens length (%d)."). Draft logits, drafts of sampled or log-prob
  requests and drafts beside lookahead are not modelled (the fake raises NotImplementedError).
* Medusa (a MEDUSA engine, whose plan carries the heads, and ``decoding_config`` with ``DecodingMode.Medusa()`` and
  ``medusa_choices``): the tree is checked as cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp (1.x copy id
  182244635) checks it (``_medusa_tree``), against the engine's pretrained_config max_draft_len and num_medusa_heads
  (``_draft_len``), and each depth's top-k is its largest rank + 1. Each step the root is the target's greedy token
  after the last accepted one; head ``d`` (model.py, 1.x id 906315928: ``x + ACT2FN[hidden_act](linear(x))`` per layer,
  ``hidden_act`` the base model's from pretrained_config, of which only silu, LLaMA's and so that of every engine
  lmi-trt builds, is modelled; then its ``lm_head``, on the base model's final hidden state at that token) proposes its
  top-k tokens for the position ``d + 1`` after the root; every path of the tree is verified against the target's greedy
  choices along it, the longest accepted path is kept (medusaDecodingLayer.cpp's acceptance of draft paths by id), and
  the root plus its accepted tokens are emitted, so a greedy request's output is the greedy one.
  ``Result.decoding_iter`` counts the steps (the fake folds the context step's token into its first step, so it counts
  one fewer than a real count including the context iteration). Sampled and log-prob requests beside Medusa are not
  modelled (the fake raises NotImplementedError; lmi-trt refuses them first), nor a Medusa engine without
  ``medusa_choices``, a path of the real runtime that was not read (lmi-trt always sends a tree).
  Simplification: the real engine verifies the whole tree in one pass under a tree attention mask; the fake runs one
  pass per leaf path, which gives the same targets.
Simplification: a beam-search request (beam_width > 1) is decoded in one go through
``transformers``' beam search and answered with one final result, without log probs. What it reads of the
request is TensorRT-LLM's (executor.h SamplingConfig, 0.12-1.2): ``numReturnSequences`` beams come back (all
``beamWidth`` when unset: numReturnBeams), ``lengthPenalty`` divides a beam's log-prob by its length to that power
(default 0: none; applyLengthPenalty in cpp/tensorrt_llm/kernels/beamSearchKernels.h, as transformers divides),
``earlyStopping`` 1 (the default) ends once ``beamWidth`` beams finished, as transformers' early_stopping=True,
other values compare running and finished beams (the stage-3 kernels), as early_stopping=False.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from lmi_trt.compat import cache_kwargs, returned_cache  # the cache keyword as this transformers spells it
from tensorrt_llm import _state
from tensorrt_llm._executor_lora import LoraRuntime
from tensorrt_llm._grammar import MatcherFactory

log = logging.getLogger("tensorrt_llm")

ENGINE_FORMAT = "fake-tensorrt-llm-engine"


def _tllm_error(msg: str) -> RuntimeError:
    return RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: {msg}")


# --------------------------------------------------------------------------- MPI world


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    comm: object | None = None  # an mpi4py communicator when launched under mpirun


def current_world() -> World:
    """The MPI world, as TensorRT-LLM sees it at import: size 1 unless launched under mpirun."""
    for size_key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if int(os.environ.get(size_key, "1")) > 1:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
            return World(comm.Get_rank(), comm.Get_size(), comm)
    return World(0, 1)


# Leader shutdown reaches followers of the same process (simulated worlds in tests) here.
_SHUTDOWN: dict[str, threading.Event] = {}
_SHUTDOWN_LOCK = threading.Lock()


def _shutdown_event(engine_dir: Path) -> threading.Event:
    with _SHUTDOWN_LOCK:
        return _SHUTDOWN.setdefault(str(engine_dir.resolve()), threading.Event())


# --------------------------------------------------------------------------- engine directory


@dataclass(frozen=True)
class EngineLimits:
    name: str
    precision: str
    version: str | None
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_beam_width: int
    use_paged_context_fmha: bool
    tokens_per_block: int
    max_draft_len: int = 0  # the speculative module's (``_draft_len``)
    speculative_decoding_mode: int = 1  # modeling_utils.py SpeculativeDecodingMode (IntFlag): NONE=1
    gather_context_logits: bool = False  # ModelConfig::computeContextLogits, from build_config
    max_num_tokens: int = 8192  # build_config.max_num_tokens (BuildConfig's default)
    context_fmha: bool = True  # plugin_config.context_fmha (ModelConfig::getContextFMHA)
    packed_input: bool = True  # plugin_config.remove_input_padding (ModelConfig::usePackedInput)


def read_engine_config(engine_dir: Path) -> EngineLimits:
    path = engine_dir / "config.json"
    if not path.is_file():
        raise _tllm_error(f"Failed to open config file {path}")
    cfg = json.loads(path.read_text())
    if "version" in cfg:
        pretrained, build = cfg["pretrained_config"], cfg["build_config"]
        plugins = build.get("plugin_config", {})
        mapping = pretrained.get("mapping", {})
        max_input = build["max_input_len"]
        max_seq = build.get("max_seq_len") or max_input + build.get("max_output_len", 0)
        return EngineLimits(
            name=pretrained["architecture"],
            precision=pretrained["dtype"],
            version=cfg["version"],
            tp_size=mapping.get("tp_size", 1),
            pp_size=mapping.get("pp_size", 1),
            max_batch_size=build["max_batch_size"],
            max_input_len=max_input,
            max_seq_len=max_seq,
            max_beam_width=build.get("max_beam_width", 1),
            use_paged_context_fmha=bool(plugins.get("use_paged_context_fmha", False)),
            tokens_per_block=plugins.get("tokens_per_block", 32),
            max_draft_len=_draft_len(pretrained, build),
            speculative_decoding_mode=int(build.get("speculative_decoding_mode") or 1),
            gather_context_logits=bool(build.get("gather_context_logits", False)),
            max_num_tokens=build.get("max_num_tokens") or 8192,
            context_fmha=bool(plugins.get("context_fmha", True)),
            packed_input=bool(plugins.get("remove_input_padding", True)),
        )
    builder, plugins = cfg["builder_config"], cfg.get("plugin_config", {})
    return EngineLimits(
        name=builder["name"],
        precision=builder["precision"],
        version=None,
        tp_size=builder.get("tensor_parallel", 1),
        pp_size=builder.get("pipeline_parallel", 1),
        max_batch_size=builder["max_batch_size"],
        max_input_len=builder["max_input_len"],
        max_seq_len=builder["max_input_len"] + builder["max_output_len"],
        max_beam_width=builder.get("max_beam_width", 1),
        use_paged_context_fmha=bool(plugins.get("use_paged_context_fmha", False)),
        tokens_per_block=plugins.get("tokens_per_block", 64),
        max_num_tokens=builder.get("max_num_tokens") or 8192,
        context_fmha=bool(plugins.get("context_fmha", True)),
        packed_input=bool(plugins.get("remove_input_padding", True)),
    )


def _draft_len(pretrained: dict, build: dict) -> int:
    """The engine's draft tokens as cpp/tensorrt_llm/runtime/gptJsonConfig.cpp parseJson (newest copy, id 809211714;
    an older one, id 2724516238, reads the same) reads them: a Medusa engine's from pretrained_config, with its
    num_medusa_heads, which must both be there; every other mode's from build_config (builder.py copies the
    checkpoint's max_draft_len there only where trtllm-build had no --max_draft_len, so the two can differ)."""
    if not int(build.get("speculative_decoding_mode") or 1) & 4:  # SpeculativeDecodingMode.MEDUSA
        return build.get("max_draft_len", 0)
    draft_len = pretrained.get("max_draft_len") or 0
    if "num_medusa_heads" not in pretrained or draft_len <= 0:
        raise _tllm_error("Both num_medusa_heads and max_draft_len have to be provided for Medusa model")
    return draft_len


def engine_filename(limits: EngineLimits, rank: int) -> str:
    """``GptJsonConfig::engineFilename``: the legacy name when config.json has no ``version``."""
    if limits.version is None:
        pp = f"_pp{limits.pp_size}" if limits.pp_size > 1 else ""
        return f"{limits.name}_{limits.precision}_tp{limits.tp_size}{pp}_rank{rank}.engine"
    return f"rank{rank}.engine"


def deserialize(path: Path) -> dict:
    """The fake "plan": JSON naming the checkpoint it was built from and the building release."""
    if not path.is_file():
        raise _tllm_error(f"Engine file {path} does not exist")
    try:
        blob = json.loads(path.read_bytes())
        assert blob.get("format") == ENGINE_FORMAT
    except (ValueError, AssertionError):
        raise _tllm_error(f"Failed to deserialize cuda engine {path}") from None
    if blob["tensorrt_llm_version"] != _state.version():
        # A TensorRT plan only loads in the TensorRT it was built with (tensorrt_llm/builder.py checks the
        # TensorRT version tag).
        raise _tllm_error(
            "Serialization assertion stdVersionRead == kSERIALIZATION_VERSION failed.Version tag does not match. "
            f"Note: Current Version: {_state.version()}, Serialized Engine Version: {blob['tensorrt_llm_version']}"
        )
    return blob


# --------------------------------------------------------------------------- sequences


@dataclass
class _Seq:
    id: int
    prompt: list[int]
    max_tokens: int
    streaming: bool
    exclude_input: bool
    return_all: bool
    return_log_probs: bool
    end_id: int
    beam_width: int
    sampling: object
    bad_words: list[list[int]]
    stop_words: list[list[int]]
    client_id: int | None
    guide: tuple[str, str | None] | None = None  # (guide type name, guide): see _grammar
    matcher: object = None
    embedding_bias: object = None  # [vocab] float32, added to the logits
    lora_config: object = None  # the request's LoraConfig (checked and cached at admission: _lora)
    lora: dict | None = None  # its decoded A and B by (layer, module)
    fetched: bool = False  # its LoRA task went to the PEFT cache (the fetch loop, _fetch_lora)
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    sent: int = 0
    past: object = None
    logits: object = None
    generator: object = None
    steps: int = 0  # decoding iterations run for it
    drafts: list[int] = field(default_factory=list)  # its ExternalDraftTokensConfig's tokens, verified at context
    hidden: object = None  # Medusa: the base model's final hidden state at the last token


def _check_parallel_config(parallel, limits: EngineLimits, world: World) -> bool:
    """What Executor::Impl checks of a ParallelConfig before it loads anything (cpp/tensorrt_llm/executor/
    executorImpl.cpp, NVIDIA/TensorRT-LLM, the 1.2.0rc2 copy at commit b35ac1b; 0.x binds no spawn_processes, so it
    always spawns): validateParallelConfig, initializeOrchestrator, initializeWorkers. Returns whether this Executor is
    an orchestrator (it loads the engine in its spawned workers; the fake loads it here). The device-id check runs in
    the workers (initializeWorkers), which get the orchestrator's ParallelConfig: the fake applies it here."""
    if parallel is None:
        return False
    tp = limits.tp_size * limits.pp_size
    orchestrator_mode = parallel.communication_mode.name == "ORCHESTRATOR"
    orch = parallel.orchestrator_config
    spawn = getattr(orch, "spawn_processes", True)
    if orchestrator_mode and orch is None:
        raise _tllm_error("OrchestratorConfig must be set when using ORCHESTRATOR communication mode.")
    if orchestrator_mode and orch.is_orchestrator and spawn:
        if world.size != 1:
            raise _tllm_error(
                "When using the orchestrator mode and isOrchestrator is true, expect MPI worldSize to be 1."
            )
        if parallel.participant_ids:
            raise _tllm_error(
                "Participant ids should not be set when using CommunicationMode::kORCHESTRATOR with spawnProcesses=true"
            )
        path = Path(orch.worker_executable_path or "")
        if not orch.worker_executable_path or not path.name:
            # MPI_Comm_spawn(workerExecPath.c_str(), ...) of "": the MPI library cannot start it (MPICHECK)
            raise _tllm_error(f"MPI_Comm_spawn of the worker executable {str(orch.worker_executable_path)!r} failed")
    elif orchestrator_mode and not spawn:
        raise NotImplementedError("fake tensorrt_llm: orchestrator mode without spawned processes is not modelled")
    if parallel.device_ids is not None and len(parallel.device_ids) != tp:
        raise _tllm_error(
            f"When specifying deviceIds, deviceIds ({len(parallel.device_ids)}) * numNodes (1) must be equal to "
            f"tp*pp*cp (tp is {limits.tp_size}, pp is {limits.pp_size}, cp is 1)"
        )
    return orchestrator_mode and orch.is_orchestrator


class ExecutorImpl:
    def __init__(self, model_path, config, *, api):
        self._api = api
        self._dir = Path(model_path)
        self.limits = read_engine_config(self._dir)
        self._world = current_world()
        orchestrator = _check_parallel_config(config.parallel_config, self.limits, self._world)
        if not orchestrator and self.limits.tp_size * self.limits.pp_size != self._world.size:
            raise _tllm_error(
                f"tensor parallelism mismatch: the engine has tp={self.limits.tp_size} pp={self.limits.pp_size}, "
                f"the MPI world has {self._world.size} rank(s)"
            )
        blob = deserialize(self._dir / engine_filename(self.limits, self._world.rank))
        kv = config.kv_cache_config
        reuse = self._block_reuse(kv.enable_block_reuse)
        if self.limits.speculative_decoding_mode & 2 and not reuse:  # DRAFT_TOKENS_EXTERNAL = 2
            # the constructor's TLLM_CHECK, in every copy read (the 2024 one and the 0.2x and 1.2.0rc2 ones)
            raise _tllm_error("KV cache block reuse must be enabled for speculative decoding target model")
        self.max_input_len = self._runtime_max_input_len(config)
        if config.max_beam_width > self.limits.max_beam_width:
            raise _tllm_error(
                f"max_beam_width ({config.max_beam_width}) is larger than the engine's ({self.limits.max_beam_width})"
            )
        self._lookahead = self._lookahead_config(config)
        self._medusa = self._medusa_config(config, blob)
        # Runtime values may only lower the engine's build-time limits.
        self.max_batch_size = min(config.max_batch_size or self.limits.max_batch_size, self.limits.max_batch_size)
        self.max_beam_width = config.max_beam_width
        self._kv_max_tokens = kv.max_tokens or self.max_batch_size * self.limits.max_seq_len
        self._stats: deque = deque(maxlen=max(config.iter_stats_max_iterations, 0))
        self.is_leader = self._world.rank == 0
        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._active: list[_Seq] = []
        self._cancel: set[int] = set()
        self._ready: list = []
        self._next_id = 1
        self._iter = 0
        self._stop = False
        self._closed = False
        self._thread = None
        self._grammars = None
        if self.is_leader:
            self._model = _load_model(blob["hf_model_dir"])
            self._lora = LoraRuntime(
                self._dir, self._model, self.limits.precision, getattr(config, "peft_cache_config", None)
            )
            guided = getattr(config, "guided_decoding_config", None)
            if guided is not None:
                if guided._backend.name != "XGRAMMAR":
                    raise NotImplementedError("fake tensorrt_llm: guided decoding through xgrammar only")
                info = {
                    "encoded_vocab": guided._encoded_vocab,
                    "tokenizer_str": guided._tokenizer_str,
                    "stop_token_ids": guided._stop_token_ids,
                }
                self._grammars = MatcherFactory(info, self._model.config.vocab_size)
        _hold_gil(
            float(os.environ.get("LMI_TRT_FAKE_ENGINE_LOAD_S", "0.2")), os.environ.get("LMI_TRT_FAKE_ENGINE_LOAD_UNTIL")
        )
        if self.is_leader:
            self._thread = threading.Thread(target=self._loop, name="fake-trtllm-executor", daemon=True)
            self._thread.start()

    def _block_reuse(self, asked: bool) -> bool:
        """Whether the KV cache reuses blocks, per cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp
        (NVIDIA/TensorRT-LLM). 0.x (a 2024 copy under the TensorRT source licence, with the lookahead module and
        ExtendedRuntimePerfKnobConfig: the 0.12 era): the constructor refuses reuse on an engine without paged context
        FMHA. 1.x (the 1.2.0rc2 copy, commit b35ac1b, and trtGptModelFactory.h): fixExecutorConfig turns reuse off with
        a warning only, for an engine without paged context FMHA or one that computes context logits."""
        if not asked:
            return False
        if _state.series() < (1, 0):
            if not self.limits.use_paged_context_fmha:
                raise _tllm_error(
                    "When KV cache block reuse is set, model has to be built with paged context FMHA support"
                )
            return True
        if not self.limits.use_paged_context_fmha:
            log.warning(
                "Fixing executorConfig: KV cache reuse disabled because model was not built with paged context FMHA "
                "support"
            )
            return False
        if self.limits.gather_context_logits:
            log.warning(
                "Fixing executorConfig: KV cache reuse disabled because model was built to return context logits"
            )
            return False
        return True

    def _runtime_max_input_len(self, config) -> int:
        """The longest prompt a request may have, per cpp/tensorrt_llm/batch_manager/trtGptModel.h (the 0.x copy that
        takes TrtGptModelOptionalParams and the 1.x one that takes an ExecutorConfig say the same, and a 0.12.0.dev
        engine's log prints it): maxSequenceLen - 1 with chunked context; min(maxSequenceLen - 1, maxNumTokens) for
        an engine with context FMHA and packed input; the build's max_input_len otherwise. LlmRequest::validate
        fails a longer prompt."""
        if config.enable_chunked_context:
            return self.limits.max_seq_len - 1
        if self.limits.context_fmha and self.limits.packed_input:
            tokens = self.limits.max_num_tokens
            if config.max_num_tokens is not None and config.max_num_tokens <= tokens:
                tokens = config.max_num_tokens  # a larger runtime value is ignored, with a warning
            return min(self.limits.max_seq_len - 1, tokens)
        return self.limits.max_input_len

    def _lookahead_config(self, config):
        """(W, N, G) when the ExecutorConfig asks for lookahead decoding, after lookaheadDecodingLayer.cpp's checks."""
        decoding = getattr(config, "decoding_config", None)
        la = getattr(decoding, "lookahead_decoding_config", None)
        if la is None:
            return None
        if config.max_beam_width != 1:
            raise _tllm_error("Beam width must be 1 in Lookahead decoding.")
        # trtGptModelInflightBatching.cpp: an engine built with more draft tokens is resized down to (W, N, G)'s
        # (setMaxDraftTokens), so only a larger (W, N, G) fails.
        max_draft_tokens = la.calculate_speculative_resource()[2]
        if max_draft_tokens > self.limits.max_draft_len:
            raise _tllm_error(
                f"maxDraftTokens <= mModelConfig.getMaxDecodingDraftTokens() ({max_draft_tokens} > "
                f"{self.limits.max_draft_len})"
            )
        return la.max_window_size, la.max_ngram_size, la.max_verification_set_size

    def _medusa_config(self, config, blob):
        """(the tree's paths, each depth's top-k, the heads' weights) on a Medusa engine, after medusaModule.cpp's
        checks (module docstring)."""
        choices = getattr(getattr(config, "decoding_config", None), "medusa_choices", None)
        if not self.limits.speculative_decoding_mode & 4:  # SpeculativeDecodingMode.MEDUSA
            if choices is not None:
                raise NotImplementedError("fake tensorrt_llm: medusa_choices for an engine without Medusa heads")
            return None
        if choices is None:
            # what the real runtime does for a Medusa engine given no medusa_choices was not read (lmi-trt always
            # sends a tree)
            raise NotImplementedError("fake tensorrt_llm: a Medusa engine without medusa_choices is not modelled")
        if config.max_beam_width != 1:
            raise NotImplementedError("fake tensorrt_llm: Medusa with beam search is not modelled")
        import base64

        import torch
        from safetensors.torch import load

        pretrained = json.loads((self._dir / "config.json").read_text())["pretrained_config"]
        if pretrained["hidden_act"] != "silu":  # model.py: MedusaHead(hidden_act=config.hidden_act)
            raise NotImplementedError(f"fake tensorrt_llm: Medusa heads with {pretrained['hidden_act']} (not silu)")
        paths = _medusa_tree(choices, self.limits.max_draft_len, pretrained["num_medusa_heads"])
        top_k = [max(p[d] for p in paths if len(p) > d) + 1 for d in range(max(map(len, paths)))]
        weights = {n: t.to(torch.float32) for n, t in load(base64.b64decode(blob["medusa_heads"])).items()}
        return paths, top_k, weights, pretrained["num_medusa_layers"]

    # ---------------------------------------------------------------- client API

    def enqueue(self, request) -> int:
        if not self.is_leader:
            raise _tllm_error("Only the leader rank can enqueue requests")
        if self._closed:
            raise _tllm_error("Cannot enqueue requests after the executor was shut down")
        if request.__class__ is not self._api.Request:
            raise TypeError(f"enqueue_request(): expected a {self._api.Request.__module__}.Request, got {request!r}")
        sc, oc = request.sampling_config, request.output_config
        if getattr(request, "lookahead_config", None) is not None:
            raise NotImplementedError("fake tensorrt_llm: a request's own lookahead_config is not modelled")
        if self._lookahead is not None and oc.return_log_probs:
            raise _tllm_error("lookahead decoding: outputLogProbs are not supported")
        if self._medusa is not None and oc.return_log_probs:
            # medusaDecodingLayer.cpp passes no log-prob outputs to its sampling (a comment, not a check): what a
            # log-prob request gets back beside Medusa was not read
            raise NotImplementedError("fake tensorrt_llm: log-prob requests beside Medusa are not modelled")
        if self._medusa is not None and not (sc.top_k == 1 or (not sc.top_k and not sc.top_p)):
            raise NotImplementedError("fake tensorrt_llm: sampled requests beside Medusa are not modelled")
        drafts = self._external_drafts(request)
        if sc.beam_width > self.max_beam_width:
            raise _tllm_error(
                f"Request beam width ({sc.beam_width}) is larger than the executor's max beam width "
                f"({self.max_beam_width})"
            )
        with self._cv:
            rid = self._next_id
            self._next_id += 1
            self._waiting.append(
                _Seq(
                    id=rid,
                    prompt=request.input_token_ids,
                    max_tokens=request.max_tokens,
                    streaming=request.streaming,
                    exclude_input=oc.exclude_input_from_output,
                    return_all=request.return_all_generated_tokens,
                    return_log_probs=oc.return_log_probs,
                    end_id=-1 if request.end_id is None else request.end_id,
                    beam_width=sc.beam_width,
                    sampling=sc,
                    bad_words=[list(w) for w in request.bad_words or []],
                    stop_words=[list(w) for w in request.stop_words or []],
                    client_id=request.client_id,
                    guide=self._guide(request),
                    embedding_bias=self._embedding_bias(request),
                    lora_config=request.lora_config,
                    drafts=drafts,
                )
            )
            self._cv.notify_all()
        return rid

    def _external_drafts(self, request) -> list[int]:
        """A request's ``external_draft_tokens_config`` tokens (module docstring: draft tokens). What the fake does not
        model is refused: draft logits (acceptance by logits), drafts beside lookahead, sampled or log-prob requests."""
        config = request.external_draft_tokens_config
        if config is None or not config.tokens:
            return []
        sc = request.sampling_config
        if config.logits is not None:
            raise NotImplementedError("fake tensorrt_llm: acceptance of draft tokens by their logits is not modelled")
        if self._lookahead is not None:
            raise NotImplementedError("fake tensorrt_llm: external draft tokens beside lookahead are not modelled")
        if not (sc.top_k == 1 or (not sc.top_k and not sc.top_p)) or request.output_config.return_log_probs:
            raise NotImplementedError("fake tensorrt_llm: draft tokens of a sampled or log-prob request: not modelled")
        return list(config.tokens)

    def _embedding_bias(self, request):
        """executor.h: "Expected type is kFP32 and shape is [vocab_size]" (the fake checks both)."""
        import torch

        bias = request.embedding_bias
        if bias is None:
            return None
        vocab = self._model.config.vocab_size
        if not isinstance(bias, torch.Tensor) or bias.dtype != torch.float32 or tuple(bias.shape) != (vocab,):
            raise _tllm_error(f"embedding_bias must be a float32 tensor of shape [{vocab}]")
        return bias

    def _guide(self, request) -> tuple[str, str | None] | None:
        params = getattr(request, "guided_decoding_params", None)
        if params is None:
            return None
        if self._grammars is None:  # what the real Executor does here was not read; the fake refuses
            raise _tllm_error("guided_decoding_params needs an Executor built with a guided_decoding_config")
        return params.guide_type.name, params.guide

    def cancel(self, rid: int) -> None:
        with self._cv:
            self._cancel.add(rid)
            self._cv.notify_all()

    def await_responses(self, rid, timeout: float | None) -> list:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                picked = [r for r in self._ready if rid is None or r.request_id == rid]
                if picked:
                    self._ready = [r for r in self._ready if not (rid is None or r.request_id == rid)]
                    return picked
                if self._closed:
                    return []
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cv.wait(remaining)

    def num_ready(self, rid) -> int:
        with self._cv:
            return sum(1 for r in self._ready if rid is None or r.request_id == rid)

    def drain_iteration_stats(self) -> list:
        with self._cv:
            out = list(self._stats)
            self._stats.clear()
            return out

    def drain_request_stats(self) -> list:
        return []  # request_stats_max_iterations is 0 unless asked for; the fake keeps none

    def shutdown(self) -> None:
        if self._closed:
            return
        if not self.is_leader:
            # Follower ranks run until the leader shuts down (CommunicationMode::kLEADER, executor.h).
            if self._world.comm is not None:
                self._world.comm.bcast(None, root=0)
            else:
                _shutdown_event(self._dir).wait()
            self._closed = True
            return
        with self._cv:
            self._stop = True
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._world.comm is not None:
            self._world.comm.bcast("shutdown", root=0)
        else:
            _shutdown_event(self._dir).set()

    # ---------------------------------------------------------------- step loop

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not self._active:
                    self._cv.wait()
                if self._stop:
                    return
                started = time.monotonic()
                out = self._take_cancellations()
                admitted = self._admit(out)
            for seq in list(self._active):
                self._step(seq, admitted, out)
            with self._cv:
                done = {r.request_id for r in out if r.has_error() or r.result.is_final}
                self._active = [s for s in self._active if s.id not in done]
                self._ready.extend(out)
                self._record_stats(started, len(admitted), len(done))
                self._cv.notify_all()

    def _take_cancellations(self) -> list:
        out = []
        for seq in [s for s in (*self._waiting, *self._active) if s.id in self._cancel]:
            if seq in self._active:
                self._active.remove(seq)
            else:
                self._waiting.remove(seq)
            if (
                not _state.is_0x()
            ):  # final CANCELLED results exist since 0.16 (executor.h, Response/Result finish reasons)
                out.append(self._result(seq, self._api.FinishReason.CANCELLED))
        self._cancel.clear()
        return out

    def _fetch_lora(self, out: list) -> None:
        """executorImpl.cpp's fetch loop: every newly fetched request's LoRA task goes into the PEFT host cache
        before any scheduling (``mModel->updatePeftCache(newReq)``), marked in progress until its request ends; a
        ``LoraExpectedException`` (a task not cached, "PEFT Cache is full") is an error Response for that request
        (``catch (runtime::LoraExpectedException)``). The fake fetches every queued request at once."""
        for seq in [s for s in self._waiting if not s.fetched]:
            seq.fetched = True
            in_use = {
                s.lora_config.task_id
                for s in [*self._active, *self._waiting]
                if s.lora_config is not None and s.fetched and s is not seq
            }
            try:
                seq.lora = self._lora.admit(seq.lora_config, in_use)
            except RuntimeError as exc:
                self._waiting.remove(seq)
                out.append(self._api.Response(seq.id, str(exc), seq.client_id))

    def _admit(self, out: list) -> set[int]:
        admitted = set()
        self._fetch_lora(out)
        if not self._waiting:
            return admitted
        # getLeaderNewReqWithIds: the operating beam width is the running requests' (the first
        # queued request's when none runs); the queue is not dequeued past a request of another width.
        operating = self._active[0].beam_width if self._active else self._waiting[0].beam_width
        while self._waiting and len(self._active) < self.max_batch_size:
            if self._waiting[0].beam_width != operating:
                break
            if not self._lora.fits(self._waiting[0].lora_config, [s.lora_config for s in self._active]):
                break  # its adapter's PEFT pages do not fit beside the running ones' (capacityScheduler.cpp)
            seq = self._waiting.popleft()
            if len(seq.prompt) > self.max_input_len:
                out.append(
                    self._api.Response(
                        seq.id,
                        f"[TensorRT-LLM][ERROR] Prompt length ({len(seq.prompt)}) exceeds maximum input length "
                        f"({self.max_input_len}). Set log level to info and check TRTGptModel logs for how "
                        "maximum input length is set",
                        seq.client_id,
                    )
                )
                continue
            room = self.limits.max_seq_len - len(seq.prompt)
            if seq.max_tokens > room:
                log.warning(
                    "Prompt length + number of requested output tokens (%d + %d) exceeds maximum sequence length "
                    "(%d). Number of requested output tokens is reduced to %d.",
                    len(seq.prompt),
                    seq.max_tokens,
                    self.limits.max_seq_len,
                    room,
                )
                seq.max_tokens = room
            if seq.max_tokens <= 0:
                out.append(self._result(seq, self._api.FinishReason.LENGTH))
                continue
            self._active.append(seq)
            admitted.add(seq.id)
        return admitted

    def _step(self, seq: _Seq, admitted: set[int], out: list) -> None:
        import torch

        try:
            with torch.no_grad():
                if seq.beam_width > 1:
                    out.append(self._beam_search(seq))
                    return
                if seq.id in admitted:
                    if seq.guide is not None:  # compiled in the executor loop: a bad guide fails this request only
                        seq.matcher = self._grammars.create(*seq.guide)
                    if seq.drafts:
                        seq.steps += 1
                        reason = self._verify_drafts(seq)
                        if reason is not None or seq.streaming:
                            out.append(self._result(seq, reason))
                        return
                    self._forward(seq, seq.prompt)
                seq.steps += 1
                if self._lookahead is not None:
                    reason = self._lookahead_step(seq)
                elif self._medusa is not None:
                    reason = self._medusa_step(seq)
                else:
                    token, logprob = _select(seq)
                    reason = self._advance(seq, token, logprob)
                    if reason is None:
                        self._forward(seq, [token])
        except Exception as exc:  # one request's failure must not end the others
            out.append(self._api.Response(seq.id, f"[TensorRT-LLM][ERROR] {exc}", seq.client_id))
            return
        if reason is not None or seq.streaming:
            out.append(self._result(seq, reason))

    def _forward(self, seq: _Seq, ids: list[int]) -> None:
        import torch

        self._lora.use(seq.lora)  # every pass sets the adapter it runs with (None: the base model)
        medusa = self._medusa is not None
        res = self._model(
            input_ids=torch.tensor([ids]), use_cache=True, output_hidden_states=medusa, **cache_kwargs(seq.past)
        )
        seq.past, seq.logits = returned_cache(res), res.logits[0, -1].float()
        if medusa:  # transformers' last hidden state is after the final norm, as the heads read it (model.py)
            seq.hidden = res.hidden_states[-1][0, -1].float()

    def _medusa_step(self, seq: _Seq):
        """One Medusa step (module docstring): the root, the heads' tree, the longest accepted path."""
        import copy

        import torch

        paths, top_k, w, layers = self._medusa
        root = int(torch.argmax(seq.logits))
        proposals = []
        for d, k in enumerate(top_k):
            x = seq.hidden
            for n in range(layers):
                linear = f"medusa_heads.{d}.medusa_layers.{n}.linear."
                # the base model's hidden_act (model.py), silu: _medusa_config takes no other
                x = x + torch.nn.functional.silu(x @ w[linear + "weight"].T + w[linear + "bias"])
            logits = x @ w[f"medusa_heads.{d}.lm_head.weight"].T
            proposals.append([int(t) for t in torch.topk(logits, k).indices])
        leaves = [p for p in paths if not any(len(q) == len(p) + 1 and q[:-1] == p for q in paths)]
        best: list[int] = []
        for leaf in leaves:
            draft = [proposals[d][rank] for d, rank in enumerate(leaf)]
            res = self._model(
                input_ids=torch.tensor([[root, *draft]]), use_cache=True, **cache_kwargs(copy.deepcopy(seq.past))
            )
            kept = accepted_prefix([int(t) for t in res.logits[0].argmax(-1)], draft)  # [i]: the target after i
            if len(kept) > len(best):
                best = kept
        return self._emit(seq, [root, *best])

    def _emit(self, seq: _Seq, tokens: list[int]):
        """A speculative step's tokens, up to the first that ends the request; the model then reads those taken."""
        taken = []
        for token in tokens:
            reason = self._advance(seq, token, 0.0)
            if reason is not None:
                return reason
            taken.append(token)
        self._forward(seq, taken)
        return None

    def _lookahead_step(self, seq: _Seq):
        """One lookahead step: verify the pool's candidates against the target's greedy choices, take the longest
        accepted prefix and the target's token after it (module docstring)."""
        import copy

        import torch

        _window, ngram, verification_set = self._lookahead
        first = int(torch.argmax(seq.logits))
        accepted, targets = [], [first]
        for draft in lookahead_candidates(seq.prompt + seq.generated, ngram - 1, verification_set):
            res = self._model(input_ids=torch.tensor([draft]), use_cache=True, **cache_kwargs(copy.deepcopy(seq.past)))
            greedy = [first, *(int(t) for t in res.logits[0].argmax(-1))]
            kept = accepted_prefix(greedy, draft)
            if len(kept) > len(accepted):
                accepted, targets = kept, greedy
        return self._emit(seq, [*accepted, targets[len(accepted)]])

    def _verify_drafts(self, seq: _Seq):
        """The context step of a request with draft tokens: the prompt and the drafts in one pass, then at each
        position the token the request's SamplingConfig chooses there (greedy: the argmax), keeping drafts while they
        equal it and ending with the target's own token (externalDraftTokensLayer.cpp, accepted by id without draft
        logits); the request ends there (module docstring). More drafts than the engine's max_draft_len fail this
        request (cpp/tensorrt_llm/batch_manager/llmRequest.cpp ``LlmRequest::validate``, 1.x copies, which runs
        before verifyRequests ever sees it). The real scheduler may also drop drafts that do not fit the context
        chunk (microBatchScheduler); the fake does not."""
        import torch

        drafts, most = seq.drafts, self.limits.max_draft_len
        if len(drafts) > most:
            raise _tllm_error(f"Draft tokens length ({len(drafts)}) exceeds maximum draft tokens length ({most}).")
        self._lora.use(seq.lora)
        res = self._model(input_ids=torch.tensor([seq.prompt + drafts]))
        positions = res.logits[0, len(seq.prompt) - 1 :].float()
        kept = 0
        for i in range(len(drafts) + 1):
            seq.logits = positions[i]
            token, logprob = _select(seq)
            if i < len(drafts) and accepts(token, drafts[i]):
                token, kept = drafts[i], kept + 1
            reason = self._advance(seq, token, logprob)
            if reason is not None:
                return reason
            if i == kept - 1:
                continue
            break
        # The request ends with this one step (module docstring); its finish reason there was not read, and
        # NOT_FINISHED is the one a client cannot mistake for an end of sequence by length.
        return self._api.FinishReason.NOT_FINISHED

    def _advance(self, seq: _Seq, token: int, logprob: float):
        fr = self._api.FinishReason
        if token == seq.end_id:
            return fr.END_ID
        if seq.matcher is not None:
            seq.matcher.accept_token(token)
        seq.generated.append(token)
        seq.log_probs.append(logprob)
        if any(w and seq.generated[-len(w) :] == w for w in seq.stop_words):
            return fr.STOP_WORDS
        if len(seq.generated) >= seq.max_tokens:
            return fr.LENGTH
        return None

    def _result(self, seq: _Seq, reason):
        res = self._api.Result()
        res.is_final = res.is_sequence_final = reason is not None
        if seq.streaming:
            # Tokens are the delta, log-probs cumulative (LlmRequest::createResult).
            start = 0 if seq.return_all else seq.sent
            tokens, lps = seq.generated[start:], seq.log_probs
        else:
            tokens, lps = seq.generated, seq.log_probs
            if not seq.exclude_input:
                tokens = seq.prompt + tokens
        seq.sent = len(seq.generated)
        res.output_token_ids = [list(tokens)]
        res.finish_reasons = [reason if reason is not None else self._api.FinishReason.NOT_FINISHED]
        if hasattr(res, "decoding_iter"):  # not every release's Result binds it (bindings.executor._Result012)
            speculative = self._lookahead is not None or self._medusa is not None or seq.drafts
            res.decoding_iter = seq.steps if speculative else len(seq.generated)
        if seq.return_log_probs:
            res.log_probs = [list(lps)]
            res.cum_log_probs = [float(sum(seq.log_probs))]
        return self._api.Response(seq.id, res, seq.client_id)

    def _beam_search(self, seq: _Seq):
        import torch

        if seq.stop_words:
            # Not modelled, and never kinder than the real thing: the beam kernels put a beam in the finished
            # candidates on end_id only (is_end_token, beamSearchKernelsTemplate.h) and a stop word merely marks
            # it finished; NVIDIA/TensorRT-LLM#7145 (0.21) crashes on beams with stop tokens.
            raise RuntimeError("beam search with stop words: not modelled by this fake (see NVIDIA/TensorRT-LLM#7145)")
        sc = seq.sampling
        self._lora.use(seq.lora)  # the adapter's deltas in every beam's forward pass
        gen = self._model.generate(
            torch.tensor([seq.prompt]),
            num_beams=seq.beam_width,
            num_return_sequences=sc.num_return_sequences or seq.beam_width,
            max_new_tokens=seq.max_tokens,
            do_sample=False,
            eos_token_id=seq.end_id if seq.end_id >= 0 else None,
            pad_token_id=max(seq.end_id, 0),
            length_penalty=sc.length_penalty if sc.length_penalty is not None else 0.0,
            early_stopping=early_stopping_hf(sc.early_stopping),
        )
        fr, beams, reasons = self._api.FinishReason, [], []
        for row in gen[:, len(seq.prompt) :].tolist():
            ended = seq.end_id in row
            row = row[: row.index(seq.end_id)] if ended else row
            beams.append(row if seq.exclude_input else seq.prompt + row)
            reasons.append(fr.END_ID if ended else fr.LENGTH)
        res = self._api.Result()
        res.is_final = res.is_sequence_final = True
        res.output_token_ids, res.finish_reasons = beams, reasons
        return self._api.Response(seq.id, res, seq.client_id)

    def _record_stats(self, started: float, new: int, completed: int) -> None:
        api, tpb = self._api, self.limits.tokens_per_block
        kv = api.KvCacheStats()
        kv.tokens_per_block = tpb
        kv.max_num_blocks = self._kv_max_tokens // tpb
        kv.used_num_blocks = sum(-(-(len(s.prompt) + len(s.generated)) // tpb) for s in self._active)
        kv.free_num_blocks = max(kv.max_num_blocks - kv.used_num_blocks, 0)
        ifb = api.InflightBatchingStats()
        ifb.num_scheduled_requests = len(self._active) + completed
        ifb.num_context_requests = new
        ifb.num_gen_requests = len(self._active) + completed - new
        st = api.IterationStats()
        st.timestamp = datetime.datetime.now().strftime("%m-%d-%Y %H:%M:%S.%f")
        st.iter = self._iter
        st.iter_latency_ms = (time.monotonic() - started) * 1000.0
        st.num_new_active_requests = new
        st.num_active_requests = len(self._active)
        st.num_queued_requests = len(self._waiting)
        st.num_completed_requests = completed
        st.max_num_active_requests = self.max_batch_size
        st.kv_cache_stats = kv
        st.inflight_batching_stats = ifb
        self._iter += 1
        self._stats.append(st)


def _hold_gil(seconds: float, until: str | None = None) -> None:
    """Block in C without releasing the GIL, as the Executor constructor binding does for its load:
    ``ctypes.PyDLL`` keeps the GIL across the call (``ctypes.CDLL`` would release it). ``until`` (a FIFO):
    block until a byte is written to it instead, so a test ends the load once it has seen what it needs
    rather than sleeping for a bound long enough for a loaded machine."""
    if seconds <= 0 and until is None:
        return
    import ctypes

    libc = ctypes.PyDLL(None, use_errno=True)
    if until is not None:
        log.info("fake Executor: the engine load holds the GIL until %s is written", until)
        fd = libc.open(until.encode(), os.O_RDONLY)
        if fd < 0 or libc.read(fd, ctypes.create_string_buffer(1), 1) != 1:
            raise OSError(ctypes.get_errno(), f"fake Executor: no byte read from {until}")
        libc.close(fd)
    else:

        class _Timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        whole = int(seconds)
        log.info("fake Executor: the engine load holds the GIL for %.1f s", seconds)
        libc.nanosleep(ctypes.byref(_Timespec(whole, int((seconds - whole) * 1e9))), None)
    log.info("fake Executor: the engine load released the GIL")


def _load_model(hf_dir: str | None):
    if hf_dir is None:
        raise _tllm_error("this engine was built from a model without weights (from_config); nothing to run")
    import torch
    from transformers import AutoModelForCausalLM

    from lmi_trt.compat import dtype_kwargs  # transformers < 4.56 (the 0.12 and 1.0 images) spells it torch_dtype

    return AutoModelForCausalLM.from_pretrained(hf_dir, **dtype_kwargs(torch.float32)).eval()


def _medusa_prefix(path, length):
    """speculativeChoicesUtils.cpp computePrefix: ``length`` ranks of ``path`` in 4-bit chunks, with its checks."""
    if length > 16:  # sizeof(uint64_t) * 8 / PREFIX_CHUNK_SIZE_BITS
        raise _tllm_error(f"Provided choices have depth ({length}) larger than Prefix can fit (16).")
    prefix = 0
    for i in range(length):
        if path[i] > 16:  # PREFIX_MAX_VALUE
            raise _tllm_error(
                f"Provided choices have too large node degree ({path[i]}). Larger than Prefix can fit (16)."
            )
        prefix |= path[i] << 4 * (length - 1 - i)
    return prefix


def _medusa_tree(choices, max_draft_len, heads):
    """The tree's checks at the Executor's start, in the order of speculativeChoicesUtils.cpp
    ``initTensorsFromChoices`` (1.x copy id 182244635): every path's prefix, the count against the engine's draft
    tokens, then, with the paths sorted by depth and prefix, each new depth one deeper than the last and within the
    heads. A path whose parent is missing at an existing depth is hung under the root there, and a repeated path
    becomes a second node: neither is modelled (NotImplementedError); lmi-trt refuses both first."""
    paths = [tuple(c) for c in choices]
    prefixes = {path: _medusa_prefix(path, len(path)) for path in paths}
    if len(paths) > max_draft_len:
        raise _tllm_error(f"numChoices <= getMaxDecodingDraftTokens() ({len(paths)} > {max_draft_len})")
    depth = 1
    for path in sorted(paths, key=lambda p: (len(p), prefixes[p])):
        if len(path) != depth:
            if depth + 1 != len(path):
                raise _tllm_error("depth + 1 == curDepth")
            if len(path) > heads:
                raise _tllm_error("Choices require larger maxPathLen than the engine was built with.")
            depth += 1
    if len(set(paths)) != len(paths) or any(len(p) > 1 and p[:-1] not in prefixes for p in paths):
        raise NotImplementedError("fake tensorrt_llm: a Medusa tree with a repeated path or a missing parent")
    return paths


def accepts(target: int, draft: int) -> bool:
    """Lookahead and Medusa verification: a draft token is kept only where the target model's greedy choice is that
    token (the
    tests patch this to accept everything, to show the output then changes)."""
    return target == draft


def accepted_prefix(targets: list[int], draft: list[int]) -> list[int]:
    """The leading draft tokens the target's choices at their positions accept."""
    kept = []
    for target, token in zip(targets, draft, strict=False):
        if not accepts(target, token):
            break
        kept.append(token)
    return kept


def lookahead_candidates(history: list[int], length: int, most: int) -> list[list[int]]:
    """Up to ``most`` distinct n-grams of ``length`` tokens that followed the last token earlier in ``history``,
    latest first: the fake's stand-in for the lookahead pool (module docstring)."""
    last, out = history[-1], []
    for i in range(len(history) - 2, -1, -1):
        draft = history[i + 1 : i + 1 + length]
        if history[i] == last and len(draft) == length and draft not in out:
            out.append(draft)
            if len(out) == most:
                break
    return out


def early_stopping_hf(early_stopping: int | None) -> bool | str:
    """SamplingConfig's earlyStopping as transformers' generate reads it: None is executor.h's default 1; 0 is the
    current-length heuristic (False), 1 True, and any other value "never" (beamSearchKernelsTemplate.h's
    "Specialization for earlyStopping == 'never'", which bounds by the engine's max_seq_len where transformers
    bounds by the request's length: the difference is why the serving code refuses "never")."""
    if early_stopping in (None, 1):
        return True
    return False if early_stopping == 0 else "never"


def _select(seq: _Seq) -> tuple[int, float]:
    """The next token and its log probability under the request's SamplingConfig."""
    import torch

    sc, logits = seq.sampling, seq.logits.clone()
    history = seq.prompt + seq.generated
    bias = getattr(seq, "embedding_bias", None)
    if bias is not None:  # added to the logits before anything else chooses (TensorRT-LLM's embedding bias)
        logits += bias
    matcher = getattr(seq, "matcher", None)
    if matcher is not None:
        _mask_by_grammar(matcher, logits)
    for word in seq.bad_words:
        if word and (len(word) == 1 or history[-(len(word) - 1) :] == word[:-1]):
            logits[word[-1]] = float("-inf")
    if sc.min_tokens and len(seq.generated) < sc.min_tokens and seq.end_id >= 0:
        logits[seq.end_id] = float("-inf")
    if sc.repetition_penalty is not None and sc.repetition_penalty != 1.0 and history:
        idx = torch.tensor(sorted(set(history)))
        picked = logits[idx]
        logits[idx] = torch.where(picked > 0, picked / sc.repetition_penalty, picked * sc.repetition_penalty)
    if seq.generated and (sc.presence_penalty or sc.frequency_penalty):
        counts = torch.bincount(torch.tensor(seq.generated), minlength=logits.numel()).float()
        logits -= (counts > 0).float() * (sc.presence_penalty or 0.0) + counts * (sc.frequency_penalty or 0.0)
    top_k, top_p = sc.top_k or 0, sc.top_p or 0.0
    if top_k == 1 or (top_k == 0 and top_p == 0.0):
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    logits = logits / (sc.temperature if sc.temperature else 1.0)
    logprobs = torch.log_softmax(logits, -1)
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(torch.softmax(ordered, -1), -1)
        drop = cumulative - torch.softmax(ordered, -1) >= top_p  # keep the smallest set reaching top_p
        logits[order[drop]] = float("-inf")
    if seq.generator is None:
        seq.generator = torch.Generator().manual_seed(sc.seed if sc.seed is not None else 0)
    token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=seq.generator))
    return token, float(logprobs[token])


def _mask_by_grammar(matcher, logits) -> None:
    """Guided decoding: the tokens the request's grammar does not allow next get -inf, before any sampling
    (tensorrt_llm/_torch/pyexecutor/guided_decoder.py applies xgrammar's token bitmask to the logits)."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(1, logits.numel())
    matcher.fill_next_token_bitmask(bitmask, 0)
    xgrammar.apply_token_bitmask_inplace(logits.unsqueeze(0), bitmask)
