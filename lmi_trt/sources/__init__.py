"""The sources stage: ``model_id`` (local folder | ``s3://`` | HF hub id) → ``ModelArtifact`` on local disk.

What a model (or tokenizer) id is, is decided here once, for every stage (``locate``, by DJL's order: no
``model_id`` → the model directory itself; an existing local folder; ``s3://bucket/prefix``; otherwise a Hugging
Face repo id), and so is what its config.json says before the weights are fetched (``read_config``: preflight
from the hub cache, ``lmi-trt plan`` from the hub or S3). ``resolve_model`` fetches and recognises the model;
``resolve_tokenizer`` finds the folder to load the tokenizer from (``option.tokenizer_id`` first, then the
artifact's own).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from lmi_trt.config import LmiConfig, speculation

from .artifact import (
    TOKENIZER_FILES,
    ArtifactKind,
    ArtifactSource,
    EngineLayout,
    ModelArtifact,
    SourceError,
    config_kind,
    detect_artifact,
    has_tokenizer,
    json_object,
    local_fingerprint,
    safe_relpath,
)
from .hf import download_hub, hub_config, select_hub_files
from .s3 import DEFAULT_MAX_CONCURRENCY, download_s3, parse_s3_uri, s3_config
from .transformers5 import for_installed_transformers

__all__ = [
    "ArtifactKind",
    "ArtifactSource",
    "EngineLayout",
    "ModelArtifact",
    "ModelPeek",
    "ModelRef",
    "SourceError",
    "detect_artifact",
    "download_hub",
    "download_s3",
    "hub_token",
    "local_fingerprint",
    "locate",
    "model_ref",
    "parse_s3_uri",
    "peek",
    "read_config",
    "resolve_adapter",
    "resolve_draft_model",
    "resolve_model",
    "resolve_tokenizer",
    "safe_relpath",
    "select_hub_files",
    "startup_adapters",
    "tokenizer_ref",
]

_OTHER_SCHEMES = ("gs://", "gcs://", "az://", "abfs://", "http://", "https://", "s3a://", "s3n://")


def _looks_like_path(model_id: str) -> bool:
    return model_id.startswith(("/", "./", "../", "~", ".\\")) or model_id in (".", "..")


def hub_token(config: LmiConfig) -> str | None:
    return config.hf_token.get_secret_value() if config.hf_token is not None else None


@dataclass(frozen=True)
class ModelRef:
    """What a model or tokenizer id is: where it comes from (``source``), the folder of a local one, and the
    setting that named it (``key``, for messages)."""

    name: str  # as given
    key: str  # option.model_id or option.tokenizer_id
    source: ArtifactSource  # local | s3 | hf
    folder: Path | None = None  # local
    revision: str | None = None  # hf: the revision pinned for it (option.revision pins the model's repo only)


def locate(name: str, key: str, revision: str | None = None) -> ModelRef:
    """The one place a model or tokenizer id is recognised: ``s3://``, an existing folder, or a Hugging Face repo
    id; a file, another URI scheme or a path to no folder is a ``SourceError`` naming ``key``."""
    if name.startswith("s3://"):
        return ModelRef(name, key, "s3")
    local = Path(name).expanduser()
    try:
        is_dir, exists = local.is_dir(), local.exists()
    except OSError:  # a name no file system holds (ENAMETOOLONG): not a local folder
        is_dir = exists = False
    if is_dir:
        return ModelRef(name, key, "local", local.resolve())
    if exists:
        raise SourceError(f"{key}={name!r} is a file; name a folder holding the model (config.json and weights)")
    if name.startswith(_OTHER_SCHEMES):
        raise SourceError(
            f"{key}={name!r}: unsupported URI scheme; use a local folder, s3://bucket/prefix or a Hugging Face repo id"
        )
    if _looks_like_path(name):
        raise SourceError(
            f"{key}={name!r}: no such folder: local folder {name!r} does not exist (resolved to {local.resolve()}); "
            "check the path"
        )
    return ModelRef(name, key, "hf", revision=revision)


def model_ref(config: LmiConfig) -> ModelRef | None:
    """``option.model_id``, or the model directory itself where it is unset (DJL); None when neither is given."""
    if config.model_id is None:
        if config.model_dir is None:
            return None
        return ModelRef(str(config.model_dir), "option.model_id", "local", config.model_dir)
    return locate(config.model_id, "option.model_id", config.revision)


def tokenizer_ref(config: LmiConfig) -> ModelRef | None:
    """``option.tokenizer_id``, pinned by ``option.tokenizer_revision`` (a separate tokenizer repo is else taken at
    its default branch; the model's own repo at ``option.revision``); None: the model's own tokenizer."""
    if config.tokenizer_id is None:
        return None
    pinned = config.tokenizer_revision or (config.revision if config.tokenizer_id == config.model_id else None)
    ref = locate(config.tokenizer_id, "option.tokenizer_id", pinned)
    if config.tokenizer_revision is not None and ref.source != "hf":
        raise SourceError(
            f"option.tokenizer_revision={config.tokenizer_revision!r} pins a Hugging Face repo, and "
            f"option.tokenizer_id {config.tokenizer_id!r} is not one; remove option.tokenizer_revision"
        )
    return ref


def draft_ref(config: LmiConfig) -> ModelRef | None:
    """Speculative decoding's draft model (taken at its repo's default branch); None: no draft model."""
    spec = speculation(config)
    if spec is None or spec.draft_model is None:
        return None
    return locate(spec.draft_model, spec.key("draft_model"))


def read_config(ref: ModelRef, config: LmiConfig, *, download: bool = False) -> dict | None:
    """What the model's config.json says, without its weights: a local folder's file (None where it has none); a
    hub model's from the hub cache, or fetched with ``download``; an S3 model's only with ``download``."""
    if ref.source == "local":
        return json_object(ref.folder / "config.json")
    if ref.source == "s3":
        return s3_config(ref.name, ref.key) if download else None
    return hub_config(ref.name, ref.revision, hub_token(config), ref.key, download=download)


@dataclass(frozen=True)
class ModelPeek:
    """What is known of a model before its download: its kind and config.json (``kind`` and ``hf_config``, as a
    ``ModelArtifact`` states them once it is on disk)."""

    kind: ArtifactKind | None  # None: config.json does not say
    hf_config: dict | None


def peek(config: LmiConfig) -> ModelPeek | None:
    """The model as far as it can be read in seconds, before anything is downloaded (preflight): a tokenizer or
    model id that cannot exist is an error now; None where the model is not readable yet (S3, an uncached hub id
    online) or there is none (an engine that needs no model)."""
    for other in (tokenizer_ref(config), draft_ref(config)):  # found (or, offline, cached) like the model
        if other is not None:
            read_config(other, config)
    ref = model_ref(config)
    found = read_config(ref, config) if ref is not None else None
    return ModelPeek(config_kind(found), found) if found is not None else None


def _fetch(
    ref: ModelRef, config: LmiConfig, *, tokenizer_only: bool, s3_max_concurrency: int, adapter: bool = False
) -> tuple[Path, ArtifactSource, str | None]:
    """Bring ``ref`` to local disk: (folder, source, fingerprint or None for local folders)."""
    if ref.source == "s3":
        path, fingerprint = download_s3(ref.name, config.download_dir, max_concurrency=s3_max_concurrency)
        return path, "s3", fingerprint
    if ref.source == "local":
        return ref.folder, "local", None
    path, sha = download_hub(
        ref.name,
        revision=ref.revision,
        token=hub_token(config),
        trust_remote_code=config.trust_remote_code,
        tokenizer_only=tokenizer_only,
        adapter=adapter,
        key=ref.key,
    )
    return path, "hf", "hf-" + sha


def resolve_model(config: LmiConfig, *, s3_max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> ModelArtifact:
    """Find, fetch if remote, and recognise the model ``config`` names; files transformers 5 wrote are read through
    a view in the installed transformers' form (``transformers5``)."""
    ref = model_ref(config)
    if ref is None:
        raise SourceError("no model given: set option.model_id (HF id, s3:// URI or folder) or HF_MODEL_ID")
    path, source, fingerprint = _fetch(ref, config, tokenizer_only=False, s3_max_concurrency=s3_max_concurrency)
    return _readable(detect_artifact(path, model_id=ref.name, source=source, fingerprint=fingerprint), config)


