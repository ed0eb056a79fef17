"""Client-chosen names cannot grow server state without bound."""

from __future__ import annotations

from lmi_trt.serving.protocols import lmi, openai


def test_unknown_parameter_names_are_remembered_only_up_to_a_bound(monkeypatch, caplog):
    monkeypatch.setattr(lmi, "_warned_unknown", set())
    monkeypatch.setattr(openai, "_warned", set())
    for i in range(2000):
        lmi.LmiParameters.model_validate({f"unknown_{i}": 1, "max_new_tokens": 3}).to_generate()
        openai.CompletionRequest.model_validate({"prompt": "x", f"unknown_{i}": 1}).generate_params()
    assert len(lmi._warned_unknown) <= lmi._MAX_WARNED and len(openai._warned) <= openai._MAX_WARNED
    assert len([r for r in caplog.records if "unknown" in r.getMessage()]) <= lmi._MAX_WARNED + openai._MAX_WARNED


def test_unknown_parameter_names_are_logged_escaped(monkeypatch, caplog):
    monkeypatch.setattr(lmi, "_warned_unknown", set())
    lmi.LmiParameters.model_validate({"evil\nFAKE LOG LINE": 1}).to_generate()
    assert "\nFAKE LOG LINE" not in caplog.text and "evil\\nFAKE LOG LINE" in caplog.text
