"""``lmi-trt selftest``: does TensorRT-LLM work on this host, along the path ``serve`` takes?

Writes a tiny random Llama checkpoint and serves it with ``option.rolling_batch=trtllm`` on the
TensorRT-LLM backend ``serve`` would choose for a Hugging Face checkpoint (``option.backend``, by
``engines.choose_backend``; ``--backend`` picks one). On ``tensorrt`` it goes through
``lmi_trt.compile`` exactly as ``serve`` does (``stages.compile_if_needed``: plan → build in worker
processes → engine cache), asks again to check the cache answers and serves the engine through
``TrtllmEngine``; on ``pytorch`` (1.0 and later, the only one after 1.2) the LLM API's
``LlmApiEngine`` loads the checkpoint. Then one request and one stream. Prints PASS/FAIL per step;
needs a GPU and a supported TensorRT-LLM (no download: the model is made up on the spot).
``run_selftest`` returns whether every step passed; ``lmi-trt selftest`` exits 0 then, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmi_trt import stages
from lmi_trt.config import LmiConfig
from lmi_trt.engines import choose_backend, probe_trtllm
from lmi_trt.engines.base import Engine, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.registry import COMPILING_ENGINE, entry
from lmi_trt.engines.trtllm import TrtllmEngine, probe_runtime
from lmi_trt.sources import ModelArtifact

EOS, PAD = 2, 0
PROMPT = [1, 17, 42, 99, 7]
NEW_TOKENS = 8
MAX_BATCH = 4


class _StepFailed(Exception):
    pass


def _write_tiny_llama(hf_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # head_size 64: a size every TensorRT-LLM attention kernel supports.
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(hf_dir))
    _write_byte_tokenizer(hf_dir)


def _write_byte_tokenizer(hf_dir: Path) -> None:
    """A byte-level tokenizer beside the checkpoint (the LLM API loads one from the model folder, as serve's
    checkpoints have): the three special tokens at PAD, BOS and EOS, then one token per byte, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {"<pad>": PAD, "<s>": 1, "</s>": EOS}
    vocab = {**specials, **{ch: len(specials) + i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>").save_pretrained(
        str(hf_dir)
    )


def _config(root: Path, backend: str) -> LmiConfig:
    """What a user would put in serving.properties for this model, with the cache under ``root``."""
    return LmiConfig(
        model_id=str(root / "hf"),
        rolling_batch=COMPILING_ENGINE,
        backend=backend,
        dtype="fp16",
        max_input_len=32,
        max_output_len=32,
        max_rolling_batch_size=MAX_BATCH,
        download_dir=root / "download",
        engine_cache_uri=str(root / "engine-cache"),
        kv_cache_free_gpu_mem_fraction=0.2,
    )


def _backend(requested: str) -> str:
    """The backend ``serve`` would use for a Hugging Face checkpoint here, and why."""
    backend, why = choose_backend(requested, probe_trtllm(), "hf_checkpoint")
    return f"{backend} ({why})"


def _compile(config: LmiConfig) -> ModelArtifact:
    """The serve path's JIT stage: resolve the checkpoint, then plan → build → cache."""
    from lmi_trt.sources import resolve_model

    served = entry(COMPILING_ENGINE, config.backend)
    artifact = stages.compile_if_needed(served, config, resolve_model(config))
    if artifact.kind != "trtllm_engine":
        raise _StepFailed(f"the compile stage gave a {artifact.kind}, not an engine")
    return artifact


async def _generate(engine: Engine, streaming: bool) -> tuple[list[int], list, FinishReason | None]:
    request = GenerationRequest(
        f"selftest-{'stream' if streaming else 'request'}",
        PROMPT,
        SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True),
        streaming=streaming,
    )
    tokens, deltas, reason = [], [], None
    async for out in engine.submit(request):
        if out.error:
            raise _StepFailed(f"error {out.error_code}: {out.error}")
        tokens += out.token_ids
        deltas.append(out.token_ids)
        reason = out.finish_reason
    return tokens, deltas, reason


def _executor(config: LmiConfig, engine_dir: Path, gpu_available: Callable[[], bool] | None) -> Engine:
    settings = stages.trtllm_settings(stages.settle(config, COMPILING_ENGINE))  # as the loader builds them
    return TrtllmEngine(engine_dir, settings, eos_token_ids=[EOS], pad_token_id=PAD, gpu_available=gpu_available)


def _llm(config: LmiConfig, gpu_available: Callable[[], bool] | None) -> Engine:
    from lmi_trt.engines.llmapi import LlmApiEngine

    settings = stages.llmapi_settings(stages.settle(config, COMPILING_ENGINE))  # as the loader builds them
    return LlmApiEngine(config.model_id, settings, eos_token_ids=[EOS], pad_token_id=PAD, gpu_available=gpu_available)


