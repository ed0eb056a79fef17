"""The fake LLM API's LoRA (private): what the PyTorch backend does with a request's ``LoRARequest``, applied to the
fake's transformers model by forward hooks on its projections (no peft: the release images do not carry it).

Kept from the real one:
* Start-up (_torch/pyexecutor/_util.py of the 1.1 line, read_file id 843526953; py_executor_creator.py copies ids
  90899134 and 18543847370): with exactly one ``lora_dir`` the target modules come from that adapter
  (lora_manager.py ``load_torch_lora``); otherwise ``assert len(lora_config.lora_target_modules) >= 1, "Expecting at
  least one lora target module"``, and an empty ``trtllm_modules_to_hf_modules`` becomes the default mapping
  (lora_helper.py). Missing q/k/v modules are added beside the others (``missing_qkv_modules``).
* Loading (lora_manager.py ``LoraManager.load_from_hf``, read_file id 1059464385): per adapter id, once (an id seen
  before is skipped, whatever its path now holds); ``scaling = lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with
  ``use_rslora`` (``rs_lora = bool(hf_config.get("use_rslora", False))``); a module outside the target modules is
  skipped with a warning ("LoRA module ... not in target modules ..., skipping.").
* CUDA graphs: PR 5480 (2025-07, before 1.0): "LoRA does not support CUDA graph enable mode, the output is different
  compare with CUDA graph disable"; CUDA graphs run batches of decoding requests only (TorchLlmArgs
  ``cuda_graph_config``: "enabled for batches that consist of decoding requests *only*"). How the output differs was
  not read: the fake's mechanism (the adapter missing from decode steps while CUDA graphs are on) is invented, only
  its effect (output unlike peft's) is the release's. PR 8279 ("Multi-LoRA serving with CUDA Graph", commit
  1dc49b266e) merged on main 2026-01-22 after "Bump version to 1.3.0rc1" (#10923, 0243abee22; main's commit log), so
  the first candidate known to hold it is 1.3.0rc2: from there adapters apply in every step.
Not read, so the fake fails the request instead of guessing: an adapter whose rank exceeds ``max_lora_rank`` (the
C++ PEFT cache checks it), and a ``lora_request`` to an LLM built without ``lora_config``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from contextlib import contextmanager
from pathlib import Path

from tensorrt_llm import _state
from tensorrt_llm.lora_helper import get_default_trtllm_modules_to_hf_modules

_TENSOR = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")
_LINEAR = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)")


class Loras:
    def __init__(self, model, config, cuda_graphs: bool) -> None:
        if len(config.lora_dir) == 1:
            raise NotImplementedError("fake tensorrt_llm: adapters come per request here (lora_dir not modelled)")
        assert len(config.lora_target_modules) >= 1, "Expecting at least one lora target module"
        if not config.trtllm_modules_to_hf_modules:
            config.trtllm_modules_to_hf_modules = get_default_trtllm_modules_to_hf_modules()
        self.targets = [*config.lora_target_modules, *config.missing_qkv_modules]
        self.hf_to_trtllm = {hf: trt for trt, hf in config.trtllm_modules_to_hf_modules.items()}
        self.max_rank = config.max_lora_rank
        # adapters apply in decode steps unless CUDA graphs run them without (the module docstring)
        self.in_decode = not cuda_graphs or _state.at_least("1.3.0rc2")
        self._loaded: dict[int, dict[tuple[int, str], tuple[object, object, float]]] = {}
        self._active: dict | None = None
        for name, module in model.named_modules():
            found = _LINEAR.fullmatch(name)
            if found is not None and found.group(2) in self.hf_to_trtllm:
                module.register_forward_hook(self._hook(int(found.group(1)), found.group(2)))

    def _hook(self, layer: int, hf_module: str):
        def add_delta(module, inputs, output):
            weights = self._active.get((layer, hf_module)) if self._active is not None else None
            if weights is None:
                return output
            a, b, scaling = weights
            return output + scaling * (inputs[0] @ a.t()) @ b.t()

        return add_delta

    def load(self, request) -> None:
        """LoraManager.load_from_hf for one request's adapter (a failure fails that request)."""
        from safetensors.torch import load_file

        uid = request.adapter_id
        if uid in self._loaded:
            return
        folder = Path(request.path)
        config = json.loads((folder / "adapter_config.json").read_text())
        rank = int(config["r"])
        if rank > self.max_rank:
            raise ValueError(f"fake tensorrt_llm: LoRA rank {rank} exceeds max_lora_rank {self.max_rank}")
        alpha = config["lora_alpha"]
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora", False) else alpha / rank
        pairs: dict[tuple[int, str], dict[str, object]] = {}
        for name, tensor in load_file(str(folder / "adapter_model.safetensors")).items():
            found = _TENSOR.fullmatch(name)
            if found is None:
                raise KeyError(f"unsupported key {name} from HF LoRA weights")
            module = self.hf_to_trtllm.get(found.group(2))
            if module not in self.targets:
                warnings.warn(f"LoRA module '{module}' not in target modules {self.targets}, skipping.", stacklevel=2)
                continue
            pairs.setdefault((int(found.group(1)), found.group(2)), {})[found.group(3)] = tensor.float()
        self._loaded[uid] = {key: (pair["A"], pair["B"], scaling) for key, pair in pairs.items()}

    @contextmanager
    def applying(self, request, prefill: bool):
        """The request's adapter on the model's projections for one forward (None: the base model)."""
        use = request is not None and (prefill or self.in_decode)
        self._active = self._loaded[request.adapter_id] if use else None
        try:
            yield
        finally:
            self._active = None
