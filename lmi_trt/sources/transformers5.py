"""Folders written by transformers 5, served where transformers 4 is installed (the TensorRT-LLM images pin 4.42.4,
4.53.1, 4.56.0 and 4.57.3: ci/pins/).

transformers 5 writes files transformers 4 misreads or cannot read (huggingface/transformers#45376, PR 45566;
ml-explore/mlx-lm#661; read in transformers 5.24.0's source):

* ``tokenizer_config.json`` (tokenization_utils_base.py ``save_pretrained``): ``tokenizer_class`` is the class name,
  ``TokenizersBackend`` for the generic one, which 4.x does not have ("Tokenizer class TokenizersBackend does not
  exist"; tokenization_utils_tokenizers.py: ``PreTrainedTokenizerFast = TokenizersBackend``);
  ``extra_special_tokens`` is a list (4.x: ``additional_special_tokens``; 4.x reads ``extra_special_tokens`` as a
  dict of named tokens and fails with "'list' object has no attribute 'keys'"); a ``backend`` key; and no
  ``clean_up_tokenization_spaces`` where it is 5.x's default, False (4.42's default is True).
* the chat template in ``chat_template.jinja`` (more in ``additional_chat_templates/``), which 4.42 does not read.
* ``config.json`` (modeling_rope_utils.py ``standardize_rope_params``): ``rope_theta`` and the ``rope_scaling``
  entries inside ``rope_parameters``; 4.x then takes the default RoPE base and no scaling, silently. ``dtype``
  instead of ``torch_dtype``, which 4.42-4.53 do not read.
* ``tokenizer.json``, written by the tokenizers library transformers 5 needs (≥ 0.22): BPE merges as pairs of
  tokens (huggingface/tokenizers PR 909, "Merges cannot handle tokens containing spaces"), which tokenizers 0.19 (the
  0.12 image's) cannot read ("data did not match any variant of untagged enum ModelWrapper"); 0.20 on (the first
  release with PR 909) reads both.

``for_installed_transformers`` answers with a view of such a folder: a private folder beside the downloads holding
links to every file but those, which it writes in 4.x's form. Everything that reads the folder (our tokenizer, the
engines, TensorRT-LLM's own loaders) then reads it as its writer meant. Pure functions do the rewriting.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from packaging.version import Version

from .artifact import SourceError

CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_JSON = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # transformers 5 utils/__init__.py CHAT_TEMPLATE_FILE
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # and CHAT_TEMPLATE_DIR
# Sub-configs of a multimodal config.json, each a config of its own.
_SUB_CONFIGS = ("text_config", "language_config", "llm_config")


def installed(package: str) -> Version:
    return Version(importlib.metadata.version(package))


def config_written_by_5(config: dict[str, Any]) -> bool:
    version = config.get("transformers_version")
    try:
        return isinstance(version, str) and Version(version).major >= 5
    except ValueError:
        return False


def config_for_4(config: dict[str, Any], installed: Version) -> dict[str, Any]:
    """Pure: a transformers-5 ``config.json`` as 4.x reads it (RoPE as ``rope_theta`` + ``rope_scaling``; ``dtype`` as
    ``torch_dtype`` before 4.56). ``ValueError`` for RoPE parameters per layer type, which each 4.x model spells its own
    way (Gemma 3: ``rope_local_base_freq``), so no rewrite is safe."""
    out = dict(config)
    params = out.pop("rope_parameters", None)
    if isinstance(params, dict):
        if any(isinstance(v, dict) for v in params.values()):
            raise ValueError(
                f"its rope_parameters are per layer type ({', '.join(sorted(params))}), which transformers "
                f"{installed} spells differently for each model"
            )
        scaling = dict(params)
        if "rope_theta" in scaling:
            out["rope_theta"] = scaling.pop("rope_theta")
        if "partial_rotary_factor" in scaling:
            out["partial_rotary_factor"] = scaling.pop("partial_rotary_factor")
        kind = scaling.pop("rope_type", scaling.pop("type", "default"))
        # "rope_type" from 4.43 (modeling_rope_utils.py: "BC: 'rope_type' was originally 'type'"); 4.42's configs
        # take "type" only (its LlamaConfig wants exactly {type, factor}).
        spelled = "rope_type" if installed.release >= (4, 43) else "type"
        out["rope_scaling"] = None if kind == "default" else {**scaling, spelled: kind}
    # transformers 4.56 reads "dtype" (lmi_trt/compat.py); before it only torch_dtype.
    if "dtype" in out and "torch_dtype" not in out and installed.release < (4, 56):
        out["torch_dtype"] = out["dtype"]
    for key in _SUB_CONFIGS:
        if isinstance(out.get(key), dict):
            out[key] = config_for_4(out[key], installed)
    return out


def tokenizer_config_written_by_5(tokenizer_config: dict[str, Any]) -> bool:
    return (
        tokenizer_config.get("tokenizer_class") == "TokenizersBackend"
        or isinstance(tokenizer_config.get("extra_special_tokens"), list)
        or "backend" in tokenizer_config
    )


def tokenizer_config_for_4(tokenizer_config: dict[str, Any], templates: dict[str, str]) -> dict[str, Any]:
    """Pure: a transformers-5 ``tokenizer_config.json`` as 4.x reads it. ``templates``: the chat templates 5.x wrote
    beside it (``default`` from chat_template.jinja, the others by name), folded in as 4.x keeps them."""
    out = dict(tokenizer_config)
    out.pop("backend", None)
    if out.get("tokenizer_class") == "TokenizersBackend":
        out["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        named = out.get("additional_special_tokens") or []
        out["additional_special_tokens"] = named + [t for t in extra if t not in named]
    out.setdefault("clean_up_tokenization_spaces", False)
    if templates and "chat_template" not in out:
        if list(templates) == ["default"]:
            out["chat_template"] = templates["default"]
        else:
            out["chat_template"] = [{"name": name, "template": text} for name, text in templates.items()]
    return out


def merges_as_text(tokenizer: dict[str, Any]) -> dict[str, Any] | None:
    """Pure: a ``tokenizer.json`` whose BPE merges are pairs, with them as "left right" strings (the form tokenizers
    before 0.20 reads); None when they are strings already; ``ValueError`` when a token holds a space, which the
    string form cannot carry."""
    model = tokenizer.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges or not isinstance(merges[0], list):
        return None
    if any(" " in part for pair in merges for part in pair):
        raise ValueError("its BPE merges hold tokens with spaces, which tokenizers before 0.20 cannot represent")
    return {**tokenizer, "model": {**model, "merges": [" ".join(pair) for pair in merges]}}


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path} is not readable JSON ({exc}); re-upload or fix it") from exc
    return data if isinstance(data, dict) else None


def _templates(folder: Path) -> dict[str, str]:
    found = {}
    if (folder / CHAT_TEMPLATE_FILE).is_file():
        found["default"] = (folder / CHAT_TEMPLATE_FILE).read_text()
    extra = folder / CHAT_TEMPLATE_DIR
    if extra.is_dir():
        found.update({f.stem: f.read_text() for f in sorted(extra.glob("*.jinja"))})
    return found


_SOURCE_MARK = ".transformers5-source"  # in a view: the folder it shows (dot files are not the model's: artifact.py)


def source_of(folder: Path) -> Path:
    """The folder a view shows (``folder`` itself when it is not a view), for messages that name a user's file."""
    mark = folder / _SOURCE_MARK
    return Path(mark.read_text()) if mark.is_file() else folder


