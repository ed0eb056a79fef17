"""A content-addressed engine cache: local folder + optional S3 prefix, one build per key.

Key: sha256 over the model fingerprint, the whole ``BuildPlan`` (minus its explanatory notes),
the TensorRT-LLM version, the GPU's SM and name, TP and PP (engines are tied to the TensorRT-LLM
version and the GPU: NVIDIA/TensorRT-LLM tensorrt_llm/builder.py, ``Engine.save`` records the version
next to the build config). A key of model id + TP only would reuse stale engines after a changed
dtype or length; here any change is a
different key, and a miss next to an entry for the same model logs which input changed.

Local layout under ``root``::

    entries/<key>/          a complete entry: engine files + lmi_trt_manifest.json
    tmp/<key>.<uuid>/       a build or download in progress (renamed into entries/ when complete)
    locks/<key>.lock        one builder per key on this host (filelock; released if the process dies)

An entry is used only after its manifest (key inputs + every file's sha256 and size) checks out,
so a killed build or a torn download never looks complete. Across hosts, an S3 prefix holds the
same entries (``<prefix>/<key>/...``, the manifest uploaded last) and a lease object
``<prefix>/<key>/.lease`` names the one replica building; the others wait and download.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .errors import BuildError, CacheError
from .plan import BuildPlan, GpuFacts

log = logging.getLogger(__name__)

MANIFEST_NAME = "lmi_trt_manifest.json"
MANIFEST_FORMAT = "lmi-trt-engine/1"
LEASE_NAME = ".lease"
_CHUNK = 8 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# key and manifest
# ---------------------------------------------------------------------------------------------


class CacheKeyInputs(BaseModel):
    """Every input of the cache key (and nothing else)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fingerprint: str
    plan: dict[str, Any]
    trtllm_version: str
    gpu_sm: int
    gpu_name: str
    tp_size: int
    pp_size: int

    @classmethod
    def from_plan(cls, fingerprint: str, plan: BuildPlan, gpu: GpuFacts) -> CacheKeyInputs:
        return cls(
            fingerprint=fingerprint,
            plan=plan.key_dict(),
            trtllm_version=plan.trtllm_version,
            gpu_sm=gpu.sm,
            gpu_name=gpu.name,
            tp_size=plan.tp_size,
            pp_size=plan.pp_size,
        )


