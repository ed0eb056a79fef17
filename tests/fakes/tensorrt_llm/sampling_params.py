"""Fake ``tensorrt_llm.sampling_params`` (real file: tensorrt_llm/sampling_params.py, read @a98a9061, ~1.1–1.2,
and @000a01de, whose version.py says 1.0.0rc4).

Fields, order, defaults and ``_validate`` as the real slot dataclass; ``_setup`` tokenizes ``stop``/``bad``
strings without special tokens and fills ``end_id``/``pad_id`` from the tokenizer, as the real one does; the LLM
calls it only for a request without ``end_id`` (``llm.py``). ``_get_bad_words``/``_get_stop_words`` raise for
strings ``_setup`` did not tokenize, as the real ones do. Per release:
* 1.0 (@000a01de): ``_greedy_decoding`` looks at ``top_k``/``top_p`` only (temperature is not consulted) and
  ``_validate`` has no range checks; ``_setup(tokenizer, add_special_tokens=False)``;
* later (@a98a9061): ``params_imply_greedy_decoding`` (temperature 0 is greedy too), range checks on
  ``top_p``/``top_k``/``temperature``; ``_setup(tokenizer, hf_model_config, generation_config, ...)``, whose end
  id for a ``kimi_k2`` model is generation_config.json's ``eos_token_id`` when that is one id (PR 7120, merged
  2025-09-23, before the 1.1 branch cut; the 1.1–1.2 copy @a98a9061).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from tensorrt_llm import _state


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        guides = [
            self.json is not None,
            self.regex is not None,
            self.grammar is not None,
            self.json_object,
            self.structural_tag is not None,
        ]
        if sum(guides) > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {sum(guides)}.")


# SamplingParams fields _get_sampling_config maps itself rather than by name.
_UNMATCHED = ("num_return_sequences", "beam_width", "n", "best_of", "use_beam_search")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    _bad_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    _stop_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list[str] | None = None
    lookahead_config: Any = None
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self) -> None:
        if _state.series() >= (1, 1):  # the range checks are not in the 1.0.0rc4 copy
            if self.top_p is not None and (self.top_p < 0 or self.top_p > 1):
                raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
            if self.top_k is not None and self.top_k < 0:
                raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
            if self.temperature is not None and self.temperature < 0:
                raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.best_of is not None and self.best_of > 1 and self._greedy_decoding:
            raise ValueError(
                f"Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, "
                f"got best_of={self.best_of}."
            )
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    def _get_sampling_config(self):
        """The C++ SamplingConfig from this request's fields of the same names, with the real method's beam table:
        beam search sends best_of as beam_width and n as num_return_sequences, sampling best_of as
        num_return_sequences and beam width 1 (tensorrt_llm/sampling_params.py _get_sampling_config, 1.x)."""
        from tensorrt_llm.bindings import executor as tllme

        names = [n for n in inspect.signature(tllme.SamplingConfig).parameters if n not in _UNMATCHED]
        kwargs = {n: getattr(self, n) for n in names if hasattr(self, n)}
        if self.use_beam_search:
            kwargs.update(num_return_sequences=self.n, beam_width=self.best_of)
        else:
            kwargs.update(num_return_sequences=self.best_of, beam_width=1)
        return tllme.SamplingConfig(**kwargs)

    @staticmethod
    def params_imply_greedy_decoding(*, temperature, top_p, top_k) -> bool:
        return (
            (temperature is None and top_p is None and top_k is None) or top_k == 1 or top_p == 0.0 or temperature == 0
        )

    @property
    def _greedy_decoding(self) -> bool:
        if _state.series() < (1, 1):
            return (
                not self.use_beam_search
                and (self.top_k is None or self.top_k == 1)
                and (self.top_p is None or self.top_p == 0.0)
            )
        return not self.use_beam_search and self.params_imply_greedy_decoding(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
        )

    def _setup(self, tokenizer, *args, add_special_tokens: bool = False) -> SamplingParams:
        # 1.0: (tokenizer, add_special_tokens); later: (tokenizer, hf_model_config, generation_config, ...)
        if len(args) != (0 if _state.series() < (1, 1) else 2):
            raise TypeError(f"_setup() takes the tokenizer and {'no' if _state.series() < (1, 1) else 2} configs")
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id
            hf_model_config, generation_config = args or (None, None)
            if (
                getattr(hf_model_config, "model_type", None) == "kimi_k2"
                and generation_config is not None
                and isinstance(generation_config.eos_token_id, int)
            ):
                self.end_id = generation_config.eos_token_id
            if self.pad_id is None:
                self.pad_id = self.end_id
        if self.bad is not None:
            strs = [self.bad] if isinstance(self.bad, str) else self.bad
            self._bad_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in strs]
        if self.stop is not None:
            strs = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in strs]
        return self

    def _get_bad_words(self) -> list[list[int]]:
        if self.bad is not None and self._bad_word_ids is None:
            raise RuntimeError(
                f"{self.__class__.__name__}.bad ({self.bad}) is not processed by tokenizer, please call the setup "
                "method."
            )
        return [[i] for i in self.bad_token_ids or []] + (self._bad_word_ids or [])

    def _get_stop_words(self) -> list[list[int]]:
        if self.stop is not None and self._stop_word_ids is None:
            raise RuntimeError(
                f"{self.__class__.__name__}.stop ({self.stop}) is not processed by tokenizer, please call the setup "
                "method."
            )
        return [[i] for i in self.stop_token_ids or []] + (self._stop_word_ids or [])

    def _get_stop_reasons_and_words(self) -> list[tuple[str | int, list[int]]]:
        reasons: list = list(self.stop_token_ids or [])
        if self.stop is not None:
            reasons += [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return list(zip(reasons, self._get_stop_words()))
