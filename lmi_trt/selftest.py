"""``lmi-trt selftest``: does TensorRT-LLM work on this host, end to end?

Builds a tiny random Llama engine through TensorRT-LLM's own build API, serves it through
``TrtllmEngine``, and sends one request and one stream. Prints PASS/FAIL per step; needs a GPU
and a supported TensorRT-LLM (no download: the model is made up on the spot).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmi_trt.engines.base import FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings, probe_runtime

EOS, PAD = 2, 0
PROMPT = [1, 17, 42, 99, 7]
NEW_TOKENS = 8


class _StepFailed(Exception):
    pass


def _write_tiny_llama(hf_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # head_size 64: a size every TensorRT-LLM attention kernel supports.
    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(hf_dir))


def _build_engine(hf_dir: Path, engine_dir: Path) -> None:
    from tensorrt_llm import BuildConfig, Mapping
    from tensorrt_llm.builder import build
    from tensorrt_llm.models import MODEL_MAP

    mapping = Mapping(world_size=1, rank=0, tp_size=1, pp_size=1)
    model = MODEL_MAP["LlamaForCausalLM"].from_hugging_face(str(hf_dir), dtype="float16", mapping=mapping)
    config = BuildConfig(max_batch_size=4, max_input_len=32, max_seq_len=64, max_num_tokens=256)
    build(model, config).save(str(engine_dir))


async def _generate(engine: TrtllmEngine, streaming: bool) -> tuple[list[int], list, FinishReason | None]:
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


async def _serve(engine_dir: Path, gpu_available: Callable[[], bool] | None, step) -> None:
    engine = TrtllmEngine(engine_dir, TrtllmSettings(kv_cache_free_gpu_mem_fraction=0.2),
                          eos_token_ids=[EOS], pad_token_id=PAD, gpu_available=gpu_available)
    await step("start the Executor", engine.start)
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


def run_selftest(
    work_dir: Path | None = None,
    *,
    gpu_available: Callable[[], bool] | None = None,
    out: Callable[[str], None] = print,
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
            sync_step("TensorRT-LLM and a GPU", lambda: f"TensorRT-LLM {probe_runtime(gpu_available)[1].version}")
            sync_step("write a tiny random Llama", lambda: _write_tiny_llama(root / "hf"))
            sync_step("build its engine", lambda: _build_engine(root / "hf", root / "engine"))
            asyncio.run(_serve(root / "engine", gpu_available, async_step))
        except _StepFailed:
            passed = False
        out("selftest " + ("PASSED" if passed else "FAILED"))
        return passed
