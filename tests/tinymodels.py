"""Tiny random-weight models and a tokenizer trained on the spot (no hub, no network).

Every model shares one byte-level BPE tokenizer (vocab 512, <pad>=0 <s>=1 </s>=2) so greedy
outputs can be compared across engines. Built once per session into a cache dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 512
SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
# ChatML turns; with tools, a Hermes-style tool-use template (the format Hermes 2 Pro and Qwen 2.5 document: tools
# listed in a system turn, calls as <tool_call>{"name", "arguments"}</tool_call>, results in <tool_response>), so
# OpenAI tool calls can be tried on the tiny model. Without tools it renders exactly the plain ChatML turns.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t.function.name }}{{ (t.function.parameters or {}).properties | default({}) | tojson }}
{%- endfor %}</tools>
<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "assistant" and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == "tool" %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Multi-byte text on purpose: the detokenizer must never split a character.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Large language models generate text one token at a time.",
    "Serving engines batch requests to keep the GPU busy.",
    "Grüße aus München! Ça va? Überall schöne Straßen.",
    "日本語のテキストもトークン化できます。東京は大きい都市です。",
    "Emoji test: 🚀🔥✨ and math: ∑ ∫ √ π ≈ 3.14159",
    "def hello(name):\n    return f'Hello, {name}!'\n",
    "Once upon a time there was a small model that learned to talk.",
]


def _texts() -> list[str]:
    out = []
    for i in range(300):
        for line in CORPUS:
            out.append(f"{line} {i}")
    return out


def build_tokenizer(out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def _config(arch: str):
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch in ("llama", "llama8"):  # llama8: deep enough for EAGLE-3's default capture (layers 1, 3 and 4 of 8)
        return tf.LlamaConfig(
            hidden_size=64,
            num_hidden_layers=8 if arch == "llama8" else 2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=512,
            **common,
        )
    if arch == "deepseek_v3":  # MTP heads are added by speculative_heads.mtp_model
        return tf.DeepseekV3Config(
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            max_position_embeddings=512,
            **common,
        )
    if arch == "qwen2":
        return tf.Qwen2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=512,
            **common,
        )
    if arch == "mistral":
        return tf.MistralConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=512,
            sliding_window=None,
            **common,
        )
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **common)
    if arch == "falcon":
        return tf.FalconConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            max_position_embeddings=512,
            **common,
        )
    if arch == "gptj":
        return tf.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=512, **common)
    raise ValueError(f"unknown tiny arch {arch!r}")


ARCHS = ("llama", "qwen2", "mistral", "gpt2", "falcon", "gptj")


def build_model(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny ``arch`` model plus the shared tokenizer into ``out_dir``; return it."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "tokenizer.json").exists():
        if _saved_template(out_dir) != CHAT_TEMPLATE:  # a folder made before the template changed
            build_tokenizer(out_dir)
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch))
    # Random weights produce near-uniform logits; scale them up so greedy choices are
    # well separated and identical across batching strategies and numeric paths.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(out_dir))
    build_tokenizer(out_dir)
    return out_dir


def _saved_template(model_dir: Path) -> str | None:
    """The chat template saved beside a tokenizer (its own file in newer transformers, else tokenizer_config)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    return json.loads(config.read_text()).get("chat_template") if config.exists() else None


def cache_root() -> Path:
    root = Path(os.environ.get("LMI_TEST_MODEL_CACHE", Path(__file__).parent / ".models"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def tiny_model(arch: str = "llama") -> Path:
    """A cached tiny model folder (built on first use)."""
    return build_model(arch, cache_root() / arch)


def make_hub_cache(
    model_dir: Path,
    hf_home: Path,
    repo_id: str = "acme/tiny-llama",
    commit: str = "0123456789abcdef0123456789abcdef01234567",
) -> Path:
    """Lay ``model_dir`` out as a huggingface_hub cache entry so ``repo_id`` resolves offline."""
    import shutil

    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    if not snap.exists():
        shutil.copytree(model_dir, snap)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snap


def with_eos(model_dir: Path, eos_token_id: int, out_dir: Path) -> Path:
    """A copy of ``model_dir`` whose one EOS token (tokenizer, config.json, generation_config.json) is
    ``eos_token_id``: a token the tiny model really produces, so tests can watch a sequence end on it."""
    import shutil

    from transformers import AutoTokenizer

    if not out_dir.exists():
        shutil.copytree(model_dir, out_dir)
        tokenizer = AutoTokenizer.from_pretrained(out_dir)
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_token_id)
        tokenizer.save_pretrained(out_dir)
        for name in ("config.json", "generation_config.json"):
            config = json.loads((out_dir / name).read_text())
            (out_dir / name).write_text(json.dumps({**config, "eos_token_id": eos_token_id}, indent=2))
    return out_dir


# A checkpoint as transformers 5 writes it (tests/fixtures/transformers5-llama, made by
# `python tests/tinymodels.py --transformers5 tests/fixtures/transformers5-llama` under transformers 5): the shared
# tokenizer and a tiny Llama config whose RoPE is not the default one, so a transformers 4 that misreads the v5
# config.json (rope_parameters) would generate different tokens. Committed as transformers 5 wrote it: the release
# legs run transformers 4.42-4.57, which cannot write it.
TRANSFORMERS5_FIXTURE = Path(__file__).parent / "fixtures" / "transformers5-llama"
TRANSFORMERS5_ROPE = {"rope_theta": 100.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}


def write_transformers5_fixture(out_dir: Path) -> Path:
    """The committed fixture's files (no weights), written by the installed transformers, which must be 5.x."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise RuntimeError(f"transformers {transformers.__version__} installed: the fixture is transformers 5's")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _config("llama")
    # transformers 5 takes the 4.x spellings as keywords and writes them as rope_parameters.
    config = type(config)(**{**config.to_dict(), **TRANSFORMERS5_ROPE, "dtype": "float32"})
    config.save_pretrained(str(out_dir))
    build_tokenizer(out_dir)
    return out_dir


def transformers5_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """The committed transformers-5 fixture, as it is, plus random weights made here by the installed transformers
    (their names and shapes do not depend on how RoPE is spelled; the weights file is all this adds)."""
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    out_dir = Path(out_dir)
    shutil.copytree(TRANSFORMERS5_FIXTURE, out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out_dir)))
    state = {name: (t * 4.0 if t.dim() > 1 else t).contiguous() for name, t in model.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def model_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        description="Write a tiny random-weight model + tokenizer (for trying lmi-trt offline)."
    )
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--arch", default="llama", choices=ARCHS)
    ap.add_argument("--transformers5", action="store_true", help="write the transformers-5 fixture's files instead")
    a = ap.parse_args()
    print(write_transformers5_fixture(a.out_dir) if a.transformers5 else build_model(a.arch, a.out_dir))


def beam_reference(
    model, prompt: list[int], *, beams: int, returned: int, max_new: int, eos: int | list[int] | None = None, **kw
) -> tuple[list[list[int]], list[float]]:
    """transformers' own beams: ``model.generate(num_beams=beams, num_return_sequences=returned, do_sample=False,
    **kw)`` (length_penalty, early_stopping), each returned sequence's new tokens up to and with its first EOS
    (generate pads the shorter ones), and their scores."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            num_beams=beams,
            num_return_sequences=returned,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **kw,
        )
    ends = set([eos] if isinstance(eos, int) else eos or [])
    rows = []
    for row in out.sequences.tolist():
        tail = row[len(prompt) :]
        cut = next((i for i, t in enumerate(tail) if t in ends), None)
        rows.append(tail if cut is None else tail[: cut + 1])
    return rows, out.sequences_scores.tolist()