async def _serve(engine: Engine, what: str, step) -> None:
    await step(f"start {what}", engine.start)
    try:

        async def one_request():
            tokens, _, reason = await _generate(engine, streaming=False)
            if len(tokens) != NEW_TOKENS or reason is not FinishReason.LENGTH:
                raise _StepFailed(f"expected {NEW_TOKENS} tokens ending LENGTH, got {tokens} ({reason})")
            return tokens

        reference = await step("one request", one_request)

        async def one_stream():
            tokens, deltas, reason = await _generate(engine, streaming=True)
            if tokens != reference or reason is not FinishReason.LENGTH or len(deltas) < 2:
                raise _StepFailed(f"stream gave {deltas} ({reason}), the request gave {reference}")
            return f"{len(deltas)} deltas"

        await step("one stream", one_stream)
    finally:
        await engine.close()


def unmet_needs(gpu_available: Callable[[], bool] | None = None) -> str | None:
    """One line saying what this host lacks for the self test and what to run instead; None when it has both."""
    from lmi_trt.engines.trtllm import cuda_available

    if importlib.util.find_spec("tensorrt_llm") is None:  # said without importing torch for the GPU probe (seconds)
        lacks = "TensorRT-LLM is not installed"
    elif not (gpu_available or cuda_available)():
        lacks = "no CUDA GPU is visible"
    else:
        return None
    return (
        f"lmi-trt selftest checks TensorRT-LLM on an NVIDIA GPU, and here {lacks}: run it where both "
        "are, e.g. `docker run --rm --gpus all lmi-trt:trtllm lmi-trt selftest` (docker/README.md); to try the "
        "embedded torch engine on this host, follow README.md's Quick start"
    )


def run_selftest(
    work_dir: Path | None = None,
    *,
    gpu_available: Callable[[], bool] | None = None,
    out: Callable[[str], None] = print,
    backend: str = "auto",
) -> bool:
    """Run every step, print ``PASS``/``FAIL`` lines, and return whether all passed."""
    with tempfile.TemporaryDirectory(prefix="lmi-trt-selftest-") as tmp:
        root = Path(work_dir or tmp)
        passed = True

        def report(name: str, ok: bool, detail: object) -> None:
            nonlocal passed
            passed &= ok
            out(f"{'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail not in (None, "") else ""))

        def sync_step(name: str, fn):
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001 — a self test reports every failure, it does not crash
                report(name, False, f"{type(exc).__name__}: {exc}")
                raise _StepFailed(name) from exc
            report(name, True, result if isinstance(result, str) else None)
            return result

        async def async_step(name: str, fn):
            try:
                result = await fn()
            except Exception as exc:  # noqa: BLE001
                report(name, False, f"{type(exc).__name__}: {exc}")
                raise _StepFailed(name) from exc
            report(name, True, result if isinstance(result, str) else None)
            return result

        try:
            chosen = sync_step("TensorRT-LLM backend for a Hugging Face checkpoint", lambda: _backend(backend))
            config = _config(root, chosen.split()[0])
            if not entry(COMPILING_ENGINE, config.backend).builds_engine:
                from lmi_trt.engines.llmapi import probe_llm_api

                sync_step("TensorRT-LLM and a GPU", lambda: f"TensorRT-LLM {probe_llm_api(gpu_available)[1]}")
                sync_step("write a tiny random Llama", lambda: _write_tiny_llama(root / "hf"))
                engine: Engine = _llm(config, gpu_available)
                what = "the LLM API (PyTorch backend)"
            else:
                sync_step("TensorRT-LLM and a GPU", lambda: f"TensorRT-LLM {probe_runtime(gpu_available)[1].version}")
                sync_step("write a tiny random Llama", lambda: _write_tiny_llama(root / "hf"))
                built = sync_step(
                    "plan, build and cache its engine (lmi_trt.compile, as serve does)", lambda: _compile(config)
                )

                def cached() -> str:
                    again = _compile(config)
                    if again.engine_dir != built.engine_dir:
                        raise _StepFailed(f"the engine cache answered {again.engine_dir}, not {built.engine_dir}")
                    return f"{built.engine_dir}"

                sync_step("the engine cache answers a second time", cached)
                engine, what = _executor(config, built.engine_dir, gpu_available), "the Executor"
            asyncio.run(_serve(engine, what, async_step))
        except _StepFailed:
            passed = False
        out("selftest " + ("PASSED" if passed else "FAILED"))
        return passed
