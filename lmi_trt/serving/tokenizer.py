"""Tokenizer loading and the few facts the serving layer needs from it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizerFacts:
    vocab_size: int  # len(tokenizer): base vocabulary plus added tokens
    eos_token_ids: tuple[int, ...]  # tokenizer eos plus generation_config.json's (int or list)
    bos_token_id: int | None
    pad_token_id: int | None
    special_token_ids: frozenset[int]
    has_chat_template: bool


def load_tokenizer(path: str | Path, trust_remote_code: bool = False, revision: str | None = None) -> Any:
    """Load with ``AutoTokenizer`` (fast tokenizers preferred); errors name the path."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code, revision=revision)
    except Exception as e:  # transformers raises OSError/ValueError/ImportError depending on what is missing
        hint = "" if trust_remote_code else " (if it ships custom tokenizer code, set option.trust_remote_code=true)"
        raise RuntimeError(f"could not load a tokenizer from {str(path)!r}: {e}{hint}") from e


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
