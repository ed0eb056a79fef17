"""The sources stage: ``model_id`` (local folder | ``s3://`` | HF hub id) → ``ModelArtifact`` on local disk.

``resolve_model`` follows DJL's order: no ``model_id`` → the model directory itself; an existing
local folder; ``s3://bucket/prefix``; otherwise a Hugging Face repo id. ``resolve_tokenizer`` finds
the folder to load the tokenizer from (``option.tokenizer_id`` first, then the artifact's own).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lmi_trt.config import LmiConfig, speculation

from .artifact import (
    TOKENIZER_FILES,
    ArtifactKind,
    ArtifactSource,
    EngineLayout,
    ModelArtifact,
    SourceError,
    detect_artifact,
    has_tokenizer,
    local_fingerprint,
    safe_relpath,
)
from .hf import download_hub, select_hub_files
from .s3 import DEFAULT_MAX_CONCURRENCY, download_s3, parse_s3_uri
from .transformers5 import for_installed_transformers

__all__ = [
    "ArtifactKind",
    "ArtifactSource",
    "EngineLayout",
    "ModelArtifact",
    "SourceError",
    "detect_artifact",
    "download_hub",
    "download_s3",
    "hub_token",
    "local_fingerprint",
    "parse_s3_uri",
    "resolve_draft_model",
    "resolve_model",
    "resolve_tokenizer",
    "safe_relpath",
    "select_hub_files",
]

_OTHER_SCHEMES = ("gs://", "gcs://", "az://", "abfs://", "http://", "https://", "s3a://", "s3n://")


def _looks_like_path(model_id: str) -> bool:
    return model_id.startswith(("/", "./", "../", "~", ".\\")) or model_id in (".", "..")


def hub_token(config: LmiConfig) -> str | None:
    return config.hf_token.get_secret_value() if config.hf_token is not None else None


def _fetch(
    name: str, config: LmiConfig, *, tokenizer_only: bool, s3_max_concurrency: int, key: str | None = None
) -> tuple[Path, ArtifactSource, str | None]:
    """Bring ``name`` to local disk: (folder, source, fingerprint or None for local folders).

    ``config.revision`` pins the model's repo; a separate tokenizer repo ``config.tokenizer_revision``, else its
    default branch (as a draft model's repo). ``key`` names the setting that named it, for errors (default: the
    model's or tokenizer's).
    """
    local = Path(name).expanduser()
    try:
        is_dir, exists = local.is_dir(), local.exists()
    except OSError:  # a name no file system holds (ENAMETOOLONG): not a local folder
        is_dir = exists = False
    if tokenizer_only and config.tokenizer_revision is not None and (name.startswith("s3://") or is_dir):
        raise SourceError(
            f"option.tokenizer_revision={config.tokenizer_revision!r} pins a Hugging Face repo, and "
            f"option.tokenizer_id {name!r} is not one; remove option.tokenizer_revision"
        )
    if name.startswith("s3://"):
        path, fingerprint = download_s3(name, config.download_dir, max_concurrency=s3_max_concurrency)
        return path, "s3", fingerprint
    if is_dir:
        return local.resolve(), "local", None
    if exists:
        raise SourceError(f"{name!r} is a file; option.model_id / option.tokenizer_id must name a folder")
    if name.startswith(_OTHER_SCHEMES):
        raise SourceError(f"{name!r}: unsupported URI scheme; use a local folder, s3://bucket/prefix or a HF repo id")
    if _looks_like_path(name):
        raise SourceError(f"local folder {name!r} does not exist (resolved to {local.resolve()})")
    path, sha = download_hub(
        name,
        revision=(config.tokenizer_revision if tokenizer_only else None)
        or (config.revision if name == config.model_id else None),
        token=hub_token(config),
        trust_remote_code=config.trust_remote_code,
        tokenizer_only=tokenizer_only,
        key=key or ("option.tokenizer_id" if tokenizer_only else "option.model_id"),
    )
    return path, "hf", "hf-" + sha


def resolve_model(config: LmiConfig, *, s3_max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> ModelArtifact:
    """Find, fetch if remote, and recognise the model ``config`` names; files transformers 5 wrote are read through
    a view in the installed transformers' form (``transformers5``)."""
    if config.model_id is None:
        if config.model_dir is None:
            raise SourceError("no model given: set option.model_id (HF id, s3:// URI or folder) or HF_MODEL_ID")
        return _readable(detect_artifact(config.model_dir, model_id=str(config.model_dir)), config)
    path, source, fingerprint = _fetch(
        config.model_id, config, tokenizer_only=False, s3_max_concurrency=s3_max_concurrency
    )
    return _readable(detect_artifact(path, model_id=config.model_id, source=source, fingerprint=fingerprint), config)