def for_installed_transformers(folder: Path, views: Path) -> Path:
    """``folder``, or where transformers 4 is installed and ``folder`` holds files transformers 5 wrote, a view of it
    under ``views`` with those files in 4.x's form (built once per content; atomic, so processes may race)."""
    transformers = installed("transformers")
    if transformers.major >= 5:
        return folder
    config, tokenizer_config = _read_json(folder / CONFIG), _read_json(folder / TOKENIZER_CONFIG)
    new: dict[str, dict[str, Any] | None] = {}
    if config is not None and config_written_by_5(config):
        try:
            new[CONFIG] = config_for_4(config, transformers)
        except ValueError as exc:
            raise SourceError(
                f"{folder / CONFIG} was written by transformers {config['transformers_version']}: {exc}; serve it "
                "with transformers 5 (an image that has it), or save the model again with transformers 4.x"
            ) from exc
    if tokenizer_config is not None and tokenizer_config_written_by_5(tokenizer_config):
        new[TOKENIZER_CONFIG] = tokenizer_config_for_4(tokenizer_config, _templates(folder))
    if installed("tokenizers").release < (0, 20) and (folder / TOKENIZER_JSON).is_file():
        try:
            new[TOKENIZER_JSON] = merges_as_text(_read_json(folder / TOKENIZER_JSON) or {})
        except ValueError as exc:
            raise SourceError(
                f"{folder / TOKENIZER_JSON}: {exc}; serve it with tokenizers 0.20 or later (an image with "
                "transformers 4.45 or later)"
            ) from exc
    rewritten = {
        name: json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, data in new.items()
        if data is not None
    }
    if not rewritten:
        return folder
    # The chat templates move into tokenizer_config.json only when it is rewritten; else they stay where they are.
    replaced = set(rewritten) | ({CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_DIR} if TOKENIZER_CONFIG in rewritten else set())
    digest = hashlib.sha256(
        json.dumps([str(folder.resolve()), str(transformers), sorted(rewritten.items())]).encode()
    ).hexdigest()[:16]
    view = views / f"{folder.name}-{digest}"
    if view.is_dir():
        return view
    views.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=views))
    try:
        for entry in sorted(folder.iterdir()):
            if entry.name not in replaced:
                (staging / entry.name).symlink_to(entry.resolve())
        for name, text in rewritten.items():
            (staging / name).write_text(text)
        (staging / _SOURCE_MARK).write_text(str(folder.resolve()))
        os.rename(staging, view)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not view.is_dir():  # not a lost race with another process building the same view
            raise
    return view
