"""Tiny speculative-decoding heads for the fake LLM API's EAGLE-3 and MTP paths, laid out as TensorRT-LLM's loaders
read them (tests/fakes/tensorrt_llm/_spec_heads.py cites the layouts): an EAGLE-3 draft checkpoint beside a target,
and a DeepSeek-V3 checkpoint with MTP layers. Random weights: the heads propose tokens the target mostly rejects,
which is what the greedy-equality tests need (verification, not the drafts, decides the output)."""

from __future__ import annotations

import json
from pathlib import Path

from tinymodels import build_model, cache_root


def _save(tensors: dict, out: Path, name: str = "model.safetensors") -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / name))


def eagle3_draft(target_dir: Path, out_dir: Path, seed: int = 1) -> Path:
    """An EAGLE-3 draft checkpoint for ``target_dir`` (a Llama): config.json with the fields TensorRT-LLM's
    Eagle3ForCausalLM reads, and fc / midlayer / norm weights (embedding and lm_head shared with the target)."""
    import torch

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    target = json.loads((Path(target_dir) / "config.json").read_text())
    hidden, heads, kv_heads, inter = (
        target[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    )
    head_dim = hidden // heads
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": target.get("rope_theta", 10000.0),
        "max_position_embeddings": target["max_position_embeddings"],
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": target["vocab_size"],
        "attention_bias": False,
        "torch_dtype": "float32",
    }
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.3

    p = "midlayer."
    tensors = {
        "fc.weight": rand(hidden, 3 * hidden),
        p + "self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": rand(inter, hidden),
        p + "mlp.up_proj.weight": rand(inter, hidden),
        p + "mlp.down_proj.weight": rand(hidden, inter),
        **{
            p + n + ".weight": torch.ones(hidden)
            for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")
        },
        "norm.weight": torch.ones(hidden),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    _save(tensors, out_dir)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def mtp_model(layers: int = 1, seed: int = 2) -> Path:
    """A tiny DeepSeek-V3 checkpoint whose config.json says ``num_nextn_predict_layers: layers`` and whose weights hold
    that many MTP layers after the decoder's (``model.layers.{num_hidden_layers + i}``: a decoder layer plus enorm,
    hnorm, eh_proj and shared_head.norm, as DeepSeek-V3's checkpoints and TensorRT-LLM's loader name them)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    out = cache_root() / f"deepseek_v3_mtp{layers}"
    if (out / "config.json").exists() and json.loads((out / "config.json").read_text()).get(
        "num_nextn_predict_layers"
    ) == layers:
        return out
    build_model("deepseek_v3", out, seed=seed)
    raw = json.loads((out / "config.json").read_text())
    config = DeepseekV3Config.from_dict(raw)
    torch.manual_seed(seed)
    shard = next(out.glob("*.safetensors"))
    tensors = load_file(str(shard))
    hidden, first = config.hidden_size, config.num_hidden_layers
    # the MTP layers' decoder blocks: initialised as transformers initialises a deeper model's layers
    deeper = AutoModelForCausalLM.from_config(DeepseekV3Config.from_dict({**raw, "num_hidden_layers": first + layers}))
    for i in range(layers):
        prefix = f"model.layers.{first + i}."
        block = deeper.model.layers[first + i]
        tensors |= {
            prefix + n: t.detach().clone() * (4.0 if t.dim() > 1 else 1.0) for n, t in block.state_dict().items()
        }
        tensors |= {
            prefix + "enorm.weight": torch.ones(hidden),
            prefix + "hnorm.weight": torch.ones(hidden),
            prefix + "eh_proj.weight": torch.randn(hidden, 2 * hidden) * 0.3,
            prefix + "shared_head.norm.weight": torch.ones(hidden),
        }
    _save(tensors, out, shard.name)
    (out / "config.json").write_text(json.dumps({**raw, "num_nextn_predict_layers": layers}, indent=2))
    return out


def medusa_heads(
    target_dir: Path, out_dir: Path, prompts: list[list[int]], heads: int = 2, new_tokens: int = 24
) -> Path:
    """Medusa heads for ``target_dir`` in FasterDecoding/Medusa's format (config.json ``medusa_num_heads`` /
    ``medusa_num_layers``; ``medusa_lm_head.safetensors`` with ``{h}.0.linear.weight/bias`` and ``{h}.1.weight``, as
    TensorRT-LLM's load_medusa_hf reads them: lmi_trt/compile/medusa.py cites it), fitted to the model's own greedy
    continuations of ``prompts`` (Medusa heads are trained on the base model's outputs): head ``h`` at a token maps
    its final hidden state (after a small random residual layer) to the token ``h + 2`` places on, by least squares,
    so drafts along those continuations get accepted and others mostly do not."""
    import torch
    from transformers import AutoModelForCausalLM

    from lmi_trt.compat import dtype_kwargs

    out_dir = Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), **dtype_kwargs(torch.float32)).eval()
    hidden_size = model.config.hidden_size
    gen = torch.Generator().manual_seed(3)
    states, sequences = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=2, pad_token_id=0
            )
            out = model(ids, output_hidden_states=True)
            states.append(out.hidden_states[-1][0])  # after the final norm, what the heads read
            sequences.append(ids[0].tolist())
    tensors = {}
    for h in range(heads):
        weight = torch.randn(hidden_size, hidden_size, generator=gen) * 0.05
        bias = torch.zeros(hidden_size)
        rows, targets = [], []
        for state, seq in zip(states, sequences, strict=True):
            for t in range(len(seq) - h - 2):
                rows.append(state[t])
                targets.append(seq[t + h + 2])
        x = torch.stack(rows)
        x = x + torch.nn.functional.silu(x @ weight.T + bias)
        onehot = torch.nn.functional.one_hot(torch.tensor(targets), model.config.vocab_size).float() * 10
        lm_head = torch.linalg.lstsq(x, onehot).solution.T  # [vocab, hidden]
        tensors |= {f"{h}.0.linear.weight": weight, f"{h}.0.linear.bias": bias, f"{h}.1.weight": lm_head}
    out_dir.mkdir(parents=True, exist_ok=True)
    _save(tensors, out_dir, "medusa_lm_head.safetensors")
    config = {"medusa_num_heads": heads, "medusa_num_layers": 1, "base_model_name_or_path": str(target_dir)}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