def resolve_draft_model(config: LmiConfig, *, s3_max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> Path | None:
    """The local folder of speculative decoding's draft model (None: no draft model), fetched like the
    model (hub, s3://, folder); it must be a Hugging Face checkpoint, or for Medusa a folder of heads."""
    ref = draft_ref(config)
    if ref is None:
        return None
    path, source, fingerprint = _fetch(ref, config, tokenizer_only=False, s3_max_concurrency=s3_max_concurrency)
    if speculation(config).method == "medusa":  # type: ignore[union-attr]  # draft_ref found a speculation
        return path  # Medusa heads, no model of their own: the compile stage reads them (compile.medusa)
    artifact = _readable(detect_artifact(path, model_id=ref.name, source=source, fingerprint=fingerprint), config)
    if artifact.kind != "hf_checkpoint":
        raise SourceError(
            f"{ref.key}={ref.name!r} is a {artifact.kind.replace('_', ' ')}; a draft model is a Hugging Face "
            "checkpoint with the model's tokenizer"
        )
    return artifact.path


# DJL's adapters local directory: one folder per adapter, named by it, in the model directory (beside
# serving.properties) or in the folder of the model_id (djl-serving serving/docs/adapters.md).
ADAPTERS_DIR = "adapters"


def startup_adapters(config: LmiConfig, artifact: ModelArtifact) -> list[tuple[str, str]]:
    """(name, folder) of every adapter under ``adapters/`` of the model directory and of the model's folder (a
    local, s3:// or hub model, fetched), the model directory's first where both name one."""
    found: dict[str, str] = {}
    for root in (config.model_dir, artifact.path):
        folder = Path(root) / ADAPTERS_DIR if root is not None else None
        if folder is None or not folder.is_dir():
            continue
        for sub in sorted(folder.iterdir()):
            if sub.is_dir() and not sub.name.startswith("."):
                found.setdefault(sub.name, str(sub))
    return list(found.items())


def resolve_adapter(
    config: LmiConfig, src: str, key: str = "adapter src", *, s3_max_concurrency: int = DEFAULT_MAX_CONCURRENCY
) -> Path:
    """The local folder of a LoRA adapter named by ``src`` (a folder, ``s3://bucket/prefix`` or a Hugging Face
    repo id: recognised, fetched and cached as models are, ``locate``), for the error messages ``key``."""
    ref = locate(src, key)
    path, _, _ = _fetch(ref, config, tokenizer_only=False, s3_max_concurrency=s3_max_concurrency, adapter=True)
    return path


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
    ref = tokenizer_ref(config)
    if ref is not None:
        root, _, _ = _fetch(ref, config, tokenizer_only=True, s3_max_concurrency=s3_max_concurrency)
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
