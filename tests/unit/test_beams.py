"""The torch engine's beam search rules (lmi_trt/engines/torch/beams.py) against transformers' own
``generate(num_beams=..., do_sample=False)``: driven here by the model's full forward pass (no cache), so that
only the scoring is compared; tests/integration/test_beams_torch.py runs it in the decode loop."""

from __future__ import annotations

import pytest
import torch
from tinymodels import beam_reference, tiny_model
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
    rows, scores = beam_reference(
        model,
        prompt,
        beams=width,
        returned=returned,
        max_new=max_new,
        eos=list(eos) or None,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    best = beams.best(returned)
    if length_penalty <= 1.0:  # (a penalty of 2 favours the longest beams: those that ran to the end)
        assert bool(eos) is any(h.ended_by_eos for h in beams.best(width))  # the EOS cases do end some beams
    assert [h.tokens for h in best] == rows
    assert [h.score for h in best] == pytest.approx(scores, rel=1e-5)