def cache_key(inputs: CacheKeyInputs) -> str:
    canonical = json.dumps(inputs.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str
    size: int


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["lmi-trt-engine/1"] = MANIFEST_FORMAT
    key: str
    model_id: str
    inputs: CacheKeyInputs
    files: dict[str, FileEntry]
    created_at: float
    builder: str

    @field_validator("files")
    @classmethod
    def _names_stay_inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        """Names come from a shared (S3) cache: each must be a plain relative path, so that a bad
        manifest cannot have a download write outside the entry folder."""
        for name in files:
            parts = name.split("/")
            if name == MANIFEST_NAME or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
                raise ValueError(f"file name {name!r} is not a plain relative path inside the entry")
        return files


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _entry_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def make_manifest(folder: Path, inputs: CacheKeyInputs, model_id: str) -> Manifest:
    files = {
        p.relative_to(folder).as_posix(): FileEntry(sha256=file_sha256(p), size=p.stat().st_size)
        for p in _entry_files(folder)
    }
    return Manifest(
        key=cache_key(inputs),
        model_id=model_id,
        inputs=inputs,
        files=files,
        created_at=time.time(),
        builder=f"{socket.gethostname()}:{os.getpid()}",
    )


def write_manifest(folder: Path, manifest: Manifest) -> None:
    (folder / MANIFEST_NAME).write_text(manifest.model_dump_json(indent=2))


def read_manifest(folder: Path) -> Manifest | None:
    try:
        return Manifest.model_validate_json((folder / MANIFEST_NAME).read_text())
    except (OSError, ValidationError, ValueError):
        return None


VerifyMode = Literal["sha256", "size"]


def verify_entry(folder: Path, key: str | None = None, mode: VerifyMode = "sha256") -> str | None:
    """None when ``folder`` is a complete, intact entry (for ``key``); else why it is not."""
    manifest = read_manifest(folder)
    if manifest is None:
        return "no readable manifest"
    if key is not None and (manifest.key != key or cache_key(manifest.inputs) != key):
        return f"manifest is for key {manifest.key[:12]}, not {key[:12]}"
    present = {p.relative_to(folder).as_posix() for p in _entry_files(folder)}
    if present != set(manifest.files):
        missing, extra = set(manifest.files) - present, present - set(manifest.files)
        return f"files differ from the manifest (missing {sorted(missing)}, unexpected {sorted(extra)})"
    for rel, entry in manifest.files.items():
        path = folder / rel
        if path.stat().st_size != entry.size:
            return f"{rel}: {path.stat().st_size} bytes, manifest says {entry.size}"
        if mode == "sha256" and file_sha256(path) != entry.sha256:
            return f"{rel}: sha256 differs from the manifest"
    return None


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def explain_change(old: CacheKeyInputs, new: CacheKeyInputs) -> list[str]:
    """``["plan.max_input_len: 1024 → 2048", ...]``: the key inputs that differ."""
    a, b = _flatten(old.model_dump(mode="json")), _flatten(new.model_dump(mode="json"))
    return [f"{k}: {a.get(k)!r} → {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _closest_change(inputs: CacheKeyInputs, model_id: str, manifests: Iterable[Manifest]) -> list[str] | None:
    """The smallest diff to an existing entry of the same model, if any."""
    diffs = [explain_change(m.inputs, inputs) for m in manifests if m.model_id == model_id]
    return min(diffs, key=len) if diffs else None


# ---------------------------------------------------------------------------------------------
# S3
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    owner: str
    expires_at: float
    etag: str | None = None

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at


def _error_code(error: Exception) -> tuple[str, int]:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")), int(
        response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
    )


_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
_UNSUPPORTED_CODES = {"NotImplemented", "InvalidArgument", "InvalidRequest", "AccessControlListNotSupported"}


class S3EngineCache:
    """Entries under ``s3://bucket/prefix/<key>/``; a present manifest means a complete entry."""

    def __init__(self, uri: str, client: Any = None, *, settle_s: float = 1.0) -> None:
        if not uri.startswith("s3://"):
            raise CacheError(f"option.engine_cache_uri={uri!r}: expected s3://bucket/prefix")
        self.uri = uri.rstrip("/")
        self.bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.prefix = prefix.strip("/")
        if client is None:
            from lmi_trt.sources.s3 import make_client

            client = make_client()
        self.client = client
        # Without conditional writes, two racing lease writers both read back after this delay
        # and only the last writer sees its own name.
        self.settle_s = settle_s

    def _key(self, key: str, name: str) -> str:
        return "/".join(p for p in (self.prefix, key, name) if p)

    def _fail(self, doing: str, error: Exception) -> CacheError:
        code, status = _error_code(error)
        return CacheError(
            f"engine cache {self.uri}: {doing} failed ({code or type(error).__name__} {status or ''}): "
            f"{error}. Check option.engine_cache_uri and the credentials' s3:GetObject/PutObject/"
            "DeleteObject/ListBucket permissions"
        )

    def _get_json(self, object_key: str) -> tuple[dict[str, Any], str] | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=object_key)
        except Exception as e:
            code, status = _error_code(e)
            if code in ("NoSuchKey", "404") or status == 404:
                return None
            raise self._fail(f"reading {object_key}", e) from e
        return json.loads(response["Body"].read()), response.get("ETag", "")

    def manifest(self, key: str) -> Manifest | None:
        found = self._get_json(self._key(key, MANIFEST_NAME))
        if found is None:
            return None
        try:
            return Manifest.model_validate(found[0])
        except ValidationError:
            log.warning("engine cache %s: unreadable manifest for key %s; treating it as missing", self.uri, key[:12])
            return None

    def manifests(self, limit: int = 50) -> Iterator[Manifest]:
        """Manifests of entries under the prefix (for explaining a miss)."""
        paginator = self.client.get_paginator("list_objects_v2")
        seen = 0
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("", "")):
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith("/" + MANIFEST_NAME) and seen < limit:
                        seen += 1
                        key = obj["Key"].rsplit("/", 2)[-2]
                        found = self.manifest(key)
                        if found is not None:
                            yield found
        except CacheError:
            raise
        except Exception as e:
            raise self._fail("listing entries", e) from e

    def upload(self, key: str, folder: Path, manifest: Manifest) -> None:
        """Every file first, the manifest last: readers treat a manifest as "complete"."""
        try:
            for rel in manifest.files:
                self.client.upload_file(str(folder / rel), self.bucket, self._key(key, rel))
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(key, MANIFEST_NAME), Body=manifest.model_dump_json(indent=2).encode()
            )
        except Exception as e:
            raise self._fail(f"uploading entry {key[:12]}", e) from e

    def download(self, key: str, manifest: Manifest, dest: Path) -> None:
        try:
            for rel in manifest.files:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, self._key(key, rel), str(target))
        except Exception as e:
            raise self._fail(f"downloading entry {key[:12]}", e) from e
        write_manifest(dest, manifest)

    # ---- lease ----

    def read_lease(self, key: str) -> Lease | None:
        found = self._get_json(self._key(key, LEASE_NAME))
        if found is None:
            return None
        body, etag = found
        return Lease(owner=str(body.get("owner")), expires_at=float(body.get("expires_at", 0)), etag=etag)

    def _put_lease(self, key: str, owner: str, ttl_s: float, condition: dict[str, str]) -> bool | None:
        """True written, False refused by a condition, None when the server lacks conditional writes."""
        body = json.dumps({"owner": owner, "expires_at": time.time() + ttl_s, "host": socket.gethostname()})
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key, LEASE_NAME), Body=body.encode(), **condition)
            return True
        except Exception as e:
            code, status = _error_code(e)
            if code in _CONFLICT_CODES or status in (409, 412):
                return False
            if code in _UNSUPPORTED_CODES or status == 501 or type(e).__name__ == "ParamValidationError":
                return None
            raise self._fail("writing the build lease", e) from e

    def _holds(self, key: str, owner: str) -> bool:
        time.sleep(self.settle_s)
        lease = self.read_lease(key)
        return lease is not None and lease.owner == owner

    def try_acquire(self, key: str, owner: str, ttl_s: float) -> bool:
        """Take the lease if nobody holds it or the holder's has expired."""
        current = self.read_lease(key)
        if current is not None and not current.expired():
            return False
        if current is None:
            condition = {"IfNoneMatch": "*"}
        else:
            log.warning(
                "engine cache %s: lease of %s on key %s expired %.0f s ago; taking over",
                self.uri,
                current.owner,
                key[:12],
                time.time() - current.expires_at,
            )
            condition = {"IfMatch": current.etag} if current.etag else {}
        written = self._put_lease(key, owner, ttl_s, condition)
        if written is None:  # create-then-verify
            written = self._put_lease(key, owner, ttl_s, {})
        return bool(written) and self._holds(key, owner)

    def renew(self, key: str, owner: str, ttl_s: float) -> bool:
        current = self.read_lease(key)
        if current is None or current.owner != owner:
            return False
        written = self._put_lease(key, owner, ttl_s, {"IfMatch": current.etag} if current.etag else {})
        if written is None:
            written = self._put_lease(key, owner, ttl_s, {})
        return bool(written)

    def release(self, key: str, owner: str) -> None:
        current = self.read_lease(key)
        if current is not None and current.owner == owner:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self._key(key, LEASE_NAME))
            except Exception as e:
                log.warning("engine cache %s: could not release the lease on %s: %s", self.uri, key[:12], e)


