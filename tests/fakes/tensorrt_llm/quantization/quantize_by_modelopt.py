"""Fake ``quantize_and_export`` (the modelopt flow): writes a quantized TRT-LLM checkpoint folder."""

from __future__ import annotations

from pathlib import Path

from tensorrt_llm.quantization.mode import QuantAlgo

# quantize.py --qformat / --kv_cache_dtype → QuantAlgo (NVIDIA/TensorRT-LLM examples/quantization/quantize.py and
# tensorrt_llm/quantization/quantize_by_modelopt.py).
_QFORMATS = {
    "int8_wo": QuantAlgo.W8A16,
    "int4_wo": QuantAlgo.W4A16,
    "nvfp4": QuantAlgo.NVFP4,
    "fp8": QuantAlgo.FP8,
    "fp8_pc_pt": QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN,
    "int4_awq": QuantAlgo.W4A16_AWQ,
    "w4a8_awq": QuantAlgo.W4A8_AWQ,
    "int8_sq": QuantAlgo.W8A8_SQ_PER_CHANNEL,
    "full_prec": None,
}
_KV_DTYPES = {"fp8": QuantAlgo.FP8, "int8": QuantAlgo.INT8, None: None}


def quantize_and_export(
    *,
    model_dir,
    device,
    calib_dataset,
    dtype,
    qformat,
    kv_cache_dtype,
    calib_size,
    batch_size,
    calib_max_seq_length,
    awq_block_size,
    output_dir,
    tp_size,
    pp_size,
    cp_size,
    seed,
    tokenizer_max_seq_length,
    num_medusa_heads=None,
    num_medusa_layers=None,
    max_draft_len=None,
    medusa_hidden_act=None,
    medusa_model_dir=None,
    quant_medusa_head=False,
    auto_quantize_bits=None,
    device_map="auto",
    quantize_lm_head=False,
):
    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import MODEL_MAP
    from tensorrt_llm.models.modeling_utils import (
        QuantConfig,
        _hf_config,
        _hf_dir,
        _pretrained_from_hf,
        _require_local_dataset,
        _write_checkpoint,
    )

    if qformat not in _QFORMATS:
        raise ValueError(f"Unsupported qformat {qformat!r}; choose from {sorted(_QFORMATS)}")
    if kv_cache_dtype not in _KV_DTYPES:
        raise ValueError(f"Unsupported kv_cache_dtype {kv_cache_dtype!r}; choose int8 or fp8")
    _require_local_dataset(calib_dataset)
    hf_dir = _hf_dir(model_dir)
    arch = (_hf_config(hf_dir).get("architectures") or ["?"])[0]
    if arch not in MODEL_MAP:
        raise ValueError(f"{arch} is not supported by the TensorRT-LLM export")
    quant = QuantConfig(
        quant_algo=_QFORMATS[qformat],
        kv_cache_quant_algo=_KV_DTYPES[kv_cache_dtype],
        group_size=awq_block_size,
    )
    mapping = Mapping(world_size=tp_size * pp_size * cp_size, tp_size=tp_size, pp_size=pp_size, cp_size=cp_size)
    config = _pretrained_from_hf(MODEL_MAP[arch], hf_dir, dtype, mapping, quant, {})
    _write_checkpoint(Path(output_dir), config, str(hf_dir), "auto_map" in _hf_config(hf_dir))
