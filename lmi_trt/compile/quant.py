"""Quantization: the ``quantize`` choice + knobs → a TensorRT-LLM ``QuantConfig``, and calibration.

Planning (pure): ``plan_quant`` maps a ``Quantization`` value to ``QuantAlgo`` names
(NVIDIA/TensorRT-LLM tensorrt_llm/quantization/mode.py, ``QuantAlgo``) and decides how the weights get there:

* ``none`` / ``convert``: ``from_hugging_face(..., quant_config=...)`` quantizes weight-only
  formats itself (W8A16, W4A16); nothing to calibrate.
* ``modelopt``: our own calibration with nvidia-modelopt on the HF model (``mtq.quantize`` with the
  matching config, then ``export_tensorrt_llm_checkpoint``) into a TensorRT-LLM checkpoint that the
  build loads with ``from_checkpoint``. Used for FP8, AWQ, W8A8 per-channel SmoothQuant and the
  INT8 KV-cache variants.
* ``trtllm_native``: the per-token / per-tensor SmoothQuant plugin variants only TensorRT-LLM's own
  LLaMA quantizer produces (``LLaMAForCausalLM.quantize``).

Execution (``calibrate_and_export``) needs torch, transformers and nvidia-modelopt; it reads the
calibration text from a local .txt/.jsonl/.json file or folder (no hub needed).
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_serializer, field_validator

from lmi_trt.vocabulary import AWQ_BLOCK_SIZES, QUANTIZE_NAMES, Quantization, quantization_name

from .archs import ArchSpec, ModelDims, hf_architecture, rope_scaling, rope_theta
from .errors import BuildError, PlanError
from .options import CompileOptions

log = logging.getLogger(__name__)

# checkpoint: already quantized in the TensorRT-LLM checkpoint being built.
QuantMethod = Literal["none", "convert", "modelopt", "trtllm_native", "checkpoint"]

# Smallest compute capability each choice runs on (NVIDIA/TensorRT-LLM
# docs/source/legacy/reference/support-matrix.md, quantization by GPU architecture).
_MIN_SM: dict[Quantization | None, int] = {
    None: 0,
    Quantization.WEIGHTS_INT8: 75,
    Quantization.WEIGHTS_INT4: 75,
    Quantization.WEIGHTS_INT8_KV_INT8: 75,
    Quantization.WEIGHTS_INT4_KV_INT8: 75,
    Quantization.SMOOTHQUANT: 80,
    Quantization.AWQ: 80,
    Quantization.FP8: 89,
    Quantization.FP8_KV: 89,
}
W4A8_AWQ_MIN_SM = 89
DEFAULT_CALIB_DATASET = "cnn_dailymail"  # TensorRT-LLM's default; a hub dataset, so it needs network


class CalibrationPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str  # local file/folder, or a hub dataset name
    size: int  # samples
    batch_size: int
    max_seq_length: int
    awq_block_size: int | None = None
    smoothquant_alpha: float | None = None
    seed: int = 1234


class QuantPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    quantize: Quantization | None
    method: QuantMethod
    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None
    smoothquant_val: float | None = None
    modelopt_qformat: str | None = None
    modelopt_kv_cache_dtype: Literal["int8", "fp8"] | None = None
    modelopt_decoder: str | None = None
    calibration: CalibrationPlan | None = None

    @property
    def needs_calibration(self) -> bool:
        return self.method in ("modelopt", "trtllm_native")

    @property
    def weight_bits(self) -> int | None:
        """Bits per weight of the quantized linear layers; None when they keep the model dtype."""
        algo = self.quant_algo or ""
        if algo.startswith(("W4A", "NVFP4")):
            return 4
        if algo.startswith(("W8A", "FP8", "INT8")):
            return 8
        return None

    def quant_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``tensorrt_llm.models.modeling_utils.QuantConfig``."""
        kwargs: dict[str, Any] = {"quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo}
        if self.group_size is not None:
            kwargs["group_size"] = self.group_size
        if self.smoothquant_val is not None:
            kwargs["smoothquant_val"] = self.smoothquant_val
        return kwargs

    @field_serializer("quantize")
    def _quantize_name(self, value: Quantization | None) -> str:
        return quantization_name(value)  # "none" as before, so engine-cache keys stay what they were

    @field_validator("quantize", mode="before")
    @classmethod
    def _quantize_from_name(cls, value: Any) -> Any:
        return QUANTIZE_NAMES.get(value, value) if isinstance(value, str) else value  # the build worker's JSON


def _smoothquant_algo(opts: CompileOptions) -> tuple[str, QuantMethod]:
    """DJL's per_token/per_channel flags → the SmoothQuant variant (``QuantAlgo.W8A8_SQ_*`` in
    tensorrt_llm/quantization/mode.py)."""
    token, channel = opts.smoothquant_per_token, opts.smoothquant_per_channel
    if channel and not token:
        return "W8A8_SQ_PER_CHANNEL", "modelopt"  # modelopt int8_sq: per-channel weights, per-tensor activations
    if channel and token:
        return "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN", "trtllm_native"
    if token:
        return "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", "trtllm_native"
    return "W8A8_SQ_PER_TENSOR_PLUGIN", "trtllm_native"


def _supported_message(spec: ArchSpec, arch: str) -> str:
    names = ", ".join(sorted(quantization_name(q) for q in spec.quantizations))
    extra = " (AWQ on Mixtral crashes the compile: djl#3343/djl#3445)" if spec.family == "mixtral" else ""
    return f"Supported for {arch}: {names}{extra}"


def plan_quant(
    opts: CompileOptions, spec: ArchSpec, hf: dict[str, Any], dims: ModelDims, *, gpu_sm: int, tp: int
) -> tuple[QuantPlan, list[str]]:
    """The quantization part of the plan, and notes that explain choices a user may not expect."""
    q = opts.quantize
    arch = hf_architecture(hf)
    notes: list[str] = []
    if q not in spec.quantizations:
        raise PlanError(
            "option.quantize", quantization_name(q), f"not supported for {arch}", _supported_message(spec, arch)
        )
    min_sm = _MIN_SM[q]
    if q is Quantization.AWQ and opts.q_format == "w4a8_awq":
        min_sm = W4A8_AWQ_MIN_SM
    if gpu_sm < min_sm:
        raise PlanError(
            "option.quantize",
            quantization_name(q),
            f"needs a GPU of compute capability {min_sm / 10:.1f}+, this one is {gpu_sm / 10:.1f}",
            "Use weights_int8/weights_int4 or no quantization on this GPU"
            + (" (FP8 needs Ada/Hopper: L4, L40S, H100, H200)" if min_sm >= 89 else ""),
        )
    if q is None:
        return QuantPlan(quantize=q, method="none"), notes
    if q in (Quantization.WEIGHTS_INT8, Quantization.WEIGHTS_INT4):
        algo = "W8A16" if q is Quantization.WEIGHTS_INT8 else "W4A16"
        return QuantPlan(quantize=q, method="convert", quant_algo=algo), notes

    fields: dict[str, Any] = {}
    if q in (Quantization.WEIGHTS_INT8_KV_INT8, Quantization.WEIGHTS_INT4_KV_INT8):
        int8 = q is Quantization.WEIGHTS_INT8_KV_INT8
        fields = dict(
            method="modelopt",
            quant_algo="W8A16" if int8 else "W4A16",
            kv_cache_quant_algo="INT8",
            modelopt_qformat="int8_wo" if int8 else "int4_wo",
            modelopt_kv_cache_dtype="int8",
        )
        if not int8:
            notes.append("weights_kv_int4 = INT4 weights (W4A16) + INT8 KV cache: TensorRT-LLM has no INT4 KV cache")
    elif q is Quantization.SMOOTHQUANT:
        algo, method = _smoothquant_algo(opts)
        if method == "trtllm_native" and spec.trtllm_class != "LLaMAForCausalLM":
            raise PlanError(
                "option.smoothquant_per_token" if opts.smoothquant_per_token else "option.smoothquant_per_channel",
                False,
                f"the {algo} variant comes from TensorRT-LLM's LLaMA quantizer, which {arch} does not use",
                "Set option.smoothquant_per_channel=true and option.smoothquant_per_token=false "
                "(W8A8_SQ_PER_CHANNEL through modelopt)",
            )
        fields = dict(
            method=method,
            quant_algo=algo,
            smoothquant_val=opts.smoothquant_alpha,
            modelopt_qformat="int8_sq" if method == "modelopt" else None,
        )
        if opts.multi_query_mode:
            notes.append(
                "option.multi_query_mode ignored: KV heads are read from config.json "
                f"({dims.num_kv_heads} of {dims.num_heads})"
            )
    elif q is Quantization.AWQ:
        _check_awq_blocks(opts.awq_block_size, dims, tp)
        fields = modelopt_fields(opts)
    elif q in (Quantization.FP8, Quantization.FP8_KV):
        fields = modelopt_fields(opts)
    decoder = spec.modelopt_decoder_for(arch)
    if fields["method"] == "modelopt" and decoder is None:
        raise PlanError(
            "option.quantize",
            quantization_name(q),
            f"no calibration path (modelopt export) exists for {arch}",
            _supported_message(spec, arch),
        )
    notes += calibration_notes(opts)
    return QuantPlan(
        quantize=q,
        modelopt_decoder=decoder if fields["method"] == "modelopt" else None,
        calibration=calibration_plan(opts),
        **fields,
    ), notes


def modelopt_fields(opts: CompileOptions) -> dict[str, Any]:
    """Pure: the ``QuantPlan`` fields of the modelopt formats both backends load (FP8, FP8 + FP8 KV cache, AWQ)."""
    q = opts.quantize
    if q is Quantization.AWQ:
        return dict(
            method="modelopt",
            quant_algo="W4A16_AWQ" if opts.q_format == "int4_awq" else "W4A8_AWQ",
            group_size=opts.awq_block_size,
            modelopt_qformat=opts.q_format,
        )
    kv = q is Quantization.FP8_KV
    return dict(
        method="modelopt",
        quant_algo="FP8",
        kv_cache_quant_algo="FP8" if kv else None,
        modelopt_qformat="fp8",
        modelopt_kv_cache_dtype="fp8" if kv else None,
    )


def calibration_plan(opts: CompileOptions) -> CalibrationPlan:
    q = opts.quantize
    return CalibrationPlan(
        dataset=str(opts.calib_dataset) if opts.calib_dataset is not None else DEFAULT_CALIB_DATASET,
        size=opts.calib_size,
        batch_size=opts.calib_batch_size,
        max_seq_length=opts.calib_max_seq_length,
        awq_block_size=opts.awq_block_size if q is Quantization.AWQ else None,
        smoothquant_alpha=opts.smoothquant_alpha if q is Quantization.SMOOTHQUANT else None,
    )


def calibration_notes(opts: CompileOptions) -> list[str]:
    if opts.calib_dataset is not None:
        return []
    return [
        f"calibration data: hub dataset {DEFAULT_CALIB_DATASET!r} (needs network and the `datasets` package); "
        "set option.calib_dataset to a local .txt/.jsonl file to calibrate offline"
    ]


def _check_awq_blocks(block: int, dims: ModelDims, tp: int) -> None:
    """Every GEMM input dimension per rank must be a multiple of the AWQ block (modelopt export checks it late)."""
    for name, size in (("hidden_size", dims.hidden_size), ("intermediate_size", dims.intermediate_size)):
        if (size // tp) % block:
            options = [
                b
                for b in sorted(AWQ_BLOCK_SIZES, reverse=True)
                if (dims.hidden_size // tp) % b == 0 and (dims.intermediate_size // tp) % b == 0
            ]
            raise PlanError(
                "option.awq_block_size",
                block,
                f"{name}/TP = {size}/{tp} = {size // tp} is not a multiple of the AWQ block size",
                f"Use option.awq_block_size in {options}"
                if options
                else "Lower option.tensor_parallel_degree or use another quantization",
            )


# ---------------------------------------------------------------------------------------------
# calibration data
# ---------------------------------------------------------------------------------------------

_TEXT_KEYS = ("text", "article", "content", "prompt", "input", "document")


def _texts_from_record(record: Any) -> Iterator[str]:
    if isinstance(record, str):
        yield record
    elif isinstance(record, dict):
        for key in _TEXT_KEYS:
            if isinstance(record.get(key), str):
                yield record[key]
                return
        strings = [v for v in record.values() if isinstance(v, str)]
        if strings:
            yield max(strings, key=len)


def _texts_from_file(path: Path) -> Iterator[str]:
    suffix = path.suffix.lower()
    with path.open(encoding="utf-8") as f:
        if suffix == ".jsonl":
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield from _texts_from_record(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise PlanError(
                            "option.calib_dataset",
                            str(path),
                            f"line {n} is not JSON ({e.msg})",
                            'Write one JSON object per line with a "text" field',
                        ) from None
        elif suffix == ".json":
            data = json.load(f)
            for record in data if isinstance(data, list) else [data]:
                yield from _texts_from_record(record)
        else:
            for line in f:
                if line.strip():
                    yield line.rstrip("\n")


def load_calibration_texts(dataset: str, size: int) -> list[str]:
    """Up to ``size`` non-empty samples from a local file/folder, else from a hub dataset."""
    path = Path(dataset).expanduser()
    if path.exists():
        files = (
            sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in (".txt", ".jsonl", ".json"))
            if path.is_dir()
            else [path]
        )
        texts: list[str] = []
        for file in files:
            for text in _texts_from_file(file):
                if text.strip():
                    texts.append(text)
                if len(texts) == size:
                    return texts
        if not texts:
            raise PlanError(
                "option.calib_dataset",
                dataset,
                "holds no text samples",
                'Use a .txt file (one sample per line) or .jsonl with a "text" field',
            )
        log.warning("calibration: %s holds %d samples, fewer than option.calib_size=%d", dataset, len(texts), size)
        return texts
    return _hub_texts(dataset, size)


def _hub_texts(name: str, size: int) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise PlanError(
            "option.calib_dataset",
            name,
            "is not a local file and the `datasets` package is not installed",
            "Point option.calib_dataset at a local .txt/.jsonl file",
        ) from None
    try:
        if name == DEFAULT_CALIB_DATASET:
            data = datasets.load_dataset("abisee/cnn_dailymail", "3.0.0", split="train")["article"]
        else:
            split = datasets.load_dataset(name, split="train")
            key = next((k for k in _TEXT_KEYS if k in split.column_names), split.column_names[0])
            data = split[key]
    except Exception as e:  # the hub, offline mode and dataset scripts fail in many ways
        raise PlanError(
            "option.calib_dataset",
            name,
            f"could not load the hub dataset ({e})",
            "Point option.calib_dataset at a local .txt/.jsonl file",
        ) from None
    return [t for t in data[:size] if t]


# ---------------------------------------------------------------------------------------------
# modelopt calibration + export
# ---------------------------------------------------------------------------------------------


def _kv_entry(cfg_list_format: bool, kv: str) -> Any:
    bits: Any = 8 if kv == "int8" else (4, 3)
    return (
        {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": bits, "axis": None}}
        if cfg_list_format
        else ("*[kv]_bmm_quantizer", {"num_bits": bits, "axis": None, "enable": True})
    )


def _set_block_size(quant_cfg: Any, block: int) -> None:
    """Set the weight quantizer's last-axis block size in either modelopt config format."""

    def patch(cfg: Any) -> None:
        for one in cfg if isinstance(cfg, list) else [cfg]:
            if isinstance(one, dict) and isinstance(one.get("block_sizes"), dict):
                one["block_sizes"][-1] = block

    if isinstance(quant_cfg, list):
        for entry in quant_cfg:
            if entry.get("quantizer_name") == "*weight_quantizer":
                patch(entry.get("cfg"))
    else:
        patch(quant_cfg.get("*weight_quantizer"))


def modelopt_config(quant: QuantPlan) -> dict[str, Any]:
    """The ``mtq.quantize`` config for a plan (TensorRT-LLM's quantize.py choices)."""
    import modelopt.torch.quantization as mtq

    base = {
        "fp8": mtq.FP8_DEFAULT_CFG,
        "int8_sq": mtq.INT8_SMOOTHQUANT_CFG,
        "int4_awq": mtq.INT4_AWQ_CFG,
        "w4a8_awq": mtq.W4A8_AWQ_BETA_CFG,
    }.get(quant.modelopt_qformat or "")
    if base is None:  # int8_wo / int4_wo: weights are quantized by TensorRT-LLM when it loads the checkpoint
        cfg: dict[str, Any] = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
        if isinstance(mtq.FP8_DEFAULT_CFG["quant_cfg"], dict):
            cfg["quant_cfg"] = {"*": {"enable": False}}
    else:
        cfg = copy.deepcopy(base)
    list_format = isinstance(cfg["quant_cfg"], list)
    calib = quant.calibration
    if quant.modelopt_qformat in ("int4_awq", "w4a8_awq") and calib and calib.awq_block_size:
        _set_block_size(cfg["quant_cfg"], calib.awq_block_size)
    if quant.modelopt_qformat == "int8_sq" and calib and calib.smoothquant_alpha is not None:
        cfg["algorithm"] = {"method": "smoothquant", "alpha": calib.smoothquant_alpha}
    if quant.modelopt_kv_cache_dtype:
        entry = _kv_entry(list_format, quant.modelopt_kv_cache_dtype)
        if list_format:
            cfg["quant_cfg"].append(entry)
        else:
            cfg["quant_cfg"][entry[0]] = entry[1]
    return cfg


def _norm_epsilon(hf: dict[str, Any]) -> float | None:
    for key in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "layernorm_epsilon", "norm_epsilon"):
        if hf.get(key) is not None:
            return float(hf[key])
    return None


def fix_exported_config(ckpt_dir: Path, hf: dict[str, Any], quant: QuantPlan) -> dict[str, Any]:
    """Correct what modelopt's exporter gets wrong with transformers 5.

    It writes ``norm_epsilon`` 1e-6 whatever the model uses and no ``rotary_base``/``rotary_scaling``
    (transformers 5 moved them into ``rope_parameters``); weight-only formats come out with
    ``quant_algo: null`` because TensorRT-LLM quantizes those weights itself when loading.
    """
    path = ckpt_dir / "config.json"
    config = json.loads(path.read_text())
    eps = _norm_epsilon(hf)
    if eps is not None:
        config["norm_epsilon"] = eps
    if str(config.get("position_embedding_type", "")).startswith("rope"):
        theta = rope_theta(hf)
        if theta is not None:
            config["rotary_base"] = theta
        scaling = rope_scaling(hf)
        if scaling is not None:
            config["rotary_scaling"] = {**scaling, "type": scaling["rope_type"]}
    if hf.get("model_type", "").startswith("qwen") and "qwen_type" not in config:
        config["qwen_type"] = hf["model_type"]
    quantization = config.setdefault("quantization", {})
    if quant.modelopt_qformat in ("int8_wo", "int4_wo"):
        quantization["quant_algo"] = quant.quant_algo
        (ckpt_dir / "quant_cfg.json").unlink(missing_ok=True)  # only read for MIXED_PRECISION
    got = (quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo"))
    if got != (quant.quant_algo, quant.kv_cache_quant_algo):
        raise BuildError(
            "quantize",
            f"modelopt exported quant_algo={got[0]}, kv_cache_quant_algo={got[1]}; the plan "
            f"wants {quant.quant_algo}, {quant.kv_cache_quant_algo}",
        )
    path.write_text(json.dumps(config, indent=2))
    return config


def _batches(texts: list[str], batch_size: int) -> Iterator[list[str]]:
    for i in range(0, len(texts), batch_size):
        yield texts[i : i + batch_size]


def calibrated_model(
    hf_dir: Path, quant: QuantPlan, *, dtype: str, trust_remote_code: bool, say: Callable[[str], None]
) -> Any:
    """The HF model, calibrated and quantized in place by modelopt for a modelopt ``quant`` plan.
    Runs on CUDA when available, else on CPU (slow for real models; fine for tests)."""
    if quant.method != "modelopt" or quant.calibration is None:
        raise ValueError(f"calibration needs a modelopt plan, got method={quant.method}")
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..compat import dtype_kwargs

    calib = quant.calibration
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype)
    say(f"quantize: loading {hf_dir} on {device} for {quant.quant_algo} calibration")
    # On GPUs, accelerate spreads a model too big for one of them over all visible ones.
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir,
        **dtype_kwargs(torch_dtype if device == "cuda" else torch.float32),
        trust_remote_code=trust_remote_code,
        device_map="auto" if device == "cuda" else None,
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = load_calibration_texts(calib.dataset, calib.size)
    total = math.ceil(len(texts) / calib.batch_size)

    def forward_loop(m: Any) -> None:
        for n, batch in enumerate(_batches(texts, calib.batch_size), 1):
            enc = tokenizer(
                batch, return_tensors="pt", padding=True, truncation=True, max_length=calib.max_seq_length
            ).to(m.device)
            with torch.no_grad():
                m(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            say(f"quantize: calibration batch {n}/{total}")

    torch.manual_seed(calib.seed)
    mtq.quantize(model, modelopt_config(quant), forward_loop=forward_loop)
    return model


def calibrate_and_export(
    hf_dir: Path,
    out_dir: Path,
    quant: QuantPlan,
    hf: dict[str, Any],
    *,
    dtype: str,
    tp: int,
    pp: int,
    trust_remote_code: bool,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Calibrate the HF model with modelopt and write a TensorRT-LLM checkpoint for ``tp``×``pp`` ranks.

    ``hf`` is the config the build converts with (overrides applied), used to fix the export.
    """
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    say = progress or (lambda msg: log.info("%s", msg))
    model = calibrated_model(hf_dir, quant, dtype=dtype, trust_remote_code=trust_remote_code, say=say)
    torch_dtype = getattr(torch, dtype)
    say(f"quantize: exporting TensorRT-LLM checkpoint (tp={tp}, pp={pp}) to {out_dir}")
    export_tensorrt_llm_checkpoint(
        model,
        decoder_type=quant.modelopt_decoder,
        dtype=torch_dtype,
        export_dir=out_dir,
        inference_tensor_parallel=tp,
        inference_pipeline_parallel=pp,
    )
    fix_exported_config(out_dir, hf, quant)
    return out_dir