class _LeaseKeeper:
    """Renews a held lease every ttl/3 on a daemon thread until stopped."""

    def __init__(self, remote: S3EngineCache, key: str, owner: str, ttl_s: float) -> None:
        self.remote, self.key, self.owner, self.ttl_s = remote, key, owner, ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{key[:8]}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.remote.renew(self.key, self.owner, self.ttl_s):
                    log.warning(
                        "engine cache: lost the build lease on %s; another replica may build it too", self.key[:12]
                    )
            except CacheError as e:
                log.warning("engine cache: lease renewal failed: %s", e)

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.remote.release(self.key, self.owner)


# ---------------------------------------------------------------------------------------------
# the cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheResult:
    path: Path
    key: str
    source: Literal["local", "remote", "built"]


BuildFn = Callable[[Path], None]


class EngineCache:
    """``get_or_build`` returns a verified entry folder, building at most once per key.

    ``remote`` (an ``S3EngineCache``) is both looked up and uploaded to. ``lock_timeout_s`` bounds
    the wait for another process on this host; ``wait_timeout_s`` the wait for another replica.
    """

    def __init__(
        self,
        root: Path,
        remote: S3EngineCache | None = None,
        *,
        verify: VerifyMode = "sha256",
        lock_timeout_s: float = 4 * 3600,
        wait_timeout_s: float = 4 * 3600,
        lease_ttl_s: float = 600,
        poll_s: float = 5.0,
    ) -> None:
        self.root = Path(root)
        self.remote = remote
        self.verify = verify
        self.lock_timeout_s, self.wait_timeout_s = lock_timeout_s, wait_timeout_s
        self.lease_ttl_s, self.poll_s = lease_ttl_s, poll_s
        for sub in ("entries", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def entry_dir(self, key: str) -> Path:
        return self.root / "entries" / key

    def lookup(self, key: str) -> Path | None:
        """The verified local entry for ``key``, or None."""
        path = self.entry_dir(key)
        if not path.is_dir():
            return None
        problem = verify_entry(path, key, self.verify)
        if problem is not None:
            log.warning("engine cache: entry %s is damaged (%s); it will be replaced", path, problem)
            return None
        return path

    def local_manifests(self) -> Iterator[Manifest]:
        for folder in sorted((self.root / "entries").iterdir()):
            manifest = read_manifest(folder)
            if manifest is not None:
                yield manifest

    def get_or_build(self, inputs: CacheKeyInputs, build: BuildFn, *, model_id: str) -> CacheResult:
        key = cache_key(inputs)
        found = self.lookup(key)
        if found is not None:
            log.info("engine cache hit: %s", found)
            return CacheResult(found, key, "local")
        lock = FileLock(str(self.root / "locks" / f"{key}.lock"))
        try:
            lock.acquire(timeout=self.lock_timeout_s)
        except Timeout:
            raise CacheError(
                f"engine cache: waited {self.lock_timeout_s:.0f} s for another process on this host "
                f"building {key[:12]} ({self.root / 'locks'}); raise option.compile_timeout or check "
                "for a stuck compile"
            ) from None
        try:
            return self._locked(key, inputs, build, model_id)
        finally:
            lock.release()

    def _locked(self, key: str, inputs: CacheKeyInputs, build: BuildFn, model_id: str) -> CacheResult:
        found = self.lookup(key)
        if found is not None:  # another process on this host finished it while we waited
            return CacheResult(found, key, "local")
        self._clear(key)
        if self.remote is None:
            self._log_miss(key, inputs, model_id)
            return CacheResult(self._build(key, inputs, build, model_id), key, "built")
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + self.wait_timeout_s
        announced = False
        while True:
            downloaded = self._try_download(key)
            if downloaded is not None:
                return CacheResult(downloaded, key, "remote")
            if self.remote.try_acquire(key, owner, self.lease_ttl_s):
                break
            if not announced:
                lease = self.remote.read_lease(key)
                log.info(
                    "engine cache: %s is building %s; waiting for it (up to %.0f s)",
                    lease.owner if lease else "another replica",
                    key[:12],
                    self.wait_timeout_s,
                )
                announced = True
            if time.monotonic() > deadline:
                raise CacheError(
                    f"engine cache {self.remote.uri}: waited {self.wait_timeout_s:.0f} s for another "
                    f"replica to build {key[:12]}; it holds {self.remote._key(key, LEASE_NAME)}"
                )
            time.sleep(self.poll_s)
        with _LeaseKeeper(self.remote, key, owner, self.lease_ttl_s):
            downloaded = self._try_download(key)  # published between our last look and the lease
            if downloaded is not None:
                return CacheResult(downloaded, key, "remote")
            self._log_miss(key, inputs, model_id)
            path = self._build(key, inputs, build, model_id)
            manifest = read_manifest(path)
            assert manifest is not None
            log.info("engine cache: uploading %s to %s", key[:12], self.remote.uri)
            self.remote.upload(key, path, manifest)
        return CacheResult(path, key, "built")

    def _clear(self, key: str) -> None:
        """Drop a damaged entry and leftovers of builds of this key that died (we hold its lock)."""
        shutil.rmtree(self.entry_dir(key), ignore_errors=True)
        for leftover in (self.root / "tmp").glob(f"{key}.*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _tmp(self, key: str) -> Path:
        tmp = self.root / "tmp" / f"{key}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        return tmp

    def _publish(self, tmp: Path, key: str) -> Path:
        problem = verify_entry(tmp, key, self.verify)
        if problem is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CacheError(f"engine cache: new entry {key[:12]} failed verification: {problem}")
        target = self.entry_dir(key)
        os.rename(tmp, target)  # atomic: the entry appears complete or not at all
        return target

    def _build(self, key: str, inputs: CacheKeyInputs, build: BuildFn, model_id: str) -> Path:
        tmp = self._tmp(key)
        try:
            build(tmp)
            write_manifest(tmp, make_manifest(tmp, inputs, model_id))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self._publish(tmp, key)

    def _try_download(self, key: str) -> Path | None:
        assert self.remote is not None
        manifest = self.remote.manifest(key)
        if manifest is None:
            return None
        tmp = self._tmp(key)
        log.info("engine cache: downloading %s from %s", key[:12], self.remote.uri)
        try:
            self.remote.download(key, manifest, tmp)
            problem = verify_entry(tmp, key, "sha256")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if problem is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning(
                "engine cache %s: entry %s is damaged (%s); building it again", self.remote.uri, key[:12], problem
            )
            return None
        return self._publish(tmp, key)

    def _log_miss(self, key: str, inputs: CacheKeyInputs, model_id: str) -> None:
        manifests: list[Manifest] = list(self.local_manifests())
        if self.remote is not None:
            manifests += list(self.remote.manifests())
        change = _closest_change(inputs, model_id, manifests)
        if change:
            log.info(
                "engine cache miss for %s (key %s): an entry of this model differs in %s",
                model_id,
                key[:12],
                "; ".join(change),
            )
        else:
            log.info("engine cache miss for %s (key %s): no entry of this model yet", model_id, key[:12])


# ------------------------------------------------------------------------------------------------
# The cache a configuration names, and AOT outputs (``lmi-trt compile --output``), for both compile stages
# (TensorRT engines, lmi_trt.compile.jit; calibrated checkpoints, lmi_trt.compile.hf_quant).

ENGINE_CACHE_DIRNAME = "trtllm-engines"


def open_cache(uri: str | None, download_dir: Path, timeout_s: float, client: Any = None) -> EngineCache:
    """The cache ``option.engine_cache_uri`` names: an s3:// prefix (with a local copy under ``download_dir``) or a
    local folder; unset, a folder under ``download_dir``. ``timeout_s``: one compile (option.compile_timeout)."""
    local = download_dir / ENGINE_CACHE_DIRNAME
    remote = None
    if uri and str(uri).startswith("s3://"):
        remote = S3EngineCache(str(uri), client)
    elif uri:
        local = Path(uri)
    # Waiting for another builder may take a whole compile, plus its download.
    return EngineCache(local, remote, lock_timeout_s=2 * timeout_s, wait_timeout_s=2 * timeout_s)


def check_output(output: str) -> None:
    """An AOT output folder must be new or empty (checked before any download)."""
    if output.startswith("s3://"):
        return
    target = Path(output)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CacheError(f"--output {output}: exists and is not an empty folder; choose a new one")


def publish_to(
    output: str, build: Callable[[Path], None], inputs: CacheKeyInputs, model_id: str, client: Any = None
) -> None:
    """Write what ``build`` makes, with its manifest, to ``output`` (a new folder, or an ``s3://`` prefix): built
    beside the target and renamed into place, or uploaded (manifest last), so a half-written output never exists."""
    check_output(output)
    remote = S3EngineCache(output, client) if output.startswith("s3://") else None
    target = None if remote else Path(output)
    parent = target.parent if target is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{target.name if target else 'lmi-trt-compile'}.partial-{uuid.uuid4().hex[:8]}"
    try:
        build(tmp)
        manifest = make_manifest(tmp, inputs, model_id)
        write_manifest(tmp, manifest)
        if remote is not None:
            try:
                remote.upload("", tmp, manifest)
            except CacheError as e:
                raise BuildError("upload", str(e)) from e
        else:
            if target.exists():
                target.rmdir()  # empty, checked above
            tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
