"""``s3://bucket/prefix`` → a complete local copy under ``download_dir/s3/<sha256(uri)[:16]>``.

Completeness is what matters on a serving host that restarts: objects are downloaded into a
``.<name>.partial-*`` folder beside the destination, sizes are checked, a manifest of the listing
(key, ETag, size) is written, and only then is the folder renamed into place. A later resolve reuses
the folder only when the current listing equals that manifest; unchanged files are hard-linked from
the previous copy, so changing ``config.json`` does not re-download the weights.

boto3 reads the credentials chain, ``AWS_REGION``/``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL[_S3]``
itself; nothing here reads the environment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import boto3
import botocore.exceptions
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from filelock import FileLock, Timeout
from s3transfer.exceptions import RetriesExceededError, S3DownloadFailedError
from s3transfer.subscribers import BaseSubscriber

from .artifact import SourceError, safe_relpath

log = logging.getLogger(__name__)

MANIFEST = ".lmi-trt-s3-manifest.json"
DEFAULT_MAX_CONCURRENCY = 16
_RETRIES = {"mode": "standard", "max_attempts": 8}


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    prefix: str  # "" or ending in "/", so s3://b/llama never matches s3://b/llama2/…

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class S3Object:
    key: str
    etag: str
    size: int


def parse_s3_uri(uri: str) -> S3Uri:
    if not uri.startswith("s3://"):
        raise SourceError(f"{uri!r} is not an s3:// URI; expected s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise SourceError(f"{uri!r} names no bucket; expected s3://bucket/prefix")
    prefix = prefix.strip("/")
    return S3Uri(bucket, prefix + "/" if prefix else "")


def cache_dir_for(download_dir: Path, uri: S3Uri) -> Path:
    """Hashed, so no bucket or key spelling can reach outside ``download_dir``."""
    return Path(download_dir) / "s3" / hashlib.sha256(str(uri).encode()).hexdigest()[:16]


def listing_fingerprint(objects: Iterable[S3Object]) -> str:
    digest = hashlib.sha256()
    for o in sorted(objects, key=lambda o: o.key):
        digest.update(f"{o.key}\0{o.etag}\0{o.size}\n".encode())
    return "s3-" + digest.hexdigest()[:32]


def local_paths(uri: S3Uri, objects: Iterable[S3Object]) -> dict[PurePosixPath, S3Object]:
    """Where each object lands, relative to the destination; refuses keys that would escape or collide."""
    out: dict[PurePosixPath, S3Object] = {}
    for o in objects:
        rel = safe_relpath(o.key[len(uri.prefix) :])
        if rel.as_posix() == MANIFEST:
            raise SourceError(f"s3://{uri.bucket}/{o.key}: the name {MANIFEST} is reserved for the download manifest")
        if rel in out:
            raise SourceError(
                f"s3://{uri.bucket}/{o.key} and s3://{uri.bucket}/{out[rel].key} would both be written to "
                f"{rel}; remove one of them"
            )
        out[rel] = o
    return out


def make_client(max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> Any:
    # A fresh session, so credentials and endpoint come from the environment as it is now.
    return boto3.session.Session().client(
        "s3", config=Config(retries=_RETRIES, max_pool_connections=max(10, max_concurrency))
    )


def _explain(uri: S3Uri, error: Exception, doing: str, key: str | None = None) -> SourceError:
    """Turn a boto error into a message that names the URI (or object) and what would fix it."""
    target = f"s3://{uri.bucket}/{key}" if key is not None else str(uri)
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        return SourceError(
            f"no AWS credentials found while {doing} {target}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
            "AWS_PROFILE, or run with an IAM role that can read the bucket"
        )
    if isinstance(error, botocore.exceptions.EndpointConnectionError):
        return SourceError(
            f"cannot reach the S3 endpoint while {doing} {target} ({error}); check the network, AWS_REGION and "
            "AWS_ENDPOINT_URL"
        )
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return SourceError(f"bucket {uri.bucket!r} does not exist ({uri}); check the bucket name in the URI")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):  # also 403s
            return SourceError(f"AWS credentials rejected while {doing} {target} ({code}); refresh or fix them")
        if code in ("AccessDenied", "403", "Forbidden") or status == 403:
            return SourceError(
                f"access denied while {doing} {target}; the credentials in use need s3:ListBucket on bucket "
                f"{uri.bucket!r} and s3:GetObject on {uri}*"
            )
        if code in ("NoSuchKey", "404", "PreconditionFailed", "412"):
            return SourceError(
                f"{target} changed or disappeared since it was listed ({code}) while {doing} {uri}; retry once "
                "the upload is finished"
            )
        return SourceError(f"S3 error while {doing} {target}: {code or status}: {error}")
    return SourceError(f"S3 error while {doing} {target}: {type(error).__name__}: {error}")


def list_objects(client: Any, uri: S3Uri) -> list[S3Object]:
    objects: list[S3Object] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=uri.prefix):
            for item in page.get("Contents", []):
                if item["Key"].endswith("/"):
                    continue  # "folder" placeholder objects made by consoles
                objects.append(S3Object(item["Key"], item["ETag"].strip('"'), int(item["Size"])))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise _explain(uri, e, "listing") from e
    if not objects:
        raise SourceError(
            f"no objects under {uri}; check the prefix in option.model_id (it names a folder, and is case-sensitive)"
        )
    return objects


def _read_manifest(folder: Path) -> dict[str, S3Object] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
        return {rel: S3Object(**o) for rel, o in data["objects"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_complete(folder: Path, wanted: dict[PurePosixPath, S3Object]) -> bool:
    """The folder was finished from exactly this listing, and every file is still there at full size."""
    manifest = _read_manifest(folder)
    if manifest is None or manifest != {rel.as_posix(): o for rel, o in wanted.items()}:
        return False
    return all(_size_or_none(folder / rel) == o.size for rel, o in wanted.items())


def _size_or_none(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


class _ListedObject(BaseSubscriber):
    """Hands the listing's size and ETag to s3transfer: no HeadObject, and ranged GETs carry If-Match
    (``_require_listed_etags`` adds it to the single GETs of objects under the multipart threshold)."""

    def __init__(self, obj: S3Object, progress: _Progress) -> None:
        self._obj = obj
        self._progress = progress

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self._obj.size)
        future.meta.provide_object_etag(f'"{self._obj.etag}"')

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        self._progress.add(bytes_transferred)


class _Progress:
    """Logs every ~10% of the bytes (or every 30 s), from the transfer threads."""

    def __init__(self, uri: S3Uri, total: int) -> None:
        self._uri, self._total = uri, max(total, 1)
        self._done = 0
        self._lock = threading.Lock()
        self._start = self._last_log = time.monotonic()
        self._next_fraction = 0.1

    def add(self, n: int) -> None:
        with self._lock:
            self._done += n
            now = time.monotonic()
            if self._done / self._total >= self._next_fraction or now - self._last_log >= 30:
                self._next_fraction = self._done / self._total + 0.1
                self._last_log = now
                log.info(
                    "%s: %.0f%% of %.1f MiB (%.1f MiB/s)",
                    self._uri,
                    100 * self._done / self._total,
                    self._total / 2**20,
                    self._done / 2**20 / max(now - self._start, 1e-3),
                )


@contextmanager
def _require_listed_etags(client: Any, bucket: str, objects: Iterable[S3Object]) -> Iterator[None]:
    """Every GetObject of a listed object carries ``If-Match: <listed ETag>``, so an object replaced
    after the listing fails with 412 instead of mixing a new file into the old listing's copy.
    (s3transfer sends If-Match only on ranged GETs, and takes no IfMatch extra argument.)"""
    etags = {o.key: f'"{o.etag}"' for o in objects}

    def add_if_match(params: dict[str, Any], **_: Any) -> None:
        if params.get("Bucket") == bucket and params.get("Key") in etags:
            params.setdefault("IfMatch", etags[params["Key"]])

    handler_id = f"lmi-trt-if-match-{id(etags)}"
    client.meta.events.register("before-parameter-build.s3.GetObject", add_if_match, unique_id=handler_id)
    try:
        yield
    finally:
        client.meta.events.unregister("before-parameter-build.s3.GetObject", unique_id=handler_id)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fill(
    client: Any, uri: S3Uri, wanted: dict[PurePosixPath, S3Object], tmp: Path, previous: Path, max_concurrency: int
) -> None:
    """Put every wanted object into ``tmp``: from the previous complete copy when unchanged, else from S3."""
    old = _read_manifest(previous) or {}
    to_download = []
    for rel, obj in wanted.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        if old.get(rel.as_posix()) == obj and _size_or_none(previous / rel) == obj.size:
            _link_or_copy(previous / rel, tmp / rel)
        else:
            to_download.append((rel, obj))
    total = sum(o.size for _, o in to_download)
    log.info("downloading %d of %d objects (%.1f MiB) from %s", len(to_download), len(wanted), total / 2**20, uri)
    progress = _Progress(uri, total)
    # "classic": on p4d/p5 hosts with awscrt installed boto3 would otherwise switch to the CRT client,
    # which ignores the size/ETag hand-off below.
    config = TransferConfig(max_concurrency=max_concurrency, preferred_transfer_client="classic")
    # Leaving the manager with an exception cancels the transfers still queued.
    with (
        _require_listed_etags(client, uri.bucket, (o for _, o in to_download)),
        create_transfer_manager(client, config) as manager,
    ):
        futures = [
            (obj, manager.download(uri.bucket, obj.key, str(tmp / rel), subscribers=[_ListedObject(obj, progress)]))
            for rel, obj in to_download
        ]
        for obj, future in futures:
            try:
                future.result()
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, RetriesExceededError) as e:
                raise _explain(uri, e, "downloading", obj.key) from e
            except S3DownloadFailedError as e:  # s3transfer's ETag check: replaced mid-download
                raise SourceError(f"s3://{uri.bucket}/{obj.key}: {e}; retry once the upload is finished") from e
    short = [(rel, o.size, _size_or_none(tmp / rel)) for rel, o in wanted.items() if _size_or_none(tmp / rel) != o.size]
    if short:
        rel, want, got = short[0]
        raise SourceError(f"{uri}{rel} downloaded as {got} bytes but the listing says {want}; retry the download")


def _remove_leftovers(dest: Path) -> None:
    """Folders of interrupted downloads and swaps of ``dest``; only called while holding its lock."""
    for stale in dest.parent.glob(f".{dest.name}.*"):
        log.info("removing %s left by an interrupted download", stale)
        shutil.rmtree(stale, ignore_errors=True)


def sync_objects(
    client: Any, uri: S3Uri, objects: list[S3Object], dest: Path, *, max_concurrency: int = DEFAULT_MAX_CONCURRENCY
) -> Path:
    """Make ``dest`` a complete copy of ``objects`` (a listing of ``uri``); reuse it when already so."""
    wanted = local_paths(uri, objects)
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(dest.parent / f"{dest.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process that is downloading %s into %s", uri, dest)
        lock.acquire()
    try:
        if is_complete(dest, wanted):
            log.info("reusing %s for %s (listing unchanged)", dest, uri)
            return dest
        _remove_leftovers(dest)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
        try:
            _fill(client, uri, wanted, tmp, dest, max_concurrency)
            (tmp / MANIFEST).write_text(
                json.dumps(
                    {"uri": str(uri), "objects": {rel.as_posix(): asdict(o) for rel, o in wanted.items()}}, indent=1
                )
            )
            if dest.exists():
                # A rename cannot replace a non-empty folder: move the old copy aside first.
                old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
                os.replace(dest, old / "copy")
                os.replace(tmp, dest)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # a no-op once renamed
        return dest
    finally:
        lock.release()


def download_s3(
    uri: str, download_dir: Path, *, max_concurrency: int = DEFAULT_MAX_CONCURRENCY, client: Any = None
) -> tuple[Path, str]:
    """Download the folder ``uri`` (or reuse a complete earlier copy); return (local folder, fingerprint)."""
    parsed = parse_s3_uri(uri)
    client = client if client is not None else make_client(max_concurrency)
    objects = list_objects(client, parsed)
    dest = sync_objects(client, parsed, objects, cache_dir_for(download_dir, parsed), max_concurrency=max_concurrency)
    return dest, listing_fingerprint(objects)


def s3_config(uri: str, key: str) -> dict:
    """The ``config.json`` object under an ``s3://`` prefix, without the weights beside it (``lmi-trt plan``)."""
    parsed = parse_s3_uri(uri)
    try:
        body = make_client().get_object(Bucket=parsed.bucket, Key=f"{parsed.prefix}config.json")["Body"].read()
    except Exception as e:
        raise SourceError(f"{key}={uri!r}: cannot read {parsed}config.json ({e})") from e
    return json.loads(body)
