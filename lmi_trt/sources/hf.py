"""Hugging Face hub ids → a snapshot folder in the hub cache, through ``snapshot_download``.

huggingface_hub reads ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_ENDPOINT`` and a stored or
``HF_TOKEN`` token itself, and draws its own progress bars; nothing here reads the environment.
Only the files a server needs are fetched (``select_hub_files``): a 70B repo that also ships
``*.bin``, ``original/*.pth`` and GGUF variants costs one copy of the weights, not four.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from huggingface_hub import HfApi, snapshot_download

# huggingface_hub.utils re-exports these errors in every release from 0.23 (the TensorRT-LLM 0.12 image's
# floor: transformers 4.42.4 requires huggingface-hub>=0.23.2,<1.0) to today's; huggingface_hub.errors
# lacks most of them in 0.23 and 0.24.
from huggingface_hub.utils import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

try:  # The cached repo listing and its incomplete-snapshot check: newer huggingface_hub only, no 0.x release
    # (every TensorRT-LLM image pins transformers, which requires huggingface-hub<1.0).
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError, IncompleteSnapshotError
except ImportError:  # offline, the snapshot is then taken as the cache holds it
    get_cached_repo_tree = None
    CachedRepoTreeNotFoundError = IncompleteSnapshotError = None  # type: ignore[assignment,misc]

from .artifact import TOKENIZER_FILES, SourceError, json_object

log = logging.getLogger(__name__)

# Root-level files of an HF checkpoint besides the weights and the tokenizer files.
_CHECKPOINT_META = frozenset(
    {
        "config.json",
        "generation_config.json",
        "hf_quant_config.json",  # modelopt pre-quantized (FP8/NVFP4) checkpoints
        "quantize_config.json",  # GPTQ/AWQ
        "quant_cfg.json",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    }
)
# Beyond TOKENIZER_FILES: what AutoTokenizer reads when present (chat templates included).
_TOKENIZER_EXTRA = frozenset(
    {"special_tokens_map.json", "added_tokens.json", "merges.txt", "chat_template.json", "chat_template.jinja"}
)
_TOKENIZER_GLOBS = ("*.tiktoken", "tokenizer*")
# Weight formats no loader here reads; never fetched even inside engine repositories.
_FOREIGN_WEIGHTS = ("*.pth", "*.pt", "*.gguf", "*.onnx", "*.onnx_data", "*.msgpack", "*.h5", "*.ot", "*.ckpt", "*.bin")


def _matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def _is_tokenizer_file(name: str) -> bool:
    return name in TOKENIZER_FILES or name in _TOKENIZER_EXTRA or _matches(name, _TOKENIZER_GLOBS)


# A PEFT adapter repo's files (peft src/peft/utils/constants.py: CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME); its
# pickled adapter_model.bin is not loaded.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def select_hub_files(
    filenames: Iterable[str], *, trust_remote_code: bool, tokenizer_only: bool = False, adapter: bool = False
) -> list[str]:
    """The files of a hub repo worth downloading, from its listing.

    * ``adapter``: a LoRA adapter's ``ADAPTER_FILES``;

    * an engine repo (any ``*.engine``, Truss ``engine_repository``): everything at any depth except
      foreign weight formats (``*.bin``, ``*.pth``, GGUF, …);
    * a checkpoint: root-level config, tokenizer and quantization files plus ``*.safetensors``, or
      ``pytorch_model*.bin`` only when the repo has no safetensors;
    * ``tokenizer_only``: root-level tokenizer files and ``config.json`` (AutoTokenizer reads it);
    * ``*.py`` (remote code) only with ``trust_remote_code``.
    """
    names = sorted(set(filenames))
    code = [n for n in names if trust_remote_code and "/" not in n and n.endswith(".py")]
    root = [n for n in names if "/" not in n]
    if adapter:
        return [n for n in root if n in ADAPTER_FILES]
    if tokenizer_only:
        return sorted({n for n in root if _is_tokenizer_file(n) or n == "config.json"} | set(code))
    if any(n.endswith(".engine") for n in names):
        return sorted(
            {n for n in names if not _matches(PurePosixPath(n).name, _FOREIGN_WEIGHTS) and not n.endswith(".py")}
            | set(code)
        )
    has_safetensors = any(n.endswith(".safetensors") for n in root)
    weights = (
        [n for n in root if n.endswith(".safetensors")]
        if has_safetensors
        else [n for n in root if n.startswith("pytorch_model") and n.endswith(".bin")]
    )
    other_index = "pytorch_model.bin.index.json" if has_safetensors else "model.safetensors.index.json"
    meta = [n for n in root if (n in _CHECKPOINT_META or _is_tokenizer_file(n)) and n != other_index]
    return sorted(set(weights) | set(meta) | set(code))


def _repo_files(repo_id: str, revision: str | None, token: str | None) -> list[str] | None:
    """The repo's file list: from the hub, else (offline) from the listing cached by an earlier download.

    None when neither is available; the snapshot is then taken as it is in the cache.
    """
    try:
        return HfApi(token=token).list_repo_files(repo_id, revision=revision)
    except OfflineModeIsEnabled:
        pass
    except (RepositoryNotFoundError, RevisionNotFoundError, HFValidationError):
        raise
    except Exception as e:  # noqa: BLE001 - hub down, no network, 401: snapshot_download decides below
        log.debug("listing %s failed (%s); falling back to the cached listing", repo_id, e)
    if get_cached_repo_tree is None:
        return None
    try:
        return [f.path for f in get_cached_repo_tree(repo_id, revision=revision)]
    except (CachedRepoTreeNotFoundError, OSError, ValueError):
        return None


def _explain(repo_id: str, revision: str | None, error: Exception, key: str) -> SourceError:
    rev = f" at revision {revision!r}" if revision else ""
    if isinstance(error, HFValidationError):
        return SourceError(
            f"{key} {repo_id!r} is not an existing local folder, an s3:// URI, or a valid Hugging Face repo id "
            f"('namespace/name'): {error}"
        )
    if isinstance(error, GatedRepoError):
        return SourceError(
            f"{key} {repo_id!r} is a gated repo{rev}: accept its license on https://huggingface.co/{repo_id} "
            "with the account whose token you pass in HF_TOKEN (and check that token has read access)"
        )
    if isinstance(error, RepositoryNotFoundError):
        return SourceError(
            f"{key} {repo_id!r} was not found on the Hugging Face hub: check the spelling; if it is private, "
            "set HF_TOKEN to a token that can read it"
        )
    if isinstance(error, RevisionNotFoundError):
        return SourceError(f"{key} {repo_id!r} has no revision {revision!r}; fix option.revision (HF_REVISION)")
    if isinstance(error, HfHubHTTPError) and error.response is not None and error.response.status_code in (401, 403):
        return SourceError(
            f"{key} {repo_id!r}{rev}: the hub refused access ({error.response.status_code}); set HF_TOKEN to a "
            "token that can read the repo"
        )
    if IncompleteSnapshotError is not None and isinstance(error, IncompleteSnapshotError):
        return SourceError(
            f"{key} {repo_id!r}{rev}: the local hub cache holds only part of the files and the hub cannot be "
            "reached; re-run with network access (unset HF_HUB_OFFLINE) to complete it"
        )
    if isinstance(error, LocalEntryNotFoundError):
        offline = isinstance(error.__cause__, OfflineModeIsEnabled)
        why = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        return SourceError(
            f"{key} {repo_id!r}{rev} is not in the local hub cache (HF_HOME) and {why}: download it "
            f"beforehand (`hf download {repo_id}` with the same HF_HOME), "
            + ("unset HF_HUB_OFFLINE, " if offline else "check the network / HF_ENDPOINT, ")
            + "or point option.model_id at a local folder or s3:// URI"
        )
    return SourceError(f"{key} {repo_id!r}{rev}: hub download failed: {type(error).__name__}: {error}")


# One metadata request before a download: an unreachable hub then costs one line within seconds, not
# huggingface_hub's retries of every file request (5 with backoff, ~35 s, each logged).
HUB_CHECK_TIMEOUT_S = 5.0


def hub_problem(
    repo_id: str, revision: str | None, token: str | None, timeout: float = HUB_CHECK_TIMEOUT_S
) -> tuple[str, str] | None:
    """Why the hub cannot give ``repo_id`` (the problem, the fix), from one request without retries; None when
    it can, or when only the download can tell (the hub answered an error of its own, e.g. a 5xx)."""
    from huggingface_hub import constants

    rev = f" at revision {revision!r}" if revision else ""
    try:
        HfApi(token=token).model_info(repo_id, revision=revision, timeout=timeout)
    except HFValidationError as e:
        return f"it is not a valid Hugging Face repo id either ({e})", "give an existing folder (./path or /path)"
    except RepositoryNotFoundError:
        return (
            f"the Hugging Face hub has no model {repo_id!r} (or it is private)",
            "give an existing folder (./path or /path), fix the id, or set HF_TOKEN to a token that can read it",
        )
    except RevisionNotFoundError:
        return f"the Hugging Face hub has no revision {revision!r} of {repo_id!r}", "fix option.revision"
    except HfHubHTTPError:
        return None
    except Exception as e:  # noqa: BLE001 - the transport's errors: requests' in huggingface_hub 0.x, httpx's later
        return (
            f"the Hugging Face hub ({constants.ENDPOINT}) cannot be reached{rev} ({type(e).__name__}: {e})",
            "give an existing folder (./path or /path), check the network and HF_ENDPOINT, or download the model "
            f"beforehand (`hf download {repo_id}`) and set HF_HUB_OFFLINE=1",
        )
    return None


def download_hub(
    repo_id: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    trust_remote_code: bool = False,
    tokenizer_only: bool = False,
    adapter: bool = False,
    key: str = "option.model_id",
) -> tuple[Path, str]:
    """Fetch (or find in the cache) the needed files of ``repo_id``; return (snapshot folder, commit sha).

    ``key`` is the setting that named the repo, for error messages.
    """
    try:
        files = _repo_files(repo_id, revision, token)
        patterns = (
            select_hub_files(files, trust_remote_code=trust_remote_code, tokenizer_only=tokenizer_only, adapter=adapter)
            if files is not None
            else None
        )
        # Exact names as allow_patterns; the original revision (not the sha) so refs/<branch> is recorded
        # and a later offline start finds the same snapshot.
        snapshot = snapshot_download(repo_id, revision=revision, token=token, allow_patterns=patterns)
    except (HFValidationError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        raise _explain(repo_id, revision, e, key) from e
    path = Path(snapshot)
    # The cache lays snapshots out as snapshots/<commit sha>/.
    return path, path.name


def hub_config(repo_id: str, revision: str | None, token: str | None, key: str, *, download: bool) -> dict | None:
    """config.json of a hub model, without its weights. ``download``: fetched from the hub (``lmi-trt plan``). Else
    from the local hub cache (preflight): a model not in it cannot load with HF_HUB_OFFLINE, nor where the hub cannot
    give it (``hub_problem``: one quick request), so either is an error now; else None (the download decides)."""
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache

    if download:
        try:
            return json_object(Path(hf_hub_download(repo_id, "config.json", revision=revision, token=token)))
        except Exception as e:
            raise SourceError(
                f"{key}={repo_id!r}: cannot fetch config.json from the Hugging Face hub ({type(e).__name__}: {e})"
            ) from e
    try:
        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except ValueError:  # not a valid repo id either
        cached = None
    if isinstance(cached, str):
        return json_object(Path(cached))
    folder = Path(repo_id).resolve()
    if not constants.HF_HUB_OFFLINE:
        found = hub_problem(repo_id, revision, token)
        if found is None:
            return None
        problem, fix = found
        raise SourceError(f"{key}={repo_id!r}: no such local folder exists ({folder}), and {problem}; {fix}")
    raise SourceError(
        f"{key}={repo_id!r}: no such local folder exists ({folder}), and it is not a Hugging Face model in the local "
        "hub cache while HF_HUB_OFFLINE is set; give an existing folder (./path or an absolute path), download the "
        f"model beforehand (`hf download {repo_id}` with the same HF_HOME), or unset HF_HUB_OFFLINE"
    )
