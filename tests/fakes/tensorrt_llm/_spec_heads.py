"""The fake LLM API's draft heads (private): EAGLE-3 draft heads and DeepSeek-style MTP layers, run on the target's
hidden states as TensorRT-LLM's PyTorch backend runs them. What was read (NVIDIA/TensorRT-LLM; the index keeps crawl
copies, dated by content; read_file ids given so an auditor can open the same text):

EAGLE-3 (tensorrt_llm/_torch/models/modeling_speculative.py, id 2891600299: ``fc`` fixed at 3 × the target's hidden
size, ``load_weights(weights, weight_mapper)``, before ``num_capture_layers``: the 1.0 line):
* the draft checkpoint is ``speculative_model_dir``: its config.json is read with ``ModelConfig.from_pretrained`` (a
  Llama-style config: ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
  ``rms_norm_eps``, ``rope_theta``, ``attention_bias``, ``draft_vocab_size``, optional ``target_hidden_size``); its
  weights are ``fc``, ``midlayer.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, hidden_norm,
  post_attention_layernorm}``, ``norm``, ``d2t`` (when ``draft_vocab_size != vocab_size``), and optionally
  ``lm_head`` (``load_lm_head_from_target`` unless the checkpoint has one) and ``embed_tokens`` (shared with the
  target unless ``target_hidden_size`` differs);
* ``Eagle3DecoderLayer.forward``: residual = the hidden input; q/k/v read ``cat([input_layernorm(embeds),
  hidden_norm(hidden)])`` (2 × hidden in: "The number of input features is twice as big for EAGLE3 draft models");
  ``post_attention_layernorm(attn, residual)`` adds the residual then normalises; the MLP; ``norm(hidden,
  residual)`` gives the normalised state (to ``lm_head``) and the sum (``hidden_states_to_save``, the next draft
  step's hidden input);
* the target's hidden states: _torch/speculative/eagle3.py (id 52274957693, NVIDIA/TensorRT-LLM, the 1.1 line:
  ``CapturableGuidedDecoder``) captures the output (``hidden_states + residual``) of layers ``(1, num_layers // 2 -
  1, num_layers - 4)`` ("Not enough hidden layers for default EAGLE3 capture" for 2 to 5 layers), concatenated,
  through ``fc`` (``apply_eagle3_fc``) on the first draft forward;
* the draft's input ids are the target's shifted by one ("Eagle3 always throws away the first token"; one-model
  ``prepare_1st_drafter_inputs``: ``input_ids_ctx[:-1] = input_ids[1:]``, the last the accepted token); each of the
  ``max_draft_len`` draft steps takes the argmax of the draft logits (``draft_decoder``; ``d2t[token] + token`` maps
  a draft-vocabulary id to the target's), the next step reading that token and the saved hidden state at the next
  position; every step drafts ``max_draft_len`` tokens.
* one-model verification (``Eagle3OneModelWorker.sample_and_accept_draft_tokens``): ``torch.argmax`` of the target
  logits at every position, drafts accepted while equal (``cumprod``), plus one: greedy whatever the request asks,
  until ``allow_advanced_sampling`` (llm_args.py) or PR 14745 (``_llm_runtime``).

MTP (tensorrt_llm/_torch/models/modeling_deepseekv3.py, same copy id 2891600299; _torch/speculative/mtp.py id
9034879030; _torch/speculative/utils.py id 13542650405):
* the MTP layers are the target checkpoint's ``model.layers.{num_hidden_layers + i}`` (``MTPForCausalLM``: start
  layer ``num_hidden_layers``), each a DeepSeek-V3 decoder layer plus ``enorm``, ``hnorm``, ``eh_proj`` (2 × hidden →
  hidden) and ``shared_head.norm``; the embedding and ``lm_head`` are the target's (``MTPForCausalLM.embed_tokens =
  model.embed_tokens``; ``mtp_layer.shared_head(hidden_states, lm_head, ...)``);
* ``DeepseekV3MTP.forward``: ``eh_proj(cat([enorm(embed(ids)), hnorm(hidden)]))``, the decoder layer, then
  ``shared_head.norm(hidden, residual)``: that normalised state gives the logits and is the next depth's hidden;
* the target's hidden states are its model output, after the final norm (``post_load_weights``: the last layer's
  ``next_layer_layernorm`` is ``model.norm``);
* the mode (llm_args.py ``MTPDecodingConfig.spec_dec_mode``, 1.0 id 1520735490, 1.1 id 1090804222): a checkpoint
  with one MTP layer and ``use_mtp_vanilla`` false is MTP-Eagle (``mtp_num_layers = 1 if is_mtp_eagle()``; that one
  layer run ``num_nextn_predict_layers`` times, each step on the previous step's token and hidden state, as EAGLE-3:
  ``MTPEagleWorker.update_draft_tokens``, mtp.py id 1114563172: the hidden state at the gathered row, position + 1);
  otherwise vanilla MTP, ``num_nextn_predict_layers`` layers in turn, each on the input ids and hidden states
  shifted by one more (``MTPWorker.forward``: ``input_ids[:-1] = input_ids[1:]``, the last the new draft token;
  the hidden states likewise, the last the layer's own);
* ``sample_and_accept_draft_tokens``: "Currently only support greedy sampling. All decoding is done using Top1 and
  token equality is used for acceptance."

Simplification: the heads keep no KV cache; each draft step runs the head over the whole sequence. For EAGLE-3 and
MTP-Eagle every position's input is then the one the real cache holds (a committed position reads the target's
captured state; the rows of rejected drafts are rewound there and never read here). For vanilla MTP the real cache
keeps some depth-2+ rows computed beside drafts that were later rejected (mtp.py's worked example), which can change
which drafts are proposed, never which tokens verification keeps.
"""

