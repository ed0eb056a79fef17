"""What a model folder holds: ``ModelArtifact`` and ``detect_artifact``.

Recognised layouts (NVIDIA/TensorRT-LLM tensorrt_llm/builder.py ``Engine.save``; deepjavalibrary/djl-serving
serving/docs/lmi/deployment_guide/model-artifacts.md):

* ``hf_checkpoint``: ``config.json`` with ``model_type``/``architectures`` + ``*.safetensors`` or
  ``pytorch_model*.bin`` weights.
* ``trtllm_engine``, ``engine_layout``:
  - ``llmapi``: ``config.json`` with ``build_config`` + ``rank{N}.engine`` (``trtllm-build`` / ``LLM.save()``);
  - ``legacy``: ``config.json`` with ``builder_config`` + ``{name}_{precision}_tp{T}[_pp{P}]_rank{N}.engine``;
  - ``triton``: a Triton/LMI model folder ``tensorrt_llm/`` = ``config.pbtxt`` + ``1/`` holding the
    engines (either naming) and usually the HF config + tokenizer files beside ``config.pbtxt``.
* ``trtllm_checkpoint``: ``config.json`` with ``architecture`` + ``mapping``/``quantization`` +
  ``rank{N}.safetensors`` (``convert_checkpoint.py`` / modelopt output).

The folder itself and its immediate sub-folders are searched: DJL users point ``model_id`` either at
the parent of ``tensorrt_llm/`` or at ``tensorrt_llm/`` itself (ds#2498), and both must work.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from lmi_trt.errors import LmiError

ArtifactKind = Literal["hf_checkpoint", "trtllm_engine", "trtllm_checkpoint"]
ArtifactSource = Literal["local", "hf", "s3"]
EngineLayout = Literal["llmapi", "triton", "legacy"]

# Any one of these makes a folder loadable by AutoTokenizer (with the files that go with it).
TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt"}
)
_LLMAPI_ENGINE = re.compile(r"^rank\d+\.engine$")
_LEGACY_ENGINE = re.compile(r"^.+_tp\d+(_pp\d+)?_rank\d+\.engine$")
_CHECKPOINT_SHARD = re.compile(r"^rank\d+\.safetensors$")


class SourceError(LmiError, RuntimeError):
    """A model or tokenizer could not be found, fetched or recognised; the message says what to do."""


@dataclass(frozen=True)
class ModelArtifact:
    """A model on local disk, ready for the compile or engine stage.

    ``path`` is the folder the artifact was recognised in, which may be a sub-folder of what
    ``model_id`` named (a Triton repository's ``tensorrt_llm/``). ``fingerprint`` changes whenever the
    content may have changed: the HF commit sha, a digest of the S3 listing's keys+ETags+sizes, or for a
    local folder a digest of relative file names, sizes and mtimes (cheap: no file is read; a copy with
    new mtimes only causes a false cache miss).
    """

    path: Path
    kind: ArtifactKind
    source: ArtifactSource
    model_id: str
    fingerprint: str
    engine_dir: Path | None = None
    engine_layout: EngineLayout | None = None
    tokenizer_dir: Path | None = None
    # The HF config.json (also for engines whose folder carries one); kept out of repr and hash.
    hf_config: dict | None = field(default=None, repr=False, hash=False, compare=False)


@dataclass(frozen=True)
class _Folder:
    """One folder's direct contents, read once."""

    path: Path
    files: frozenset[str]
    dirs: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> _Folder:
        files, dirs = set(), []
        with os.scandir(path) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue  # .cache/, .git/, our own S3 manifest
                if entry.is_dir():
                    dirs.append(entry.name)
                elif entry.is_file():
                    files.add(entry.name)
        return cls(path, frozenset(files), tuple(sorted(dirs)))

    def config(self) -> dict | None:
        if "config.json" not in self.files:
            return None
        try:
            data = json.loads((self.path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise SourceError(f"{self.path / 'config.json'} is not readable JSON ({e}); re-upload or fix it") from e
        return data if isinstance(data, dict) else None


def json_object(path: Path) -> dict | None:
    """A JSON object file, or None where it is missing or not one (``detect_artifact`` reports it when it loads)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_hf_config(cfg: dict | None) -> bool:
    if not cfg or "build_config" in cfg:
        return False
    return "model_type" in cfg or isinstance(cfg.get("architectures"), list)


def config_kind(cfg: dict | None) -> ArtifactKind | None:
    """The kind of model a folder's config.json describes, read before the folder itself is (None: unknown)."""
    if not cfg:
        return None
    if "build_config" in cfg or "builder_config" in cfg:
        return "trtllm_engine"
    if is_hf_config(cfg):
        return "hf_checkpoint"
    return "trtllm_checkpoint" if isinstance(cfg.get("architecture"), str) else None


def _has_hf_weights(files: frozenset[str]) -> bool:
    return any(
        f.endswith(".safetensors") or (f.endswith(".bin") and f.startswith(("pytorch_model", "model"))) for f in files
    )


def has_tokenizer(folder: Path) -> bool:
    return folder.is_dir() and any((folder / name).is_file() for name in TOKENIZER_FILES)


@dataclass(frozen=True)
class _Match:
    """What one folder was recognised as (before source and fingerprint are known)."""

    path: Path
    kind: ArtifactKind
    engine_dir: Path | None = None
    engine_layout: EngineLayout | None = None


def _engine_layout(folder: _Folder) -> EngineLayout:
    """llmapi or legacy, from the config.json beside the engines (the C++ loader decides the same way)."""
    engines = sorted(f for f in folder.files if f.endswith(".engine"))
    cfg = folder.config()
    if cfg is None:
        raise SourceError(
            f"{folder.path} holds {', '.join(engines[:3])} but no config.json beside it; TRT-LLM needs the "
            "config.json that trtllm-build wrote next to the rank*.engine files"
        )
    if "build_config" in cfg and any(_LLMAPI_ENGINE.match(e) for e in engines):
        return "llmapi"
    if "builder_config" in cfg and any(_LEGACY_ENGINE.match(e) for e in engines):
        return "legacy"
    raise SourceError(
        f"{folder.path} holds {', '.join(engines[:3])} but they do not match its config.json: expected "
        "'build_config' with rank{N}.engine (TRT-LLM >= 0.8) or 'builder_config' with "
        "{name}_{precision}_tp{T}_rank{N}.engine (older); found config keys "
        f"{sorted(cfg)[:8]}"
    )


def _triton_version_dir(folder: _Folder) -> Path | None:
    """The numbered version folder holding engines; the highest number, as Triton's default policy loads."""
    if "config.pbtxt" not in folder.files:
        return None
    versions = sorted((d for d in folder.dirs if d.isdigit()), key=int, reverse=True)
    for v in versions:
        if any(p.suffix == ".engine" for p in (folder.path / v).iterdir()):
            return folder.path / v
    return None


def _recognise(folder: _Folder) -> _Match | None:
    if any(f.endswith(".engine") for f in folder.files):
        return _Match(folder.path, "trtllm_engine", folder.path, _engine_layout(folder))
    version_dir = _triton_version_dir(folder)
    if version_dir is not None:
        _engine_layout(_Folder.read(version_dir))  # validates that config.json sits beside the engines
        return _Match(folder.path, "trtllm_engine", version_dir, "triton")
    cfg = folder.config()
    if (
        cfg is not None
        and isinstance(cfg.get("architecture"), str)
        and ("mapping" in cfg or "quantization" in cfg)
        and any(_CHECKPOINT_SHARD.match(f) for f in folder.files)
    ):
        return _Match(folder.path, "trtllm_checkpoint")
    if is_hf_config(cfg) and _has_hf_weights(folder.files):
        return _Match(folder.path, "hf_checkpoint")
    return None


def _near_misses(folder: _Folder) -> list[str]:
    """Why a folder that looks almost right was not taken, for the error message."""
    cfg = folder.config()
    if is_hf_config(cfg) and not _has_hf_weights(folder.files):
        return [f"{folder.path}/config.json is an HF config but no *.safetensors / pytorch_model*.bin are beside it"]
    if cfg is not None and isinstance(cfg.get("architecture"), str):
        return [f"{folder.path}/config.json is a TRT-LLM checkpoint config but no rank*.safetensors are beside it"]
    if "config.pbtxt" in folder.files:
        return [f"{folder.path}/config.pbtxt is there but no numbered sub-folder (1/) holds *.engine files"]
    return []


def _summarise(folder: _Folder, limit: int = 12) -> str:
    names = sorted(folder.files)[:limit] + [d + "/" for d in folder.dirs[:limit]]
    more = len(folder.files) + len(folder.dirs) - len(names)
    return ", ".join(names) + (f", ... ({more} more)" if more > 0 else "") if names else "nothing"


def _find_match(root: Path, model_id: str) -> _Match:
    top = _Folder.read(root)
    match = _recognise(top)
    if match is not None:
        return match
    children = [_Folder.read(root / d) for d in top.dirs]
    matches = [m for m in (_recognise(c) for c in children) if m is not None]
    # A precompiled engine beside a checkpoint is what the user means to serve (DJL's rule too).
    engines = [m for m in matches if m.kind == "trtllm_engine"]
    if len(engines) == 1 or len(matches) == 1:
        return (engines or matches)[0]
    if len(matches) > 1:
        raise SourceError(
            f"model_id {model_id!r}: {root} holds more than one model ("
            + ", ".join(f"{m.path.name}/ ({m.kind})" for m in matches)
            + "); point option.model_id at the one to serve"
        )
    notes = [n for f in [top, *children] for n in _near_misses(f)]
    raise SourceError(
        f"model_id {model_id!r}: no model recognised in {root} or its sub-folders. Looked for an HF checkpoint "
        "(config.json with model_type + *.safetensors or pytorch_model*.bin), a TRT-LLM engine (config.json + "
        "rank*.engine), a Triton/LMI repository (tensorrt_llm/config.pbtxt + tensorrt_llm/1/*.engine) and a "
        f"TRT-LLM checkpoint (config.json with architecture + rank*.safetensors). Found: {_summarise(top)}."
        + ("".join(f" Note: {n}." for n in notes))
    )


def detect_artifact(
    path: Path,
    *,
    model_id: str,
    source: ArtifactSource = "local",
    fingerprint: str | None = None,
) -> ModelArtifact:
    """Recognise the model in ``path`` (or one of its sub-folders).

    ``fingerprint`` is given by remote sources; a local folder gets ``local_fingerprint(path)``.
    Raises ``SourceError`` naming what was looked for and what was found.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise SourceError(f"model_id {model_id!r}: {root} is not a folder")
    match = _find_match(root, model_id)
    # Tokenizer and HF config sit beside config.pbtxt (DJL layout), beside the engines (LLM.save()),
    # or at the root the user named; all three are inside that root.
    candidates = dict.fromkeys(c for c in (match.path, match.engine_dir, root) if c is not None)
    tokenizer_dir = next((c for c in candidates if has_tokenizer(c)), None)
    hf_config = next(
        (cfg for c in dict.fromkeys([match.path, root]) if is_hf_config(cfg := _Folder.read(c).config())), None
    )
    return ModelArtifact(
        path=match.path,
        kind=match.kind,
        source=source,
        model_id=model_id,
        fingerprint=fingerprint if fingerprint is not None else local_fingerprint(root),
        engine_dir=match.engine_dir,
        engine_layout=match.engine_layout,
        tokenizer_dir=tokenizer_dir,
        hf_config=hf_config,
    )


def local_fingerprint(root: Path) -> str:
    """sha256 over (relative path, size, mtime_ns) of every non-hidden file under ``root``; reads no content."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(f for f in filenames if not f.startswith(".")):
            full = Path(dirpath, name)
            st = full.stat()  # follows symlinks: an HF cache snapshot links into blobs/
            rel = full.relative_to(root).as_posix()
            digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "local-" + digest.hexdigest()[:32]


def safe_relpath(name: str) -> PurePosixPath:
    """A relative path that stays inside any destination folder, from an untrusted remote name.

    Empty and ``.`` components (``a//b``, a leading ``/``) are dropped; ``..``, NUL and backslashes are
    refused rather than guessed at.
    """
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." or "\0" in p or "\\" in p for p in parts):
        raise SourceError(
            f"remote file name {name!r} would be written outside the download folder (or is empty); "
            "rename the object so its key has no '..', '\\' or NUL components"
        )
    return PurePosixPath(*parts)
