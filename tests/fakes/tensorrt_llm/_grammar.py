"""The fake's guided decoding (private): xgrammar matchers built as TensorRT-LLM builds them.

* The tokenizer's side, as ``_xgrammar_tokenizer_info`` (tensorrt_llm/llmapi/tokenizer.py) gives it:
  the vocabulary sorted by id, the fast tokenizer's ``backend_tokenizer.to_str()``, and
  ``stop_token_ids=[eos_token_id]``.
* The compiler and one matcher per request, as ``XGrammarMatcherFactory`` (tensorrt_llm/_torch/pyexecutor/
  grammar_matcher.py): vocabulary type and prefix space detected from the tokenizer string, the model's
  vocabulary size, and per guide type: JSON → ``compile_builtin_json_grammar()``, JSON_SCHEMA →
  ``compile_json_schema(guide)`` (xgrammar's defaults: any whitespace), REGEX → ``compile_regex``,
  EBNF_GRAMMAR → ``compile_grammar``, STRUCTURAL_TAG → ``compile_structural_tag``.
* The LLM API's ``GuidedDecodingParams`` become those guide types as ``SamplingParams._get_guided_decoding_params``
  (tensorrt_llm/sampling_params.py) maps them: ``json_object`` → JSON, ``json`` (text or dict, dumped) →
  JSON_SCHEMA, ``regex`` → REGEX, ``grammar`` → EBNF_GRAMMAR, ``structural_tag`` → STRUCTURAL_TAG.
"""

from __future__ import annotations

import json
import threading


def tokenizer_info(tokenizer) -> dict:
    vocab = tokenizer.get_vocab()
    return {
        "encoded_vocab": [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": [tokenizer.eos_token_id],
    }


def guide_of(params) -> tuple[str, str | None]:
    """An LLM API ``GuidedDecodingParams`` as (guide type, guide)."""
    if params.json_object:
        return "JSON", None
    if params.json is not None:
        return "JSON_SCHEMA", params.json if isinstance(params.json, str) else json.dumps(params.json)
    if params.regex is not None:
        return "REGEX", params.regex
    if params.grammar is not None:
        return "EBNF_GRAMMAR", params.grammar
    return "STRUCTURAL_TAG", params.structural_tag


class MatcherFactory:
    def __init__(self, info: dict, vocab_size: int) -> None:
        import xgrammar

        metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
        tokenizer = xgrammar.TokenizerInfo(
            info["encoded_vocab"],
            vocab_type=metadata["vocab_type"],
            vocab_size=vocab_size,
            stop_token_ids=info["stop_token_ids"],
            add_prefix_space=metadata["add_prefix_space"],
        )
        self._compiler = xgrammar.GrammarCompiler(tokenizer, cache_enabled=True)
        self._lock = threading.Lock()

    def create(self, guide_type: str, guide: str | None):
        import xgrammar

        compile_ = {
            "JSON": lambda: self._compiler.compile_builtin_json_grammar(),
            "JSON_SCHEMA": lambda: self._compiler.compile_json_schema(guide),
            "REGEX": lambda: self._compiler.compile_regex(guide),
            "EBNF_GRAMMAR": lambda: self._compiler.compile_grammar(guide),
            "STRUCTURAL_TAG": lambda: self._compiler.compile_structural_tag(guide),
        }.get(guide_type)
        if compile_ is None:
            raise ValueError(f"Unsupported guide type: {guide_type}.")
        with self._lock:
            return xgrammar.GrammarMatcher(compile_())