from __future__ import annotations

import json
from pathlib import Path


def _weights(folder: str | Path) -> dict:
    from safetensors.torch import load_file

    state: dict = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(shard)))
    return {name: tensor.float() for name, tensor in state.items()}


def _rms(weight, x, eps: float):
    import torch

    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _causal(n: int):
    import torch

    return torch.full((n, n), float("-inf")).triu(1)


def eagle3_capture_layers(num_layers: int) -> tuple[int, ...]:
    """eagle3.py ``__post_init__``: the default layers whose output the target saves for the draft head."""
    if num_layers == 1:
        return (0,)
    if num_layers <= 5:
        raise ValueError("Not enough hidden layers for default EAGLE3 capture")
    return (1, num_layers // 2 - 1, num_layers - 4)


def _feature(hidden_states, layers: tuple[int, ...]):
    """The saved feature per position: with transformers' ``output_hidden_states`` entry ``i + 1`` is layer ``i``'s
    output (``hidden_states + residual``). maybe_capture_hidden_states ``break``s at the first match, so a layer listed
    twice fills its first slot only; the fake refuses that shape rather than model an uninitialised buffer."""
    import torch

    if len(set(layers)) != len(layers):
        raise NotImplementedError(f"fake tensorrt_llm: EAGLE-3 capture of layers {layers} (a layer twice)")
    return torch.cat([hidden_states[i + 1][0] for i in layers], dim=-1)


class Eagle3Head:
    """An EAGLE-3 draft checkpoint (module docstring), run on the target's embedding and lm_head where it has none."""

    def __init__(self, folder: str, target, series: tuple[int, int]) -> None:
        import torch
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        raw = json.loads((Path(folder) / "config.json").read_text())
        if "draft_vocab_size" not in raw and series < (1, 3):
            # the 1.0 copy reads config.draft_vocab_size; main defaults it to vocab_size with a warning
            raise AttributeError("'LlamaConfig' object has no attribute 'draft_vocab_size'")
        self.config = LlamaConfig.from_dict(raw)
        c = self.config
        self.w = _weights(folder)
        self.eps = c.rms_norm_eps
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.layers = eagle3_capture_layers(target.config.num_hidden_layers)
        target_hidden = raw.get("target_hidden_size", c.hidden_size)
        if self.w["fc.weight"].shape[1] != 3 * target_hidden:
            raise ValueError(f"fc.weight: expected [{c.hidden_size}, {3 * target_hidden}]")
        self.embed = (
            self.w["embed_tokens.weight"] if target_hidden != c.hidden_size else target.get_input_embeddings().weight
        )
        self.lm_head = self.w.get("lm_head.weight", target.get_output_embeddings().weight)
        self.d2t = self.w.get("d2t")
        self.rotary = LlamaRotaryEmbedding(c)
        self._torch = torch

    def feature(self, hidden_states):
        return _feature(hidden_states, self.layers)

    def _layer(self, embeds, hidden, positions):
        """Eagle3DecoderLayer + the draft model's final norm: (normalised output, hidden_states_to_save)."""
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        w, p = self.w, "midlayer."
        x = torch.cat(
            [
                _rms(w[p + "input_layernorm.weight"], embeds, self.eps),
                _rms(w[p + "hidden_norm.weight"], hidden, self.eps),
            ],
            dim=-1,
        )
        n = x.shape[0]
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(n, self.heads, self.head_dim).transpose(0, 1)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        cos, sin = self.rotary(v, positions[None])
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
        group = self.heads // self.kv_heads
        k, v = k[0].repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = q[0] @ k.transpose(-1, -2) / self.head_dim**0.5 + _causal(n)
        attn = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        residual = attn + hidden
        h = _rms(w[p + "post_attention_layernorm.weight"], residual, self.eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        h = (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        saved = h + residual
        return _rms(w["norm.weight"], saved, self.eps), saved

    def draft(self, tokens: list[int], features, k: int) -> list[int]:
        """``k`` draft tokens after ``tokens``; ``features[j]`` the target's saved state at position j (j < len - 1)."""
        torch = self._torch
        ids = list(tokens[1:])  # the input ids shifted by one: row j reads token j + 1 beside the state at j
        hidden = features @ self.w["fc.weight"].T  # apply_eagle3_fc
        out: list[int] = []
        for _ in range(k):
            positions = torch.arange(len(ids))
            normed, saved = self._layer(self.embed[torch.tensor(ids)], hidden, positions)
            token = int(torch.argmax(normed[-1] @ self.lm_head.T))
            if self.d2t is not None:
                token += int(self.d2t[token])
            out.append(token)
            ids.append(token)
            hidden = torch.cat([hidden, saved[-1:]])
        return out


class MtpHead:
    """The target checkpoint's MTP layers (module docstring), run with transformers' DeepSeek-V3 decoder layer."""

    def __init__(self, folder: str, target, config) -> None:
        import torch
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

        tc = target.config
        self.available = int(getattr(tc, "num_nextn_predict_layers", 0) or 0)
        if self.available <= 0:
            raise ValueError("the checkpoint has no MTP layers (config.json num_nextn_predict_layers)")
        self.vanilla = self.available > 1 or config.use_mtp_vanilla  # spec_dec_mode: MTP, else MTP_EAGLE
        count = config.num_nextn_predict_layers if self.vanilla else 1
        if count > self.available:
            raise ValueError(f"MTP: {count} layers asked for, the checkpoint has {self.available}")
        state, first = _weights(folder), tc.num_hidden_layers
        self.layers = []
        for i in range(count):
            prefix = f"model.layers.{first + i}."
            mine = {n[len(prefix) :]: t for n, t in state.items() if n.startswith(prefix)}
            block = DeepseekV3DecoderLayer(tc, first + i).float().eval()
            kept = {n: t for n, t in mine.items() if not n.startswith(("enorm", "hnorm", "eh_proj", "shared_head"))}
            kept.pop("embed_tokens.weight", None)
            missing, unexpected = block.load_state_dict(kept, strict=False)
            if missing or unexpected:
                raise ValueError(f"MTP layer {first + i}: weights missing {missing[:3]}, unexpected {unexpected[:3]}")
            self.layers.append((block, mine))
        self.eps = tc.rms_norm_eps
        self.embed = target.get_input_embeddings().weight
        self.lm_head = target.get_output_embeddings().weight
        self.rotary = target.model.rotary_emb
        self._torch = torch

    def feature(self, hidden_states):
        return hidden_states[-1][0]  # the model's output, after its final norm (transformers' last entry)

    def _layer(self, index: int, ids: list[int], hidden):
        """One MTP layer over the rows: its normalised output (logits and the next depth's hidden)."""
        torch = self._torch
        block, w = self.layers[index]
        embeds = _rms(w["enorm.weight"], self.embed[torch.tensor(ids)], self.eps)
        x = torch.cat([embeds, _rms(w["hnorm.weight"], hidden, self.eps)], dim=-1) @ w["eh_proj.weight"].T
        positions = torch.arange(len(ids))[None]
        out = block(
            x[None],
            attention_mask=_causal(len(ids))[None, None],
            position_ids=positions,
            position_embeddings=self.rotary(x[None], positions),
        )
        out = out[0] if isinstance(out, tuple) else out
        return _rms(w["shared_head.norm.weight"], out[0], self.eps)

    def draft(self, tokens: list[int], features, k: int) -> list[int]:
        torch = self._torch
        ids, hidden, out = list(tokens[1:]), features, []
        for step in range(k):
            h = self._layer(step if self.vanilla else 0, ids, hidden)
            token = int(torch.argmax(h[-1] @ self.lm_head.T))
            out.append(token)
            if self.vanilla:  # MTPWorker: ids and hidden states shift by one, the last the new token and state
                ids, hidden = ids[1:] + [token], torch.cat([hidden[1:], h[-1:]])
            else:  # MTPEagleWorker: the next step reads the new token at the next position
                ids, hidden = ids + [token], torch.cat([hidden, h[-1:]])
        return out