def _views(config: LmiConfig) -> Path:
    return config.download_dir / "transformers4-views"


def _readable(artifact: ModelArtifact, config: LmiConfig) -> ModelArtifact:
    """``artifact`` with its checkpoint and tokenizer folders readable by the installed transformers."""
    path = artifact.path
    if artifact.kind == "hf_checkpoint":
        path = for_installed_transformers(path, _views(config))
    tokenizer_dir = artifact.tokenizer_dir
    if tokenizer_dir is not None:
        tokenizer_dir = (
            path if tokenizer_dir == artifact.path else for_installed_transformers(tokenizer_dir, _views(config))
        )
    if (path, tokenizer_dir) == (artifact.path, artifact.tokenizer_dir):
        return artifact
    hf_config = json.loads((path / "config.json").read_text()) if path != artifact.path else artifact.hf_config
    return dataclasses.replace(artifact, path=path, tokenizer_dir=tokenizer_dir, hf_config=hf_config)


def resolve_draft_model(config: LmiConfig, *, s3_max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> Path | None:
    """The local folder of speculative decoding's draft model (None: no draft model), fetched like the
    model (hub, s3://, folder); it must be a Hugging Face checkpoint."""
    spec = speculation(config)
    if spec is None or spec.draft_model is None:
        return None
    key = spec.key("draft_model")
    path, source, fingerprint = _fetch(
        spec.draft_model, config, tokenizer_only=False, s3_max_concurrency=s3_max_concurrency, key=key
    )
    artifact = _readable(
        detect_artifact(path, model_id=spec.draft_model, source=source, fingerprint=fingerprint), config
    )
    if artifact.kind != "hf_checkpoint":
        raise SourceError(
            f"{key}={spec.draft_model!r} is a {artifact.kind.replace('_', ' ')}; a draft model is a Hugging Face "
            "checkpoint with the model's tokenizer"
        )
    return artifact.path


def _tokenizer_folder(root: Path) -> Path | None:
    """``root`` or the one sub-folder of it that holds tokenizer files (an uploaded folder one level down)."""
    if has_tokenizer(root):
        return root
    found = [d for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".") and has_tokenizer(d)]
    return found[0] if len(found) == 1 else None


def resolve_tokenizer(
    config: LmiConfig, artifact: ModelArtifact, *, s3_max_concurrency: int = DEFAULT_MAX_CONCURRENCY
) -> Path:
    """The folder to load the tokenizer from: ``config.tokenizer_id`` when set, else the artifact's own."""
    if config.tokenizer_id is not None:
        root, _, _ = _fetch(config.tokenizer_id, config, tokenizer_only=True, s3_max_concurrency=s3_max_concurrency)
        folder = _tokenizer_folder(root)
        if folder is None:
            raise SourceError(
                f"option.tokenizer_id {config.tokenizer_id!r}: no tokenizer files "
                f"({', '.join(sorted(TOKENIZER_FILES))}) "
                f"in {root} or a single sub-folder of it"
            )
        return for_installed_transformers(folder, _views(config))
    if artifact.tokenizer_dir is not None:
        return artifact.tokenizer_dir
    if artifact.kind == "trtllm_engine":
        raise SourceError(
            f"model_id {artifact.model_id!r}: this engine folder has no tokenizer files; set option.tokenizer_id "
            "to the HF id or s3:// folder of the model's tokenizer"
        )
    raise SourceError(
        f"model_id {artifact.model_id!r}: {artifact.path} has no tokenizer files; set option.tokenizer_id to the "
        "HF id, s3:// URI or folder of the model's tokenizer"
    )
