"""Tokenizer loading and the few facts the serving layer needs from it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmi_trt.errors import LmiError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizerFacts:
    vocab_size: int  # len(tokenizer): base vocabulary plus added tokens
    eos_token_ids: tuple[int, ...]  # tokenizer eos plus generation_config.json's (int or list)
    bos_token_id: int | None
    pad_token_id: int | None
    special_token_ids: frozenset[int]
    has_chat_template: bool


class TokenizerError(LmiError, RuntimeError):
    """The tokenizer files cannot be loaded: one line naming the file, what transformers said, and what to do."""


def load_tokenizer(path: str | Path, trust_remote_code: bool = False, *, slow: bool = False) -> Any:
    """Load with ``AutoTokenizer``: the fast tokenizer where the model has one, the Python one with ``slow``
    (option.tokenizer_mode=slow). Files transformers 5 wrote reach here already in the installed transformers' form
    (lmi_trt.sources.transformers5); what still cannot load is a ``TokenizerError`` naming the file."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code, use_fast=not slow)
    except Exception as e:  # transformers raises OSError/ValueError/ImportError/AttributeError by what is wrong
        raise TokenizerError(_why_not(Path(path), e, trust_remote_code)) from None


def _why_not(folder: Path, error: Exception, trust_remote_code: bool) -> str:
    import transformers

    from lmi_trt.sources.artifact import TOKENIZER_FILES
    from lmi_trt.sources.transformers5 import source_of

    shown = source_of(folder)  # a view of a transformers-5 folder names the user's files, not our copy
    file = shown / "tokenizer_config.json"
    try:
        declared = json.loads(file.read_text()).get("tokenizer_class")  # as the user's file has it
    except (OSError, ValueError, AttributeError):
        file, declared = shown, None
    vocabularies = sorted(TOKENIZER_FILES - {"tokenizer_config.json"})
    if not any((folder / name).is_file() for name in vocabularies):
        said = f"it has no vocabulary file ({', '.join(vocabularies)})"
    else:
        said = " ".join(f"{type(error).__name__}: {error}".split())  # one line: transformers' messages span several
    what = f" (tokenizer_class {declared!r})" if declared else ""
    fix = [] if trust_remote_code else ["set option.trust_remote_code=true if the model ships its tokenizer code"]
    fix.append(f"point option.tokenizer_id at the same tokenizer saved by transformers {transformers.__version__}")
    return f"{file}: transformers {transformers.__version__} cannot load this tokenizer{what}: {said}; " + ", or ".join(
        fix
    )


def _generation_config_eos(path: str | Path | None) -> list[int]:
    if path is None:
        return []
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return []
    try:
        eos = json.loads(file.read_text()).get("eos_token_id")
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable %s: %s", file, e)
        return []
    if isinstance(eos, int):
        return [eos]
    if isinstance(eos, list):
        return [i for i in eos if isinstance(i, int)]
    return []


def tokenizer_facts(tokenizer: Any, model_dir: str | Path | None = None) -> TokenizerFacts:
    """Facts from the tokenizer plus ``model_dir/generation_config.json`` (Llama 3 lists several eos ids)."""
    eos: list[int] = []
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    for i in _generation_config_eos(model_dir):
        if i not in eos:
            eos.append(i)
    return TokenizerFacts(
        vocab_size=len(tokenizer),
        eos_token_ids=tuple(eos),
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        special_token_ids=frozenset(tokenizer.all_special_ids),
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
    )
