"""The torch engine's beam search rules (lmi_trt/engines/torch/beams.py) against transformers' own
``generate(num_beams=..., do_sample=False)``: driven here by the model's full forward pass (no cache), so that
only the scoring is compared; tests/integration/test_beams_torch.py runs it in the decode loop."""

from __future__ import annotations

import pytest
import torch
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM

from lmi_trt.engines.torch.beams import BeamSearch


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(tiny_model("llama")), dtype=torch.float32).eval()


def search(model, prompt, width, max_new, eos, length_penalty, early_stopping):
    beams = BeamSearch(
        width, eos_ids=eos, max_new_tokens=max_new, length_penalty=length_penalty, early_stopping=early_stopping
    )
    running = [list(prompt)]
    with torch.no_grad():
        while True:
            logits = model(torch.tensor(running)).logits[:, -1, :].float()
            log_probs = torch.log_softmax(logits, dim=-1)
            if len(running) == 1:
                log_probs = log_probs.expand(width, -1)
            parents, tokens = beams.step(log_probs)
            if beams.done:
                return beams
            running = [running[p] + [t] for p, t in zip(parents, tokens, strict=True)]


def generated(model, prompt, **kw):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, output_scores=True, return_dict_in_generate=True, **kw
        )
    return out


@pytest.mark.parametrize(
    "width, returned, length_penalty, early_stopping, eos",
    [
        (3, 3, 1.0, False, ()),
        (4, 2, 0.5, True, ()),
        (2, 2, -1.0, "never", ()),
        # EOS ids the tiny model produces after this prompt: beams end early
        (3, 2, 2.0, "never", (452,)),
        (4, 4, 1.0, True, (341, 163)),
        (3, 3, 0.0, False, (357, 150, 79)),
    ],
)
def test_the_same_beams_and_scores_as_generate(model, width, returned, length_penalty, early_stopping, eos):
    prompt, max_new = [1, 5, 6, 7, 8], 9
    beams = search(model, prompt, width, max_new, eos, length_penalty, early_stopping)
    ref = generated(
        model,
        prompt,
        num_beams=width,
        num_return_sequences=returned,
        max_new_tokens=max_new,
        min_new_tokens=0,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        eos_token_id=list(eos) or None,
        pad_token_id=0,
    )
    best = beams.best(returned)
    if length_penalty <= 1.0:  # (a penalty of 2 favours the longest beams: those that ran to the end)
        assert bool(eos) is any(h.ended_by_eos for h in beams.best(width))  # the EOS cases do end some beams
    for hyp, row, score in zip(best, ref.sequences.tolist(), ref.sequences_scores.tolist(), strict=True):
        tail = row[len(prompt) :]
        if hyp.ended_by_eos:
            tail = tail[: len(hyp.tokens)]  # generate pads the shorter ones
        assert hyp.tokens == tail
        assert hyp.score == pytest.approx(score, rel=1e-5)
